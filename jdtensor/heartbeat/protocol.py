"""The heartbeat protocol: the beat thread, the verdicts said and the policies.

No JAX and no sockets here: the exchange (the beat and its store), the
peers (the liveness links), the process's hooks and the main-thread recorder
are small objects given to `Heartbeat`, so tests run several clients as
threads with fakes of a few lines. `jdtensor.heartbeat` wires it to the liveness
links (which carry the exchange too) and the process.

In one beat each client sends a row (`jdtensor.heartbeat.verdicts.Row`):
DTensor's token, a stop request, and what its main thread is doing
(`jdtensor.heartbeat.flight`: phase, seconds in it, how busy the process
was). Where the rows meet, a `Decider` turns them into one outcome, which
every client receives, so every client reaches the same verdict at the same
beat (`jdtensor.heartbeat.verdicts` decides, `jdtensor.heartbeat.wording`
words them; the list of verdicts is in `jdtensor.heartbeat`). A `Watchdog`
thread times the beats.
"""

from __future__ import annotations

import enum
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np

from jdtensor import _logging as logging
from jdtensor._env import HEARTBEAT_POLICIES, HeartbeatSettings
from jdtensor.heartbeat import wording
from jdtensor.heartbeat.interfaces import Exchange, Peers, ProcessHooks
from jdtensor.heartbeat.flight import AT_EXIT, IN_JAX, RUNNING, WAITING, format_stacks
from jdtensor.heartbeat.stragglers import WaitLedger
from jdtensor.heartbeat.watchdog import Watchdog
from jdtensor.heartbeat.verdicts import (ALL_WAITING, EARLY_EXIT, FIRST_TOKENS,
                                         IDLE_PERCENT, OUT_OF_SYNC, STALLED,
                                         BeatLayout, Decider, Outcome, Row, StallTimeout,
                                         Verdict)
from jdtensor._report import Reason
from jdtensor.errors import OWN_FAILURE_EXIT_CODE, PEER_FAILURE_EXIT_CODE, PeerFailureError

__all__ = ["Heartbeat", "Exiting", "BeatLayout", "POLICIES", "FIRST_EXCHANGE_ALLOWANCE",
           "ROLL_CALL_GRACE", "IDLE_PERCENT", "exit_grace_for"]

POLICIES = HEARTBEAT_POLICIES
# Seconds the first exchange may take beyond the stuck time-out: every client
# must have started its heartbeat (after its backend's start).
FIRST_EXCHANGE_ALLOWANCE = 30.0
# Seconds an overdue beat's roll call waits for the healthy clients to answer
# (they are blocked in the same beat, and their deadlines expire together).
ROLL_CALL_GRACE = 1.0
# Seconds client 0, which hosts the coordination services, waits for the
# other clients' processes to end before its own exit (their JAX clients
# abort the moment the service is gone).
HOST_EXIT_WAIT = 5.0
# Seconds a survivor waits, where no jdtensor launcher names the root cause
# (under mpirun, srun, by hand), for the culprits' processes to end before
# it leaves: the engine names the first process to fail, and that must be
# the culprit. A culprit that never ends (stopped) costs the run this much.
CULPRIT_EXIT_GRACE = 5.0
# The same wait where another client's report names the culprits: a dead
# culprit's end is told right after the report, but the report may be of a
# culprit that never ends (stuck, cut off), which must not hold the run.
REPORTED_CULPRIT_WAIT = 0.5
# Seconds between asking whether this client has met the others, while it
# runs its own code (see `Heartbeat._joined`).
JOINED_ASK_SECONDS = 5.0


class Exiting(enum.Enum):
  """How this client's script is leaving, once it is."""
  FINISHED = "finished"  # Ended normally: beats at exit until the agreed end.
  FAILED = "failed"  # Leaving with a failure: reacts to nothing any more.


def exit_grace_for(period: float) -> float:
  """Seconds a client at exit and a blocked waiter make a "left early"."""
  return max(3.0, 2.0 * period)


class _WakingEvent(threading.Event):
  """The user's stop event; setting it also wakes the beat thread."""

  def __init__(self, wake: threading.Event):
    super().__init__()
    self._wake = wake

  def set(self) -> None:
    super().set()
    self._wake.set()


class _Idle:
  """The recorder when none is given: running, or at exit once finished."""
  at_exit = False
  joined = True

  def sample(self, busy: float = 0.0, idle_percent: float = 0.0
             ) -> tuple[int, float]:
    return (AT_EXIT if self.at_exit else RUNNING), 0.0

  def where(self) -> str:
    return "(not recorded)"

  def where_in_program(self) -> str | None:
    return None if self.at_exit else "(not recorded)"


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return text[0] if text else type(error).__name__


class Heartbeat:
  """One client's heartbeat: a beat thread and a watchdog thread.

  Args:
    settings: Period, policy and time-outs (`jdtensor._env.HeartbeatSettings`,
      read and checked once by `jdtensor._env.read_heartbeat_settings`).
    client_id: This client's id.
    num_clients: Number of clients.
    exchange: What the beats run on; None runs on the liveness links alone
      (no beats).
    peers: The other clients (the liveness links); None reaches nobody.
    process: This process's hooks; None: `ProcessHooks` (exits for real).
    recorder: The main-thread recorder (`jdtensor.heartbeat.flight`):
      ``sample()``, ``where()``, ``where_in_program()`` and an ``at_exit``
      flag; None: always running.
  """

  def __init__(self, settings: HeartbeatSettings, client_id: int, num_clients: int,
               exchange: Exchange | None = None, peers: Peers | None = None,
               process: ProcessHooks | None = None, recorder: Any = None):
    self.settings = settings
    self.period = float(settings.period)
    self.policy = settings.policy
    self.stuck_timeout = float(settings.stuck_timeout)
    self.stall_timeout = float(settings.stall_timeout)
    self.stall_kill_all_waiting = settings.stall_kill_all_waiting
    self.exit_grace = exit_grace_for(self.period)
    self.client_id, self.num_clients = client_id, num_clients
    self.layout = BeatLayout(num_clients)
    self._exchange = exchange
    store = exchange if exchange is not None else Exchange()
    self._roll_call, self._share, self._fetch = store.roll_call, store.share, store.fetch
    self._joined_collective = store.joined_collective
    self._close_timeout = store.close_timeout
    self.recorder = recorder if recorder is not None else _Idle()
    self._peers = peers if peers is not None else Peers()
    process = process if process is not None else ProcessHooks()
    self._cpu, self._clock = process.cpu_seconds, process.clock
    self._process = process
    # Decides this client's beats where the exchange hands it every row (on
    # the liveness links: client 0's decides for everyone).
    self.decider = Decider(num_clients, self.exit_grace,
                           StallTimeout(self.stall_timeout, settings.stall_floor,
                                        settings.stall_learn, self.period),
                           WaitLedger(num_clients, settings.straggler_window,
                                      settings.straggler_threshold, self.period),
                           self._clock)
    self._has_joined = False
    self._seen_at_verdict: tuple[int, str, str] | None = None
    self._joined_asked = -JOINED_ASK_SECONDS
    # Wakes the beat thread early: the stop, or this client reaching its end
    # (so that a run whose clients end together agrees on it in one beat,
    # not after up to a period).
    self._wake = threading.Event()
    self.event = _WakingEvent(self._wake)  # Set by users to stop every client.
    self.stopped = threading.Event()  # Set once the beat thread has ended.
    self.ready = threading.Event()  # Set once the first exchange is done.
    # Whether this client's failure ends it under "terminate" (`_fail`), and
    # set once that verdict's line is out: whoever leaves first must not end
    # the process before it is (see `jdtensor.heartbeat.leave`).
    self.terminating = False
    self.said = threading.Event()
    self.token = 0
    # The last beat after the first exchange whose outcome this client took
    # (the agreed end's beat is the same on every client).
    self.beats = 0
    self._exchanged = 0  # Beats after the first this client has exchanged.
    self.beat_seconds = 0.0  # Total wall time spent inside beats.
    self.failure: PeerFailureError | None = None
    # Seconds to wait for the failure's culprits to end before leaving (see
    # `_fail`), where no jdtensor launcher names the root cause.
    self.culprit_wait = 0.0
    self.closed_cleanly: bool | None = None  # Result of the teardown.
    self.exiting: Exiting | None = None  # None: the script still runs.
    self.departed: dict[int, float] = {}  # Clients that ended normally.
    self.leaving: set[int] = set()  # Clients that announced they are leaving.
    self.own_state: tuple[int, int, int] | None = None  # Last row's phase, s, busy.
    self._fail_lock = threading.Lock()
    self.watchdog = Watchdog(self._clock, self.stuck_timeout, self.stopped,
                             on_overdue=lambda: self._fail_missed(
                                 self._exchanged + 1, self.stuck_timeout, ""),
                             on_frozen=self._was_frozen, on_error=self._own_failure)
    self._last_beat = self._clock()  # Every client was alive then.
    self._threads: list[threading.Thread] = []

  @property
  def waits(self) -> WaitLedger:
    """The waiting ledger (kept where the beats are decided)."""
    return self.decider.waits

  # -- the beat thread ----------------------------------------------------------

  def _timed_exchange(self, row: Row) -> Outcome | None:
    """One beat; None (and the failure recorded) if the exchange failed.

    Only an error of the exchange itself is a missed beat; an error in the
    rest of this code is this client's own (see `_run`).
    """
    started = self._clock()
    self.watchdog.beat_started(started)
    try:
      outcome = self._exchange.beat(row)  # type: ignore[union-attr]
    except Exception as e:  # pylint: disable=broad-except
      self._fail_missed(self._exchanged + 1, self.stuck_timeout,
                        f" (the beat failed: {_first_line(e)})")
      return None
    self._last_beat = self._clock()
    self.watchdog.beat_ended()
    self.beat_seconds += self._last_beat - started
    return outcome

  def first_exchange(self) -> None:
    """Starts the exchange and spreads client 0's token (DTensor's first
    all-reduce), with a deadline. Run by the heartbeat thread first."""
    n = self.num_clients
    token = int(np.random.default_rng().integers(0, 2**16 - 1))
    self._roll_call(0, 0.0)  # The start marker: "this client started".
    if self.client_id != 0:
      token = 0
    row = Row(self.client_id, token, False, RUNNING, 0, 0, first=True)
    logging.info("Initial heartbeat signal: %s", np.full(n, token, np.int32))
    result: list[Outcome] = []
    errors: list[BaseException] = []
    open_errors: list[BaseException] = []

    def run() -> None:
      if self._exchange is not None:
        try:
          self._exchange.open(self.decider, wake=self._wake.set)
        except BaseException as e:  # pylint: disable=broad-except
          open_errors.append(e)
          return
      try:
        result.append(self._exchange.beat(row))  # type: ignore[union-attr]
      except BaseException as e:  # pylint: disable=broad-except
        errors.append(e)
    waited = self.stuck_timeout + FIRST_EXCHANGE_ALLOWANCE
    thread = threading.Thread(target=run, daemon=True, name="jdtensor-hb-first")
    thread.start()
    thread.join(waited)
    if open_errors:  # Starting our own end of the exchange failed.
      self._own_failure(open_errors[0])
      return
    if not result:
      detail = f" (it failed: {_first_line(errors[0])})" if errors else ""
      self._fail_missed(0, waited, detail)
      return
    outcome = result[0]
    verdict = outcome.verdict
    if verdict is None or verdict.kind != FIRST_TOKENS:
      logging.info("Merged heartbeat signal %s", np.full(n, outcome.token, np.int32))
    elif self.client_id == 0:
      slots = np.asarray(verdict.tokens)
      logging.info("Merged heartbeat signal %s", slots)
      bad = np.flatnonzero(slots != token).tolist()
      self._fail(wording.first_tokens_differ(token, bad), bad)
    else:
      logging.info("Merged heartbeat signal %s", np.asarray(verdict.tokens))
      self._fail(wording.tokens_unequal(verdict.tokens), list(range(n)))
    self.token = outcome.token
    self._last_beat = self._clock()
    self.ready.set()

  def _run(self) -> None:
    """The heartbeat thread: the first exchange, beats, then the teardown."""
    try:
      if self._exchange is None:
        self.ready.set()
        self.event.wait()  # Links only: nothing to beat; wait for the stop.
        return
      if not self.ready.is_set() and self.failure is None:
        self.first_exchange()
      if self.failure is None:
        self._loop()
      if self.failure is None:
        self.closed_cleanly = self._exchange.close(self._close_timeout)
    except BaseException as e:  # pylint: disable=broad-except
      self._own_failure(e)
    finally:
      self.stopped.set()
      self.watchdog.wake()

  def _loop(self) -> None:
    logging.info("Starting a heartbeat thread")
    wall, cpu = self._clock(), self._cpu()
    # Beats on a schedule from the first exchange's end, which every client
    # reaches at once: the clients' rows reach client 0 together, a batch a
    # beat, also where they do not wait for each beat's outcome. A beat that
    # ends late starts the schedule again from its end.
    next_beat = time.monotonic() + self.period
    while self.failure is None:
      # At exit, beat again at once: the agreed end is the first beat every
      # client sends at exit, and waiting a period here would hold this
      # client's exit up to a period after the last client finished. No spin:
      # the exchange itself waits for the others' next beats.
      wait = 0.0 if self.exiting is Exiting.FINISHED else next_beat - time.monotonic()
      if self._wake.wait(max(0.0, wait)):
        self._wake.clear()
      next_beat = max(next_beat + self.period, time.monotonic() + self.period / 2)
      stop = self.event.is_set()
      now, now_cpu = self._clock(), self._cpu()
      busy = 100.0 * (now_cpu - cpu) / max(now - wall, 1e-3)
      wall, cpu = now, now_cpu
      phase, seconds = self.recorder.sample(busy, IDLE_PERCENT)
      row = Row(self.client_id, self.token, stop, phase, seconds, int(busy),
                self._joined(phase, seconds))
      self.own_state = (int(phase), *row.clamped)
      outcome = self._timed_exchange(row)
      if outcome is None:
        break
      self._exchanged += 1
      # An older beat's news, taken late, does not move the count back; the
      # agreed end is the beat every client ends at, even one that had beaten
      # once more without waiting (its outcome of that beat was its own).
      self.beats = outcome.beat if outcome.end else max(self.beats, outcome.beat)
      logging.vlog(2, "Heartbeat outcome %s", outcome)
      verdict = outcome.verdict
      if verdict is not None and verdict.kind == OUT_OF_SYNC:
        self._out_of_sync(verdict)
        break
      for client, share in outcome.stragglers:
        self._straggler(client, share, outcome.beat)
      if outcome.end:
        logging.info("Exiting the heartbeat thread normally")
        if self.decider.view is not None:  # The ledger was kept here.
          self._process.publish_waits(self.decider.waits.run_shares(),
                                      self.decider.run_seconds(), self.settings.period)
        break
      if verdict is not None:
        self._act_on(verdict, outcome.beat)
      if self._process.status_wanted():
        self._process.publish_status(self.status())

  # -- waiting and stragglers (never a verdict) ---------------------------------

  def _straggler(self, client: int, share: float, beat: int) -> None:
    """Logs, once on every client, that the others wait for `client`, with
    where its main thread is (it shares it; the others fetch it off the beat
    thread, so a beat is never held up)."""
    text = wording.straggler(client, share, self.decider.waits.window)
    key = f"straggler/{client}/{beat}"
    if client == self.client_id:
      where = self.recorder.where()
      self._share(key, where)
      logging.warning("%s (main thread in %s)", text, where)
      return

    def fetch_and_log() -> None:
      where = self._fetch(key, ROLL_CALL_GRACE) or "(its stack did not arrive)"
      logging.warning("%s (main thread in %s)", text, where)
    threading.Thread(target=fetch_and_log, daemon=True,
                     name="jdtensor-heartbeat-straggler").start()

  def status(self) -> dict[str, Any]:
    """What `jdtensor status` shows of this client: its own state and, where
    the beats are decided (client 0 on the liveness links), every client's
    (the last merged beat and the waiting shares)."""
    waits = self.decider.waits
    return {"client": self.client_id, "beats": self.beats, "period": self.period,
            "own": list(self.own_state) if self.own_state is not None else None,
            **self.decider.status(),
            "window": waits.window, "threshold": waits.threshold,
            "where": self.recorder.where()}

  def clients(self, what: str) -> list[int] | None:
    """`Decider.clients(what)` from the last beat: this client's decider's
    if it decides, else the deciding client's answer (None: no answer)."""
    local = self.decider.clients(what)
    if local is not None or self._exchange is None:
      return local
    return self._exchange.ask(what, ROLL_CALL_GRACE)

  def _joined(self, phase: int, seconds: float) -> bool:
    """Whether this client has met the others (set-up is over); asked of
    `joined_collective` while inside JAX or running its own code long enough
    to be a staller, else at most every `JOINED_ASK_SECONDS` (the learnt
    stall time-out's warm-up waits for every client's answer), and never
    again once true. (Not at every beat: the question runs jaxlib code on a
    helper thread, and a program that forks while it runs hands its child a
    held lock.)"""
    if self._has_joined:
      return True
    now = self._clock()
    shortest = self.decider.stall.floor if self.decider.stall.learn else self.stall_timeout
    if (phase in (IN_JAX, WAITING) or now - self._joined_asked >= JOINED_ASK_SECONDS
        or (shortest > 0 and phase == RUNNING and seconds >= shortest / 2)):
      self._joined_asked = now
      self._has_joined = bool(self._joined_collective())
    return self._has_joined

  # -- verdicts (decided in `jdtensor.heartbeat.verdicts`, said here) -----------

  def _act_on(self, verdict: Verdict, beat: int) -> None:
    """Says a beat's verdict in this client's words and applies the policy
    (every client has the same verdict: nobody needs to be told)."""
    n = self.num_clients
    if verdict.kind != ALL_WAITING or self.stall_kill_all_waiting:
      # Before anything moves: a staller's exit ends the others' collective.
      try:
        self._seen_at_verdict = self._where_now()
      except Exception:  # pylint: disable=broad-except
        self._seen_at_verdict = None  # `_show_stacks` tries again, and says why.
    if verdict.kind == EARLY_EXIT:
      gone = list(verdict.culprits)
      self._fail(wording.early_exit(gone, verdict.waiting), gone, told=True)
    elif verdict.kind == STALLED:
      staller = verdict.culprits[0]
      self._stalled(staller, verdict, beat, [c for c in range(n) if c != staller])
    elif verdict.kind == ALL_WAITING:
      reason = wording.every_client_waiting(self.stall_timeout, self.client_id,
                                            self.recorder.where())
      if self.stall_kill_all_waiting:
        self._fail(reason, list(range(n)), told=True)
      else:
        logging.warning("%s", reason.heartbeat_line())

  def _stalled(self, staller: int, verdict: Verdict, beat: int, waiters: list[int]
               ) -> None:
    key = f"stall/{beat}"
    if staller == self.client_id:
      where = self.recorder.where()
      self._share(key, where)
    else:
      where = self._fetch(key, ROLL_CALL_GRACE) or "(its stack did not arrive)"
    stall = self.decider.stall
    self._fail(wording.stalled(staller, where, verdict.seconds, waiters,
                               timeout=verdict.timeout, learnt=verdict.learnt,
                               floor=stall.floor, ceiling=stall.ceiling),
               [staller], exit_code=(OWN_FAILURE_EXIT_CODE
                                     if staller == self.client_id else PEER_FAILURE_EXIT_CODE),
               told=True, culprit_wait=CULPRIT_EXIT_GRACE)  # It ends itself.

  def _out_of_sync(self, verdict: Verdict) -> None:
    """Names the clients whose slots lack the cluster's token (a restarted
    client blames itself: `Decider` takes the token most slots hold)."""
    me = self.client_id
    mine = verdict.token_of(me)
    cluster_token = verdict.cluster_token
    if mine != self.token:
      # Only this client writes its slot: the exchange itself is broken.
      self._fail(wording.wrong_sum(self.beats, me, self.token, mine, cluster_token),
                 [me], exit_code=OWN_FAILURE_EXIT_CODE)
      return
    if me in verdict.culprits:
      self._fail(wording.out_of_sync_here(me, self.token, cluster_token, self.beats),
                 [me], exit_code=OWN_FAILURE_EXIT_CODE)
      return
    wrong = list(verdict.culprits)
    self._fail(wording.out_of_sync(wrong, verdict.tokens, cluster_token, self.beats),
               wrong, told=True)

  def late_for_collective(self, waited: float) -> None:
    """This client's collective gave up after `waited` s setting up with a
    client that never joined it: names the clients still in their set-up
    (never joined a collective), from the last beat, as the cause."""
    unjoined = self.clients("unjoined")
    late = [c for c in unjoined or () if c != self.client_id]
    if not late:
      return
    self._fail(wording.late_for_collective(late, waited), late)

  # -- what the watchdog finds ------------------------------------------------

  def _was_frozen(self, seconds: float) -> None:
    if seconds >= self.stuck_timeout:
      own, public = wording.frozen(self.client_id, seconds, self.stuck_timeout)
      self._fail(own, [self.client_id], exit_code=OWN_FAILURE_EXIT_CODE, public=public)
    else:
      logging.warning("heartbeat: this client (%d) did not run for %.1f s "
                      "(within the stuck time-out, %g s)", self.client_id,
                      seconds, self.stuck_timeout)

  def _fail_missed(self, beat: int, waited: float, detail: str) -> None:
    """A beat did not complete within `waited` s: a roll call (every healthy
    client blocked in the same beat answers it within a moment) names the
    ones that do not answer."""
    others = [c for c in range(self.num_clients) if c != self.client_id]
    present = self._roll_call(beat, ROLL_CALL_GRACE)
    if present is None:
      self._fail(wording.beat_not_completed(beat, waited, detail,
                                            service_unreachable=True), [0])
      return
    missing = [c for c in others if c not in present]
    if not missing:
      self._fail(wording.beat_not_completed(beat, waited, detail), others)
      return
    self._fail(wording.beat_not_completed(
        beat, waited, detail, missing=missing, age=self._clock() - self._last_beat,
        finished=[c for c in missing if c in self.departed]), missing)

  # -- failure ------------------------------------------------------------------

  def _fail(self, reason: Reason, ids: list[int], *,
            exit_code: int = PEER_FAILURE_EXIT_CODE,
            public: Reason | None = None, told: bool = False,
            culprit_wait: float = 0.0) -> None:
    """Records a failure (`reason`, worded by `wording`) and applies the
    policy.

    A failure that names other clients is told to every client (and to the
    launcher); one that names this client is told as `public`, if given
    (the others would read "this client" as themselves). One every client
    was `told` already (another client's report, a departure) is not told
    again: at N clients that would be N reports, each relayed to N clients.
    `culprit_wait`: seconds to wait for the culprits' processes to end
    before leaving, where no jdtensor launcher names the root cause (only
    for culprits that end by themselves: gone, leaving, a staller).
    """
    with self._fail_lock:
      if self.failure is not None or self.exiting is Exiting.FAILED:
        return
      own = exit_code != PEER_FAILURE_EXIT_CODE
      message = (f"{reason.heartbeat_line()}; "
                 f"{wording.consequence(self.exiting is Exiting.FINISHED, self.policy)}")
      error = PeerFailureError(message, tuple(ids))
      self.failure = error
      self.culprit_wait = culprit_wait  # For a way out on another thread.
      # Decided with the failure, once: under "terminate" this thread says it
      # and ends the process, even if the main thread starts leaving (on
      # the collective error this failure causes) while it reports.
      self.terminating = self.policy == "terminate" and self.exiting is None
    culprits = [c for c in error.client_ids if c != self.client_id]
    # Under "terminate" this client leaves at once: the launcher waits for it
    # to end by itself rather than stopping it.
    leaving = self.terminating
    if culprits:
      if not told:
        self._peers.report(culprits, reason)
      self._process.tell_launcher(culprits, reason, leaving)
    elif own:
      self._process.tell_launcher([self.client_id], public or reason, leaving)
      if public is not None:
        self._peers.report([self.client_id], public)
    if self.terminating:
      # One plain line, certain to be seen, then exit without JAX's shutdown
      # barrier (it would wait for the failed client).
      sys.stderr.write(message + "\n")
      sys.stderr.flush()
      self._show_stacks()
      self.said.set()
      if culprits and exit_code == PEER_FAILURE_EXIT_CODE:
        # Under an engine (mpirun, srun), the first process to fail is the
        # one it names: the culprits' exits first, bounded.
        grace = min(culprit_wait, self._process.culprit_grace())
        if grace > 0:
          self._peers.wait_ended(culprits, grace)
      if self.client_id == 0:  # Hosts the services: leave last.
        # Not for a culprit that may never end (stalled, stopped); but one
        # that announced its departure is on its way out: ending the services
        # under it would abort it from C++ (JAX's error poll).
        self._peers.wait_peers_gone(HOST_EXIT_WAIT, [c for c in error.client_ids
                                                     if c not in self.leaving])
      self._process.terminate(exit_code)
      return
    logging.error("%s", message)
    self._show_stacks()
    if self.policy == "raise" and self.exiting is None:
      self._process.on_failure(error)
    self.stopped.set()
    self.watchdog.wake()

  def _where_now(self) -> tuple[int, str, str]:
    """(phase, where in the program, every thread's stack) of this client now:
    the last beat's phase (before any beat, a sample now)."""
    phase = (self.own_state[0] if self.own_state is not None
             else self.recorder.sample(0.0, IDLE_PERCENT)[0])
    where = self.recorder.where_in_program()
    if where is None:
      phase, where = AT_EXIT, "its script has ended (in jdtensor's exit handling)"
    return phase, where, format_stacks()

  def _show_stacks(self) -> None:
    """Where this client was at the verdict (every client shows its own): as
    the beat's verdict found it (`_act_on`), else now."""
    try:
      seen, self._seen_at_verdict = self._seen_at_verdict, None
      self._process.show_stacks(*(seen or self._where_now()))
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("heartbeat: could not show this client's stacks: %s", _first_line(e))

  def _own_failure(self, error: BaseException) -> None:
    """An exception in the heartbeat's own code: this client's failure."""
    trace = "".join(traceback.format_exception(error)).rstrip()
    own, public = wording.own_code_failed(self.client_id, error, trace)
    self._fail(own, [self.client_id], exit_code=OWN_FAILURE_EXIT_CODE, public=public)

  # -- events from the liveness links -------------------------------------------

  def peer_died(self, client: int, how: str) -> None:
    """A liveness link saw `client`'s process end (no beat can succeed now)."""
    if self.stopped.is_set() and self.failure is None:
      return  # We already stopped by agreement; a late exit is not a failure.
    if self._exchange is None:  # Links only: there are no beats to speak of.
      self._fail(wording.gone(client, how), [client])
      return
    age = self._clock() - self._last_beat
    self._fail(wording.missed_beat(client, self._exchanged + 1, age, how), [client],
               culprit_wait=CULPRIT_EXIT_GRACE)

  def peer_reported(self, clients: list[int], reason: Reason) -> None:
    """Another client (`reason.reporter`) found `clients` failed (relayed by
    the liveness links)."""
    if self.stopped.is_set() and self.failure is None:
      return
    # Named ourselves (e.g. we were frozen, or stalled): we are the root cause.
    self._fail(reason, clients,
               exit_code=(OWN_FAILURE_EXIT_CODE if self.client_id in clients
                          else PEER_FAILURE_EXIT_CODE), told=True,
               culprit_wait=REPORTED_CULPRIT_WAIT)

  def peer_left(self, client: int, code: int, why: str, failure: bool,
                raised: bool = False) -> None:
    """A client announced it is leaving: with a failure (`raised`: an
    exception; else a non-zero exit code), or finished."""
    self.leaving.add(client)
    if not failure:
      self.departed[client] = self._clock()
      return
    self._fail(wording.left(client, why, raised, still_running=self.exiting is None),
               [client], told=True, culprit_wait=CULPRIT_EXIT_GRACE)  # On its way out.

  def peer_notice(self, client: int, text: str) -> None:
    """Logs what another client said that is not a verdict."""
    logging.warning("client %d: %s", client, text)

  # -- lifecycle ----------------------------------------------------------------

  def start_threads(self) -> None:
    """Starts the beat thread and, with an exchange, the watchdog."""
    targets = [(self._run, "jdtensor-heartbeat")]
    if self._exchange is not None:
      targets.append((self.watchdog.run, "jdtensor-heartbeat-watchdog"))
    for target, name in targets:
      thread = threading.Thread(target=target, daemon=True, name=name)
      thread.start()
      self._threads.append(thread)

  def running(self) -> bool:
    """Whether the heartbeat's thread is still alive."""
    return any(t.is_alive() for t in self._threads[:1])

  def finish(self) -> None:
    """This client's script has ended normally: beat "at exit" until every
    client has (the agreed end), and only log what happens to the others."""
    self.exiting = Exiting.FINISHED
    self.recorder.at_exit = True
    if self._exchange is None:
      self.event.set()
    self._wake.set()

  def abandon(self) -> PeerFailureError | None:
    """This client is leaving with a failure: react to nothing any more.

    Returns:
      The failure recorded before, if any. Decided under the failure's lock:
      a verdict is either recorded before this (and, under "terminate", its
      thread says it and ends the process) or not acted on at all.
    """
    with self._fail_lock:
      self.exiting = Exiting.FAILED
      failure = self.failure
    self.stopped.set()
    self.watchdog.wake()
    return failure

  def stop(self, timeout: float | None = None) -> bool:
    """Requests the agreed stop and waits for it (and the teardown).

    Returns:
      True if the heartbeat stopped in time.
    """
    logging.info("Stopping the heartbeat thread")
    self.event.set()
    if timeout is None:
      timeout = self.period + self.stuck_timeout + self._close_timeout
    return self.stopped.wait(timeout)
