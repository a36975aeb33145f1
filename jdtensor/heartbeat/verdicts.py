"""The heartbeat's decisions: what one merged beat means, as data.

No threads, no sockets and no JAX: a `Decider` takes the merged beat (every
client's row, `BeatLayout`) and returns an `Outcome`: the cluster's token,
whether the run ends by agreement, the stragglers just named, and at most
one `Verdict`. Where the rows meet, the decision is made once: on client 0
over the liveness links (`jdtensor.heartbeat.exchange.LinkExchange`), which
sends every client only the outcome, a few bytes; with an exchange that
hands every client the whole sum (the in-process fakes of the tests), every
client decides from the same beats and reaches the same outcome.

`judge` is the pure rule; `Decider` adds what a run remembers: the token,
the waiting ledger (`jdtensor.heartbeat.stragglers.WaitLedger`) and the
"every client waits" warning said once. Every client turns a verdict into
its own words (`jdtensor.heartbeat.protocol`): "this client" where it is
the one named.

**The verdicts.** Every client reaches the same one at the same beat:

* **dead** (the process is gone): the liveness links, within milliseconds;
* **stuck** (alive, but its heartbeat cannot run: SIGSTOP, swap, a GIL held
  by C code): a beat not done within the stuck time-out; a roll call names
  who did not join it. A client that finds it was itself frozen that long
  names itself;
* **stalled** (alive and beating, but its main thread never joins the
  collective the others wait in): one client running its own code for the
  stall time-out while every other client has waited, idle, in a collective
  spanning every client for as long;
* **left early** (its script ended while the others still wait for it in a
  collective): a client at exit while another has waited, idle, for
  `exit_grace` seconds;
* **left with a failure** (an exception, a non-zero exit): announced by the
  client itself as it leaves;
* **out of sync** (a restarted client): a slot without the cluster's token.

A client that is finished (at exit) only logs what happens to the others; one
that is leaving with a failure no longer reacts at all.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from jdtensor._ids import to_ranges
from jdtensor.heartbeat.flight import AT_EXIT, RUNNING, WAITING
from jdtensor.heartbeat.stragglers import WaitLedger
from jdtensor.heartbeat.wire import (ALL_WAITING, DEADLOCK, EARLY_EXIT, FIRST_TOKENS, OUT_OF_SYNC,
                                     STALLED, BeatLayout, Outcome, Row, Verdict,
                                     SECONDS_SLOT_SCALE, VerdictKind, from_ranges)

__all__ = ["BeatLayout", "Row", "Verdict", "VerdictKind", "Outcome", "Decider", "judge",
           "StallTimeout", "verdict_due", "STALL_SAFETY_FACTOR", "STALL_RHYTHM_STEPS", "IDLE_PERCENT", "MOVING_BYTES_PER_SECOND", "EARLY_EXIT", "STALLED", "ALL_WAITING", "DEADLOCK", "OUT_OF_SYNC",
           "FIRST_TOKENS", "to_ranges", "from_ranges", "exit_grace_for"]

# A client that waits in a collective counts as blocked only while its process
# uses less than this share of one core (a process that computes the rest of
# a program after the collective is busy, not blocked).
IDLE_PERCENT = 25
# A client running its own code that reads or writes at least this many
# bytes a second (files, pipes, TCP: `jdtensor.heartbeat.progress`, less
# jdtensor's own traffic) is making progress, not idle: an upload, a slow
# read or a checkpoint written in small pieces moves bytes; a sleep, a lock
# or a read that never returns moves none.
MOVING_BYTES_PER_SECOND = 4096
# The learnt stall time-out is the longest idle pause seen, times this: a
# step's idle part varies, and a pause five times the longest the run has
# shown is not its rhythm.
STALL_SAFETY_FACTOR = 5.0
# Steps seen (a client that waited at one beat no longer waits at the next:
# a meeting ended) before the run has shown its rhythm. A pause that began
# before that is judged by the ceiling: a set-up after a barrier, or a slow
# first step, is not a rhythm (and the first steps, compilation and warming
# caches, teach nothing). A step takes a beat at least.
STALL_RHYTHM_STEPS = 10
def exit_grace_for(period: float) -> float:
  """Seconds a client at exit and a blocked waiter make a "left early"."""
  return max(3.0, 2.0 * period)


def stall_pattern(phases: np.ndarray, busy: np.ndarray, joined: np.ndarray,
                  moved: np.ndarray | None = None) -> int | None:
  """The one client running its own code, idle (under `IDLE_PERCENT` of a
  core and `MOVING_BYTES_PER_SECOND`) and past its set-up, while every other
  client waits, idle, in a collective; None if the beat does not look like
  that (whatever the seconds)."""
  running = np.flatnonzero(phases == RUNNING)
  if running.size != 1:
    return None
  runner = int(running[0])
  blocked = (phases == WAITING) & (busy < IDLE_PERCENT)
  if busy[runner] >= IDLE_PERCENT or not joined[runner]:
    return None
  if moved is not None and moved[runner] >= MOVING_BYTES_PER_SECOND:
    return None  # Reading or writing: making progress, however slowly.
  if int(np.count_nonzero(blocked)) != len(phases) - 1:
    return None
  return runner


def judge(phases: np.ndarray, seconds: np.ndarray, busy: np.ndarray,
          joined: np.ndarray, exit_grace: float, stall_timeout: float,
          all_waiting_timeout: float | None = None,
          moved: np.ndarray | None = None, deadlock_timeout: float = 0.0) -> Verdict | None:
  """The verdict of one merged beat's states, if any (the token check and
  the agreed end come first: `Decider.decide`).

  * early exit: a client at exit for `exit_grace` s while another has waited,
    idle, in a collective as long;
  * stalled: one client running its own code, idle (no CPU to speak of, no
    bytes moved) and past its set-up, for the stall time-out, while every
    other client has waited, idle, as long;
  * every client waiting for `all_waiting_timeout` (default: the stall
    time-out; never the learnt one): a long computation or a deadlock, said;
  * deadlock: every client waiting, its process idle and moving no bytes,
    for `deadlock_timeout` (0: never). A long computation keeps its process busy (XLA's threads
    compute on CPU: the waiter is not blocked); only a device that computes
    while the host sleeps (a GPU, a TPU) looks the same.
  """
  if all_waiting_timeout is None:
    all_waiting_timeout = stall_timeout
  n = len(phases)
  waiting_now = phases == WAITING
  blocked = waiting_now & (busy < IDLE_PERCENT)
  gone = np.flatnonzero((phases == AT_EXIT) & (seconds >= exit_grace))
  if gone.size and np.any(blocked & (seconds >= exit_grace)):
    # One idle waiter proves the early exit; the message names every client
    # waiting in a collective, busy or not (a busy waiter, e.g. client 0
    # serving the coordination service, waits for it just the same).
    return Verdict(EARLY_EXIT, tuple(gone.tolist()),
                   waiting=tuple(np.flatnonzero(waiting_now).tolist()))
  # A staller runs its own code, idle, for the whole time-out, after its
  # set-up (a slow first step is not a stall); a client that computes or
  # moves bytes is slow, not stalled.
  staller = stall_pattern(phases, busy, joined, moved) if stall_timeout > 0 else None
  if staller is not None and stall_length(staller, seconds) >= stall_timeout:
    return Verdict(STALLED, (staller,), seconds=int(seconds[staller]),
                   timeout=stall_timeout, busy=int(busy[staller]),
                   moved=0 if moved is None else int(moved[staller]))
  # A waiter whose process moves bytes (an async checkpoint's upload from a
  # background thread while the main thread waits in orbax) is not deadlocked.
  idle = blocked if moved is None else blocked & (moved < MOVING_BYTES_PER_SECOND)
  if deadlock_timeout > 0 and bool(np.all(idle & (seconds >= deadlock_timeout))):
    return Verdict(DEADLOCK, tuple(range(n)), seconds=int(seconds.min()),
                   timeout=deadlock_timeout)
  if stall_timeout > 0 and bool(np.all(blocked & (seconds >= all_waiting_timeout))):
    return Verdict(ALL_WAITING, tuple(range(n)))
  return None


def stall_length(runner: int, seconds: np.ndarray) -> float:
  """How long the stall pattern has held: the runner's seconds in its own
  code and every waiter's in its wait, whichever is shortest."""
  return float(min(seconds[runner], np.delete(seconds, runner).min()))


def verdict_due(phases: np.ndarray, seconds: np.ndarray, busy: np.ndarray,
                joined: np.ndarray, exit_grace: float, stall_timeout: float,
                moved: np.ndarray | None = None) -> float | None:
  """Seconds from this beat until `judge` names a staller or an early exit,
  if every client stays as it is; None where no such verdict is in view.

  Verdicts come at beats, and a time-out ends between two: where one ends
  before the next beat, the beat can be called then
  (`jdtensor.heartbeat.exchange.LinkExchange.sleep_until_beat`) rather than
  a period later. The rule stays the beat's: the
  called beat's fresh rows decide, so a client that moved on meanwhile is
  judged as it is then. Rounded up to the rows' tenths of a second, so that
  the called beat is never early for the rule."""
  dues = []
  if stall_timeout > 0:
    staller = stall_pattern(phases, busy, joined, moved)
    if staller is not None:
      dues.append(_tenths_up(stall_timeout) - stall_length(staller, seconds))
  at_exit = phases == AT_EXIT
  blocked = (phases == WAITING) & (busy < IDLE_PERCENT)
  if at_exit.any() and blocked.any():
    grace = _tenths_up(exit_grace)
    dues.append(max(grace - float(seconds[at_exit].max()),
                    grace - float(seconds[blocked].max())))
  ahead = [d for d in dues if d > 0]
  return round(min(ahead), 3) if ahead else None


def _tenths_up(seconds: float) -> float:
  """`seconds` rounded up to a row's resolution (`SECONDS_SLOT_SCALE`)."""
  return math.ceil(round(seconds * SECONDS_SLOT_SCALE, 6)) / SECONDS_SLOT_SCALE


class StallTimeout:
  """The stall time-out a run has earned: learnt from its own rhythm.

  The quantity is the one the stall verdict measures: how long one client
  ran its own code, idle, while every other client waited in a collective
  (`stall_pattern`, `stall_length`). Each such pause counts once it is over
  (the runner joined the others), so a stall in progress never teaches
  itself.

  The run has shown its rhythm once every client is past its set-up (it
  met the others: the beat's joined bits) and `STALL_RHYTHM_STEPS` steps
  were seen since: periods at whose end every client's main thread had run since the
  last step (the rows' active bits; a client blocked in a load or a
  collective for a whole period has not). A pause that began before that is
  judged by the ceiling, however long the run waits in it: a set-up after a
  barrier, or a slow first step, is not a rhythm. A pause that began after
  it is judged by the learnt time-out: the longest pause seen since, times
  `STALL_SAFETY_FACTOR`, never below `floor` and never above `ceiling` (the
  set ``JDTENSOR_STALL_TIMEOUT``). Without learning it is the ceiling.

  Deterministic in the beats alone: every client that decides the same
  beats gets the same time-out.

  Args:
    ceiling: ``JDTENSOR_STALL_TIMEOUT`` (0: no stall verdicts at all).
    floor: ``JDTENSOR_STALL_FLOOR``.
    learn: ``JDTENSOR_STALL_LEARN``.
  """

  def __init__(self, ceiling: float, floor: float = 0.0, learn: bool = False):
    self.ceiling, self.floor = float(ceiling), min(float(floor), float(ceiling))
    self.learn = learn and ceiling > 0 and self.floor < self.ceiling
    self.watching = False  # Every client has been past its set-up.
    self.steps = 0  # Steps seen since then (see the class docstring).
    self._ran: np.ndarray | None = None  # Clients whose main thread ran since the last.
    self.longest: float | None = None  # The longest pause over, after the rhythm.
    self._pause: tuple[int, float] | None = None  # (runner, length) in progress.
    self._pause_learnt = False  # The pause in progress began after the rhythm.

  @property
  def warmed_up(self) -> bool:
    """Whether the run has shown its rhythm."""
    return self.steps >= STALL_RHYTHM_STEPS

  @property
  def learnt(self) -> bool:
    """Whether a pause beginning now is judged by the learnt time-out."""
    return self.learn and self.warmed_up

  @property
  def value(self) -> float:
    """The stall time-out for a pause beginning now, seconds."""
    if not self.learnt:
      return self.ceiling
    longest = self.longest or 0.0
    return min(self.ceiling, max(self.floor, STALL_SAFETY_FACTOR * longest))

  @property
  def pause_learnt(self) -> bool:
    """Whether the pause in progress (if any) is judged by the learnt
    time-out (it began after the run showed its rhythm)."""
    return self.learn and (self._pause_learnt if self._pause is not None
                           else self.warmed_up)

  @property
  def current(self) -> float:
    """The stall time-out for the pause in progress (a pause that began
    before the rhythm: the ceiling); with none, `value`."""
    if self._pause is not None and not self._pause_learnt:
      return self.ceiling
    return self.value

  def observe(self, phases: np.ndarray, seconds: np.ndarray, busy: np.ndarray,
              joined: np.ndarray, active: np.ndarray | None = None,
              moved: np.ndarray | None = None) -> None:
    """Takes one merged beat's states (`active`: the rows' active bits;
    None: every client ran)."""
    if not self.learn or (not self.watching and not bool(joined.all())):
      return
    self.watching = True
    ran = np.ones(len(phases), bool) if active is None else np.asarray(active, bool)
    self._ran = ran if self._ran is None else (self._ran | ran)
    if bool(self._ran.all()):
      self.steps += 1
      self._ran = None
    runner = stall_pattern(phases, busy, joined, moved)
    pause = None if runner is None else (runner, stall_length(runner, seconds))
    same = (pause is not None and self._pause is not None
            and pause[0] == self._pause[0] and pause[1] >= self._pause[1])
    if self._pause is not None and not same and self._pause_learnt:
      self.longest = max(self.longest or 0.0, self._pause[1])  # That pause is over.
    if pause is not None and not same:
      self._pause_learnt = self.warmed_up  # A new pause: judged by what it found.
    self._pause = pause

  def status(self) -> dict[str, Any]:
    """For `jdtensor status`: the time-out now and how it was reached."""
    return {"stall_timeout": self.current, "stall_learnt": self.pause_learnt,
            "stall_longest": self.longest, "stall_floor": self.floor,
            "stall_ceiling": self.ceiling, "stall_steps": self.steps,
            "stall_rhythm": self.warmed_up, "stall_rhythm_steps": STALL_RHYTHM_STEPS,
            "stall_learn": self.learn}


class Decider:
  """Turns merged beats into outcomes, remembering what a run needs to.

  Args:
    num_clients: Number of clients.
    exit_grace: Seconds a client at exit and a blocked waiter make an early
      exit.
    stall_timeout: The stall time-out (0: off), or one to learn
      (`StallTimeout`).
    ledger: The waiting ledger (stragglers).
    clock: Monotonic seconds (the waiting shares' run time).
    deadlock_timeout: Every client idle in a collective this long is a
      deadlock (0: never; `judge`).
  """

  def __init__(self, num_clients: int, exit_grace: float,
               stall_timeout: float | StallTimeout,
               ledger: WaitLedger, clock: Callable[[], float],
               deadlock_timeout: float = 0.0):
    self.num_clients = num_clients
    self.deadlock_timeout = deadlock_timeout
    self.layout = BeatLayout(num_clients)
    self.exit_grace = exit_grace
    self.stall = (stall_timeout if isinstance(stall_timeout, StallTimeout)
                  else StallTimeout(stall_timeout))
    self.waits = ledger
    self._clock = clock
    self.token = 0
    self.beats = 0  # Beats decided here after the first.
    self.waits_since: float | None = None  # When the ledger started counting.
    self._all_waiting_said = False
    # The last merged beat's (phases, seconds, busy, joined); None until one
    # was decided here.
    self.view: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    self.moved: np.ndarray | None = None  # The last merged beat's bytes a second.
    # Seconds from the last beat decided until a verdict's time-out ends, if
    # every client stays as it is (`verdict_due`); None: none in view.
    self.due: float | None = None

  def first(self, merged: np.ndarray) -> Outcome:
    """The first exchange: every slot must hold client 0's token."""
    slots = self.layout.tokens(merged)
    self.token = int(slots[0])
    self._remember(merged)
    if np.any(slots != self.token):
      return Outcome(0, self.token, verdict=Verdict(
          FIRST_TOKENS, tuple(np.flatnonzero(slots != self.token).tolist()),
          tokens=tuple(slots.tolist()), cluster_token=self.token))
    return Outcome(0, self.token)

  def decide(self, merged: np.ndarray, ages: np.ndarray | None = None) -> Outcome:
    """One beat after the first.

    Args:
      merged: The beat's merged vector (`BeatLayout`).
      ages: Per client, seconds since its row was sampled at least (client 0
        on the links: since it came in), for `due` only: the verdicts take
        the rows as they are. None: none.
    """
    self.beats += 1
    self.due = None
    beat = self.beats
    slots = self.layout.tokens(merged)
    phases, seconds, busy, joined = self._remember(merged)
    if np.any(slots != self.token):
      return Outcome(beat, self.token, verdict=self._out_of_sync(slots))
    stragglers = self._count_waits(phases, joined)
    if merged[self.layout.stop] > 0 or bool(np.all(phases == AT_EXIT)):
      return Outcome(beat, self.token, end=True, stragglers=stragglers)
    moved = self.layout.moved(merged)
    self.stall.observe(phases, seconds, busy, joined, self.layout.active(merged), moved)
    verdict = judge(phases, seconds, busy, joined, self.exit_grace, self.stall.current,
                    self.stall.ceiling, moved, self.deadlock_timeout)
    if verdict is not None and verdict.kind == STALLED and self.stall.learn:
      verdict = (dataclasses.replace(verdict, learnt=self.stall.longest or 0.0)
                 if self.stall.pause_learnt else dataclasses.replace(verdict, early=True))
    if verdict is not None and verdict.kind == ALL_WAITING:
      if self._all_waiting_said:
        verdict = None
      self._all_waiting_said = True
    if verdict is None:
      self.due = verdict_due(phases, seconds if ages is None else seconds + ages, busy,
                             joined, self.exit_grace, self.stall.current, moved)
    return Outcome(beat, self.token, verdict=verdict, stragglers=stragglers)

  def _remember(self, merged: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    phases, seconds, busy = self.layout.states(merged)
    self.view = (phases, seconds, busy, self.layout.joined(merged))
    self.moved = self.layout.moved(merged)
    return self.view

  def _out_of_sync(self, slots: np.ndarray) -> Verdict:
    """The clients not holding the cluster's token: the one most slots hold
    (client 0's on a tie), so that a restarted client blames itself rather
    than everyone else."""
    values, counts = np.unique(slots, return_counts=True)
    best = values[counts == counts.max()]
    cluster_token = int(slots[0]) if len(best) > 1 else int(best[0])
    wrong = np.flatnonzero(slots != cluster_token)
    return Verdict(OUT_OF_SYNC, tuple(wrong.tolist()),
                   tokens=tuple(slots[wrong].tolist()), cluster_token=cluster_token)

  def _count_waits(self, phases: np.ndarray, joined: np.ndarray
                   ) -> tuple[tuple[int, float], ...]:
    """Adds this beat to the waiting ledger; returns the new stragglers. It
    starts at the first beat with a client waiting in a collective it has
    joined (before that, the clients are still setting up)."""
    if self.waits_since is None:
      if not bool(np.any(joined & (phases == WAITING))):
        return ()
      self.waits_since = self._clock()
    new = self.waits.add(phases)
    if not new:
      return ()
    shares = self.waits.waited_for()
    return tuple((c, float(shares[c])) for c in new)

  def run_seconds(self) -> float:
    """Seconds the waiting ledger has counted."""
    return 0.0 if self.waits_since is None else self._clock() - self.waits_since

  def clients(self, what: str) -> list[int] | None:
    """From the last beat decided here (None if none was): ``"unjoined"``,
    the clients still in their set-up; ``"running"``, those not at exit."""
    if self.view is None:
      return None
    phases, _, _, joined = self.view
    if what == "unjoined":
      return np.flatnonzero(~joined).tolist()
    if what == "running":
      return np.flatnonzero(phases != AT_EXIT).tolist()
    raise ValueError(f"unknown question {what!r}")

  def status(self) -> dict[str, Any]:
    """The cluster's view for `jdtensor status` (empty if none was decided
    here)."""
    if self.view is None:
      return {}
    phases, seconds, busy, _ = self.view
    moved = self.moved if self.moved is not None else np.zeros_like(busy)
    return {"phases": phases.tolist(), "seconds": seconds.tolist(),
            "busy": busy.tolist(), "moved": moved.tolist(), **self.stall.status(),
            "waiting": [round(float(v), 1) for v in self.waits.waiting()],
            "waited_for": [round(float(v), 1) for v in self.waits.waited_for()]}

