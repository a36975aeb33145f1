"""The heartbeat protocol: the beat thread, the verdicts said and the policies.

No JAX and no sockets here: the exchange (the beat and its store), the peers
(the liveness links), the process's hooks (`jdtensor.heartbeat.interfaces`)
and the main-thread recorder (`jdtensor.heartbeat.flight.Recorder`) are small
objects given to `Heartbeat`, so tests run several clients as threads with
fakes of a few lines.

In one beat each client sends a row (`jdtensor.heartbeat.wire.Row`): DTensor's
token, a stop request, and what its main thread is doing. Where the rows
meet, a `Decider` turns them into one outcome, which every client receives,
so every client reaches the same verdict at the same beat (`verdicts`
decides and lists them, `failures` says whom this client blames, `wording`
words it). A `Watchdog` thread times the beats; `lifecycle` holds the phase.
What stays here is the threads and the policy.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np

from jdtensor import _logging as logging
from jdtensor._env import HEARTBEAT_POLICIES, HeartbeatSettings
from jdtensor.heartbeat import failures, wording
from jdtensor.heartbeat.failures import Failure
from jdtensor.heartbeat.interfaces import Exchange, Peers, ProcessHooks
from jdtensor.heartbeat.leaving import HOST_EXIT_WAIT, ROLL_CALL_GRACE, wait_to_leave
from jdtensor.heartbeat.lifecycle import Lifecycle, Phase, WakingEvent
from jdtensor.heartbeat.meetings import JoinedQuestion
from jdtensor.heartbeat.flight import AT_EXIT, RUNNING, WAITING, Recorder
from jdtensor.heartbeat.stragglers import WaitLedger
from jdtensor.heartbeat.watchdog import Watchdog
from jdtensor.heartbeat.verdicts import (ALL_WAITING, DEADLOCK, EARLY_EXIT, FIRST_TOKENS,
                                         IDLE_PERCENT, MOVING_BYTES_PER_SECOND,
                                         OUT_OF_SYNC, STALLED,
                                         BeatLayout, Decider, Outcome, Row, StallTimeout,
                                         Verdict, exit_grace_for)
from jdtensor._report import Reason
from jdtensor._threads import start_daemon
from jdtensor.errors import PeerFailureError

__all__ = ["Heartbeat", "Phase", "BeatLayout", "POLICIES", "FIRST_EXCHANGE_ALLOWANCE",
           "ROLL_CALL_GRACE", "HOST_EXIT_WAIT", "IDLE_PERCENT", "exit_grace_for"]

POLICIES = HEARTBEAT_POLICIES
# Seconds the first exchange may take past the stuck time-out (backends start first).
FIRST_EXCHANGE_ALLOWANCE = 30.0


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
    recorder: The main-thread recorder
      (`jdtensor.heartbeat.flight.ProgramThreadRecorder`); None: `Recorder`
      (always running).
  """

  def __init__(self, settings: HeartbeatSettings, client_id: int, num_clients: int,
               exchange: Exchange | None = None, peers: Peers | None = None,
               process: ProcessHooks | None = None, recorder: Recorder | None = None):
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
    # The exchange's store (and its defaults where the beats do not run).
    self._store = exchange if exchange is not None else Exchange()
    self.recorder = recorder if recorder is not None else Recorder()
    self._peers = peers if peers is not None else Peers()
    self._process = process if process is not None else ProcessHooks()
    # Decides this client's beats where the exchange hands it every row (on
    # the liveness links: client 0's decides for everyone).
    self.decider = Decider(num_clients, self.exit_grace,
                           StallTimeout(self.stall_timeout, settings.stall_floor,
                                        settings.stall_learn),
                           WaitLedger(num_clients, settings.straggler_window,
                                      settings.straggler_threshold, self.period),
                           self._process.clock, settings.deadlock_timeout)
    stall = self.decider.stall
    self._joined = JoinedQuestion(self._store.joined_collective, self._process.clock,
                                  stall.floor if stall.learn else self.stall_timeout)
    self._seen_at_verdict: tuple[int, str, str] | None = None
    # Wakes the beat thread early: the stop, or this client reaching its end
    # (so that a run whose clients end together agrees on it in one beat,
    # not after up to a period).
    self._wake = threading.Event()
    self.event = WakingEvent(self._wake)  # Set by users to stop every client.
    # The phase, the failure, and when the heartbeat stopped and a verdict
    # under "terminate" was said (`lifecycle`: one lock, its moves a table).
    self.life = Lifecycle()
    self.stopped, self.said = self.life.stopped, self.life.said
    self.ready = threading.Event()  # Set once the first exchange is done.
    self.token = 0
    # The last beat after the first exchange whose outcome this client took
    # (the agreed end's beat is the same on every client).
    self.beats = 0
    self._exchanged = 0  # Beats after the first this client has exchanged.
    self.beat_seconds = 0.0  # Total wall time spent inside beats.
    # Seconds to wait for the failure's culprits to end before leaving
    # (`leaving.wait_to_leave`): the failure's, where no jdtensor launcher
    # names the root cause.
    self.culprit_grace = 0.0
    self.departed: dict[int, float] = {}  # Clients that ended normally.
    self.leaving: set[int] = set()  # Clients that announced they are leaving.
    # The last row's phase, seconds, busy percent and bytes moved a second.
    self.own_state: tuple[int, int, int, int] | None = None
    self.watchdog = Watchdog(self._process.clock, self.stuck_timeout, self.stopped,
                             on_overdue=lambda: self._fail_missed(
                                 self._exchanged + 1, self.stuck_timeout, ""),
                             on_frozen=self._was_frozen, on_error=self._own_failure)
    self._last_beat = self._process.clock()  # Every client was alive then.
    self._threads: list[threading.Thread] = []

  @property
  def failure(self) -> PeerFailureError | None:
    """The first verdict, if any."""
    return self.life.failure

  @property
  def terminating(self) -> bool:
    """Whether a verdict under "terminate" is ending this process."""
    return self.life.phase is Phase.TERMINATING

  @property
  def closed_cleanly(self) -> bool | None:
    return self.life.closed_cleanly  # The teardown's result (None: none ran).

  @property
  def script_ended(self) -> bool:
    """Whether this client's script is leaving (finished, or with a failure)."""
    return self.life.phase in (Phase.FINISHING, Phase.ABANDONED)

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
    started = self._process.clock()
    self.watchdog.beat_started(started)
    try:
      outcome = self._exchange.beat(row)  # type: ignore[union-attr]
    except Exception as e:  # pylint: disable=broad-except
      self._fail_missed(self._exchanged + 1, self.stuck_timeout,
                        f" (the beat failed: {_first_line(e)})")
      return None
    self._last_beat = self._process.clock()
    self.watchdog.beat_ended()
    self.beat_seconds += self._last_beat - started
    return outcome

  def first_exchange(self) -> None:
    """Starts the exchange and spreads client 0's token (DTensor's first
    all-reduce), with a deadline. Run by the heartbeat thread first."""
    n = self.num_clients
    token = int(np.random.default_rng().integers(0, 2**16 - 1))
    self._store.roll_call(0, 0.0)  # The start marker: "this client started".
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
    else:
      logging.info("Merged heartbeat signal %s", np.asarray(verdict.tokens))
      self._fail(failures.first_tokens(verdict, self.client_id, token))
    self.token = outcome.token
    self._last_beat = self._process.clock()
    self.ready.set()

  def _run(self) -> None:
    """The heartbeat thread: the first exchange, beats, then the teardown."""
    if self._process.tracing:
      self._process.trace_open(self.recorder.label)
    try:
      if self._exchange is None:
        self.ready.set()
        self.event.wait()  # Links only: nothing to beat; wait for the stop.
        return
      if not self.ready.is_set() and self.failure is None:
        self.first_exchange()
      if self._process.tracing and self.failure is None:
        self._process.trace_begin(*(self._store.clock_offset() or (0.0, float("nan"))))
      if self.failure is None:
        self._loop()
      if self.failure is None:
        self.life.closed_cleanly = self._exchange.close(self._store.close_timeout)
    except BaseException as e:  # pylint: disable=broad-except
      self._own_failure(e)
    finally:
      self._process.trace_end()
      self.life.move("end")
      self.stopped.set()
      self.watchdog.wake()

  def _loop(self) -> None:
    logging.info("Starting a heartbeat thread")
    wall, cpu = self._process.clock(), self._process.cpu_seconds()
    # Beats on a schedule from the first exchange's end, which every client
    # reaches at once: the clients' rows reach client 0 together, a batch a
    # beat, also where they do not wait for each beat's outcome. A beat that
    # ends late starts the schedule again from its end.
    next_beat = time.monotonic() + self.period
    moved_before = self._process.bytes_moved(True)
    busy = moved = 0.0
    while self.failure is None:
      # At exit, beat again at once: the agreed end is the first beat every
      # client sends at exit, and waiting a period here would hold this
      # client's exit up to a period after the last client finished. No spin:
      # the exchange itself waits for the others' next beats.
      at = time.monotonic() if self.life.phase is Phase.FINISHING else next_beat
      self._exchange.sleep_until_beat(self._wake, at, self.period)  # type: ignore[union-attr]
      next_beat = max(next_beat + self.period, time.monotonic() + self.period / 2)
      stop = self.event.is_set()
      now, now_cpu = self._process.clock(), self._process.cpu_seconds()
      # TCP is counted only while the main thread runs its own code: the only
      # time this client can be named a staller.
      in_own_code = self.own_state is None or self.own_state[0] == RUNNING
      moved_now = self._process.bytes_moved(in_own_code)
      # Rates over half a period at least: a beat woken or called early would
      # read a few bytes of this client's own log line, or a moment's CPU, as
      # a high rate, and break a staller's idle pause in two.
      window = max(now - wall, self.period / 2)
      recent_busy = 100.0 * (now_cpu - cpu) / window
      recent_moved = (0.0 if moved_now is None or moved_before is None
                      else max(0, moved_now - moved_before) / window)
      if now - wall >= self.period / 2:
        busy, moved = recent_busy, recent_moved
        moved_before = moved_now
        wall, cpu = now, now_cpu
      else:
        # An early beat (a called one may name a staller) also counts what
        # moved since the last rates: a client that began a download a
        # moment ago is not idle.
        busy, moved = max(busy, recent_busy), max(moved, recent_moved)
      phase, seconds = self.recorder.sample(busy, IDLE_PERCENT,
                                            moving=moved >= MOVING_BYTES_PER_SECOND)
      row = Row(self.client_id, self.token, stop, phase, seconds, int(busy),
                self._joined.answer(phase, seconds), moved=moved,
                active=self.recorder.active)
      self.own_state = (int(phase), int(seconds), row.clamped[1], row.moved_slot)
      if self._process.tracing:
        self._process.trace_beat(int(phase), seconds, row.joined, busy,
                                 phase == WAITING and self.recorder.at_service_wait())
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
        self._fail(failures.out_of_sync(verdict, self.client_id, self.token, self.beats))
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
    where its program's thread is (it shares it; the others fetch it off the beat
    thread, so a beat is never held up)."""
    text = wording.straggler(client, share, self.decider.waits.window)
    self._process.trace_event("straggler", text)
    key = f"straggler/{client}/{beat}"
    if client == self.client_id:
      where = self.recorder.said_where()
      self._store.share(key, where)
      logging.warning("%s (%s)", text, where)
      return

    def fetch_and_log() -> None:
      where = self._store.fetch(key, ROLL_CALL_GRACE) or "its stack did not arrive"
      logging.warning("%s (%s)", text, where)
    if start_daemon(fetch_and_log, "jdtensor-heartbeat-straggler") is None:
      logging.warning("%s", text)  # The interpreter is shutting down: no fetch.

  def status(self) -> dict[str, Any]:
    """What `jdtensor status` shows of this client: its own state and, where
    the beats are decided (client 0 on the liveness links), every client's
    (the last merged beat and the waiting shares)."""
    waits = self.decider.waits
    return {"client": self.client_id, "beats": self.beats, "period": self.period,
            "own": list(self.own_state) if self.own_state is not None else None,
            **self.decider.status(),
            "window": waits.window, "threshold": waits.threshold,
            "where": self.recorder.where(), "thread": self.recorder.label}

  def clients(self, what: str) -> list[int] | None:
    """`Decider.clients(what)` from the last beat: this client's decider's
    if it decides, else the deciding client's answer (None: no answer)."""
    local = self.decider.clients(what)
    if local is not None or self._exchange is None:
      return local
    return self._exchange.ask(what, ROLL_CALL_GRACE)

  # -- verdicts (decided in `verdicts`, meant in `failures`, said here) ---------

  def _act_on(self, verdict: Verdict, beat: int) -> None:
    """Says a beat's verdict in this client's words and applies the policy
    (every client has the same verdict: nobody needs to be told)."""
    me, n = self.client_id, self.num_clients
    if verdict.kind != ALL_WAITING or self.stall_kill_all_waiting:
      # Before anything moves: a staller's exit ends the others' collective.
      try:
        self._seen_at_verdict = self._where_now()
      except Exception:  # pylint: disable=broad-except
        self._seen_at_verdict = None  # `_show_stacks` tries again, and says why.
    if verdict.kind == EARLY_EXIT:
      self._fail(failures.early_exit(verdict))
    elif verdict.kind == STALLED:
      key, staller = f"stall/{beat}", verdict.culprits[0]
      if staller == me:
        where = self.recorder.said_where()
        self._store.share(key, where)
      else:
        where = self._store.fetch(key, ROLL_CALL_GRACE) or "(its stack did not arrive)"
      self._fail(failures.stalled(verdict, me, n, where, self.decider.stall))
    elif verdict.kind == DEADLOCK:
      self._fail(failures.deadlock(verdict, n))
    elif verdict.kind == ALL_WAITING:
      failure = failures.every_client_waiting(me, n, self.stall_timeout,
                                              self.recorder.said_where())
      if self.stall_kill_all_waiting:
        self._fail(failure)
      else:
        logging.warning("%s", failure.reason.heartbeat_line())
        self._process.trace_event("every client waits", failure.reason.heartbeat_line())

  def late_for_collective(self, waited: float) -> None:
    """This client's collective gave up after `waited` s setting up with a
    client that never joined it: names the clients still in their set-up
    (never joined a collective), from the last beat, as the cause."""
    failure = failures.late_for_collective(self.client_id, self.clients("unjoined"),
                                           waited)
    if failure is not None:
      self._fail(failure)

  # -- what the watchdog finds ------------------------------------------------

  def _was_frozen(self, seconds: float) -> None:
    failure = failures.frozen(self.client_id, seconds, self.stuck_timeout)
    if failure is not None:
      self._fail(failure)
    else:
      logging.warning("%s", wording.paused(self.client_id, seconds, self.stuck_timeout))

  def _fail_missed(self, beat: int, waited: float, detail: str) -> None:
    """A beat did not complete within `waited` s: a roll call (every healthy
    client blocked in the same beat answers it within a moment) names the
    ones that do not answer."""
    present = self._store.roll_call(beat, ROLL_CALL_GRACE)
    self._fail(failures.missed(self.client_id, self.num_clients, beat, waited, detail,
                               present, self._process.clock() - self._last_beat,
                               self.departed))

  # -- failure ------------------------------------------------------------------

  def _fail(self, failure: Failure) -> None:
    """Records `failure` (`jdtensor.heartbeat.failures` says what it is),
    then applies the policy; a failure that is not the first is ignored."""
    recorded = self._record(failure)
    if recorded is not None:
      self._apply_policy(failure, *recorded)

  def _record(self, failure: Failure) -> tuple[PeerFailureError, Phase] | None:
    """The first verdict becomes this heartbeat's failure, worded for the
    phase it came in (`lifecycle.Lifecycle.record`)."""
    def error_for(before: Phase) -> PeerFailureError:
      # For a way out on another thread too: set before anyone sees the failure.
      self.culprit_grace = min(failure.culprit_wait, self._process.culprit_grace())
      return PeerFailureError(
          f"{failure.reason.heartbeat_line()}; "
          f"{wording.consequence(before is Phase.FINISHING, self.policy)}",
          failure.culprits)
    return self.life.record(error_for, self.policy == "terminate")

  def _apply_policy(self, failure: Failure, error: PeerFailureError, before: Phase
                    ) -> None:
    """Tells the others and the launcher (unless `Failure.told`; one that
    names this client as `Failure.public`), then under "terminate" (decided
    with the failure, once) says it and ends the process, even if the main
    thread starts leaving meanwhile; else logs it and stops beating."""
    reason = failure.reason
    self._process.trace_event("verdict", str(error))
    culprits = [c for c in error.client_ids if c != self.client_id]
    # Under "terminate" this client leaves at once: the launcher waits for it
    # to end by itself rather than stopping it.
    leaving = self.terminating
    if culprits:
      if not failure.told:
        self._peers.report(culprits, reason)
      self._process.tell_launcher(culprits, reason, leaving)
    elif failure.own:
      self._process.tell_launcher([self.client_id], failure.public or reason, leaving)
      if failure.public is not None:
        self._peers.report([self.client_id], failure.public)
    if self.terminating:
      # One plain line, certain to be seen, then exit without JAX's shutdown
      # barrier (it would wait for the failed client).
      sys.stderr.write(str(error) + "\n")
      sys.stderr.flush()
      self._show_stacks()
      self.said.set()
      # Client 0 does not wait for a culprit that may never end (stalled,
      # stopped); but one that announced its departure is on its way out:
      # ending the services under it would abort it from C++ (JAX's error
      # poll).
      wait_to_leave(self._peers, self.client_id, [] if failure.own else culprits,
                    self.culprit_grace,
                    spare=[c for c in error.client_ids if c not in self.leaving])
      self._process.trace_end()
      self._process.terminate(failure.exit_code)
      return
    logging.error("%s", error)
    self._show_stacks()
    if self.policy == "raise" and before in (Phase.RUNNING, Phase.ENDED):
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
    return phase, where, self.recorder.stacks()

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
    self._fail(failures.own_code_failed(self.client_id, error))

  # -- events from the liveness links -------------------------------------------

  def peer_died(self, client: int, how: str) -> None:
    """A liveness link saw `client`'s process end (no beat can succeed now)."""
    if self.stopped.is_set() and self.failure is None:
      return  # We already stopped by agreement; a late exit is not a failure.
    beat = None if self._exchange is None else self._exchanged + 1  # None: no beats.
    self._fail(failures.peer_died(client, how, beat, self._process.clock() - self._last_beat))

  def peer_reported(self, clients: list[int], reason: Reason) -> None:
    """Another client (`reason.reporter`) found `clients` failed (relayed by
    the liveness links)."""
    if self.stopped.is_set() and self.failure is None:
      return
    self._fail(failures.peer_reported(self.client_id, clients, reason))

  def peer_left(self, client: int, code: int, why: str, failure: bool,
                raised: bool = False) -> None:
    """A client announced it is leaving: with a failure (`raised`: an
    exception; else a non-zero exit code), or finished."""
    self.leaving.add(client)
    if not failure:
      self.departed[client] = self._process.clock()
      return
    self._fail(failures.peer_left(client, why, raised,
                                  still_running=self.life.phase is not Phase.FINISHING))

  def peer_notice(self, client: int, text: str) -> None:
    """Logs what another client said that is not a verdict."""
    logging.warning("client %d: %s", client, text)

  def service_up(self) -> None:
    """Start-up's news (`jdtensor.runtime.links.LinkEvents`): not the
    heartbeat's."""

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
    self.life.move("finish")
    self.recorder.at_exit = True
    if self._exchange is None:
      self.event.set()
    self._wake.set()

  def abandon(self) -> PeerFailureError | None:
    """This client is leaving with a failure: react to nothing any more.

    Returns:
      The failure recorded before, if any; a verdict after it is not acted
      on (`lifecycle.Lifecycle.abandon`).
    """
    failure = self.life.abandon()
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
      timeout = self.period + self.stuck_timeout + self._store.close_timeout
    return self.stopped.wait(timeout)
