"""DTensor's heartbeat service on JAX, and how a client leaves a run.

Every client exchanges DTensor's random token through a sum of every
client's row (an all-reduce) every `period` seconds, on a thread; when a
client dies, hangs, stalls, leaves early or restarts, the others notice
within a bounded time and every one of them names the same client and
reason (TF DTensor's heartbeat logs forever and never stops in its
open-source build).

The package: this module is the entry point (DTensor's ``start``, and how a
client leaves, below) and wires the parts together; `protocol` is the
protocol itself (the beat thread, the verdicts said, the policies:
`protocol.Heartbeat`, given the three small objects of `interfaces` and
`flight`'s recorder); `verdicts` decides what a merged beat means,
`failures` what a verdict or a peer's news means for this client, and
`wording` says it;
`watchdog` times the beats; `exchange` is the production
exchange on the liveness links; `flight` records what the main thread is
doing; `departure` reads how the process is leaving.

**Invisible to JAX.** XLA collectives on one device group are matched across
processes only by issue order, so a background all-reduce on devices that
user code also uses corrupts results or crashes gloo, and ``jax.thread_guard``
forbids any multi-process XLA program off the guarded thread. A beat
therefore runs no XLA program: it sums one row per client over the liveness
links (`exchange.LinkExchange`: client 0 adds the rows up and sends the sum
back), connections every client holds from the start-up handshake. The
user's ``jax.devices()``, ``jax.make_mesh``, ``multihost_utils``, ``pmap``
and orbax see exactly what raw ``jax.distributed`` shows.

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

**Leaving is announced** (`install_exit_guard`, `leave`): an unhandled
exception or a non-zero ``sys.exit`` is told to every client at once over the
liveness links; a normal end waits, still beating, for every client to end
(the agreed end), and is named "exited (code 0) while the others were still
running" if they wait for it in a collective. If JAX's shutdown barrier cannot
succeed, it is not entered (no C++ abort on the way out).


Configuration (`jdtensor._env.HeartbeatSettings`): ``DTENSOR_ENABLE_HEARTBEAT``
(default true) starts it from ``initialize_accelerator_system`` in multi-client
runs; ``JDTENSOR_HEARTBEAT_PERIOD``, ``JDTENSOR_HEARTBEAT_POLICY``,
``JDTENSOR_STUCK_TIMEOUT``, ``JDTENSOR_STALL_TIMEOUT``,
``JDTENSOR_STALL_KILL_ALL_WAITING``, ``JDTENSOR_STRAGGLER_THRESHOLD`` and
``JDTENSOR_STRAGGLER_WINDOW``. SIGUSR1 prints every thread's stack
(``faulthandler``); `dump_stacks` returns them.

**Stragglers and status** (`stragglers`, `jdtensor._status`): from the same
merged beats, every client keeps each client's share of the time the others
waited in collectives for it, names a straggler once (a warning, never a
kill), publishes its status while `jdtensor status` asks, and records the
run's shares at its normal end for the launcher's summary.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from jdtensor import _env, runtime
from jdtensor import _logging as logging
from jdtensor._report import Reason, Report, VerdictStack
from jdtensor.errors import PEER_FAILURE_EXIT_CODE, NotInitializedError, PeerFailureError
from jdtensor.heartbeat.departure import (Departure, ExitGuard, SystemExitWatch,
                                          describe_exception)
from jdtensor.heartbeat.exchange import LinkExchange, ack_every_for
from jdtensor.heartbeat.flight import MainThreadRecorder, format_stacks
from jdtensor.heartbeat.meetings import ServiceWaitWatch
from jdtensor.heartbeat.progress import ByteMeter
from jdtensor.heartbeat.interfaces import ProcessHooks
from jdtensor.heartbeat.failures import CULPRIT_EXIT_GRACE
from jdtensor.heartbeat.protocol import HOST_EXIT_WAIT, POLICIES, ROLL_CALL_GRACE, Heartbeat

# The contract (and the API reference). What jdtensor itself calls here
# (`start_with`, `install_exit_guard`, `leave`, `tell_launcher_start_failed`)
# is not: its users are `jdtensor.accelerator` and the exit guard.
__all__ = ["start", "current", "dump_stacks", "POLICIES"]

_lock = threading.Lock()
_current: Heartbeat | None = None


def current() -> Heartbeat | None:
  """The heartbeat started in this process, if any."""
  return _current


def _tell_launcher(report: Report) -> None:
  """Writes `report` where `jdtensor launch` reads it (``JDTENSOR_REPORT_DIR``):
  whom this client blames, or (a departure) that it left with a failure of
  its own: the launcher's root cause is the client that failed first, and
  client 0 leaves last on purpose."""
  directory = _env.read_report_dir()
  if not directory:
    return
  try:
    report.write(directory)
  except OSError:
    pass  # The launcher then falls back to exit codes and times.


def _departure_report(client_id: int, why: str, exception: str) -> Report:
  """This client left with a failure of its own: `why` as it said it, and
  the `exception` it raised ('' for an exit code)."""
  return Report(client_id, (client_id,), why, time.time(), departure=True,
                detail=exception)


def tell_launcher_start_failed(error: BaseException | None) -> None:
  """Under `jdtensor launch`: tells the launcher why this client's start-up
  failed (`error`), so that its summary gives the reason, not only the exit
  code; None (a start that succeeded) withdraws a report of an earlier try.

  The start-up fails before the exit guard that reports later failures is
  installed. The client id is the launcher's own ``DTENSOR_CLIENT_ID``; a
  child process that inherited it is not that client and reports nothing.
  """
  directory = _env.read_report_dir()
  raw = _env.process_environ().get(_env.DTENSOR_CLIENT_ID, "")
  if not directory or not raw.isdecimal() or _env.read_inherited_client() is not None:
    return
  if error is None:
    try:
      os.remove(os.path.join(directory, f"client-{int(raw)}.json"))
    except OSError:
      pass  # None was written.
    return
  exception = describe_exception(error)
  _tell_launcher(_departure_report(int(raw), f"failed: {exception}", exception))


class _ClientProcess(ProcessHooks):
  """This client's process: the real exit, the launcher's report, and the
  failure kept for the next jdtensor call (policy raise)."""

  def __init__(self, client_id: int, meter: ByteMeter | None = None):
    self.client_id = client_id
    self.report_dir = _env.read_report_dir()  # Under `jdtensor launch` only.
    self._meter = meter

  def bytes_moved(self, sockets: bool) -> int | None:
    return None if self._meter is None else self._meter.total(sockets)

  def tell_launcher(self, clients: list[int], reason: Reason, leaving: bool) -> None:
    _tell_launcher(Report(self.client_id, tuple(clients), reason.heartbeat_line(),
                          time.time(), leaving=leaving, detail=reason.detail,
                          subject=reason.subject, reporter=reason.reporter))

  def culprit_grace(self) -> float:
    return 0.0 if self.report_dir else CULPRIT_EXIT_GRACE

  # `jdtensor._status` is imported when used: only under `jdtensor launch`.
  def status_wanted(self) -> bool:
    if not self.report_dir:
      return False
    from jdtensor import _status  # pylint: disable=g-import-not-at-top
    return _status.status_requested(self.report_dir)

  def publish_status(self, record: dict[str, Any]) -> None:
    from jdtensor import _status  # pylint: disable=g-import-not-at-top
    try:
      _status.write_status(self.report_dir, self.client_id, {
          **record, "pid": os.getpid(), "at": time.time(), "rss_mib": _rss_mib(),
          "restarts": _env.read_restart_count()})
    except OSError:
      pass  # The launcher is gone, or its directory with it.

  def publish_waits(self, shares: list[float], seconds: float, period: float) -> None:
    if self.report_dir:
      from jdtensor import _status  # pylint: disable=g-import-not-at-top
      try:
        _status.write_waits(self.report_dir, self.client_id, shares, seconds, period)
      except OSError:
        pass

  def on_failure(self, error: PeerFailureError) -> None:
    runtime.record_peer_failure(error)

  def show_stacks(self, phase: int, where: str, stacks: str) -> None:
    from jdtensor import _status  # pylint: disable=g-import-not-at-top
    doing = _status.PHASE_NAMES.get(phase, "?")
    if self.report_dir:  # The launcher shows it under the verdict.
      try:
        VerdictStack(self.client_id, doing, where, stacks).write(self.report_dir)
        return
      except OSError:
        pass  # The launcher is gone: stderr, as under an engine.
    main = stacks.split("\nThread ", 1)[0]  # The main thread's comes first.
    sys.stderr.write(f"heartbeat: client {self.client_id}'s main thread when the "
                     f"verdict was named ({doing}): {where}\n{main}\n")
    sys.stderr.flush()


def _rss_mib() -> float | None:
  """This process's resident memory, MiB (Linux; None elsewhere)."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
  except (OSError, ValueError, IndexError):
    return None


def _live_arrays() -> Any:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.live_arrays()


def _running_event() -> threading.Event | None:
  """The running heartbeat's stop event (with DTensor's warning), if any."""
  if _current is not None and not _current.stopped.is_set():
    logging.warning("A heartbeat thread is already running, skipping this one.")
    return _current.event
  return None


def start(period: float, policy: str | None = None) -> threading.Event:
  """Starts the heartbeat (DTensor's ``heartbeat.start``).

  Every client must call it (jdtensor does so in
  `initialize_accelerator_system` when ``DTENSOR_ENABLE_HEARTBEAT`` is true).

  Args:
    period: Seconds between beats.
    policy: terminate, raise or log; default ``JDTENSOR_HEARTBEAT_POLICY``.

  Returns:
    An Event: set it to stop the heartbeat (on every client, after the same
    beat). A second call logs DTensor's warning and returns the running one.

  Raises:
    NotInitializedError: Outside an initialised multi-client run.
    ConfigError: For a bad period or policy.
    RuntimeError: If a heartbeat already ran in this process and stopped.
  """
  with _lock:
    running = _running_event()
  if running is not None:  # Before reading the arguments, as DTensor does.
    return running
  state = runtime.state()
  return start_with(_env.read_heartbeat_settings(
      period=period, policy=policy,
      coordination=state.timeouts.coordination if state.timeouts else None))


def start_with(settings: _env.HeartbeatSettings) -> threading.Event:
  """`start` with its settings already read and checked
  (`initialize_accelerator_system` reads them before the cluster forms, so
  that a bad value fails first); see `start`."""
  with _lock:
    running = _running_event()
    if running is not None:
      return running
    if _current is not None:
      raise RuntimeError(
          "The heartbeat already ran in this process and has stopped; it "
          "cannot be started again (its last beat was agreed with every "
          "client). Start it once per run.")
    return _start(settings)


def _start(settings: _env.HeartbeatSettings) -> threading.Event:
  """Starts this client's heartbeat (under `_lock`)."""
  global _current
  state = runtime.state()
  env = runtime.cluster()
  if not state.multi_client or state.links is None or env is None:
    raise NotInitializedError("The heartbeat needs an initialised multi-client "
                              "run (DTENSOR_JOBS with several clients).")
  meetings = ServiceWaitWatch()
  meetings.start()  # Before the loop's first barrier: see `meetings`.
  exchange = LinkExchange(env.client_id, env.num_clients, state.links,
                          ack_every=ack_every_for(settings.period, settings.stuck_timeout),
                          meetings=meetings)
  coordinator = env.coordinator_address or ""
  port = coordinator.rpartition(":")[2]
  meter = ByteMeter(state.links.descriptors, [int(port)] if port.isdecimal() else [])
  heartbeat = Heartbeat(settings, env.client_id, env.num_clients, exchange=exchange,
                        peers=state.links, process=_ClientProcess(env.client_id, meter),
                        recorder=MainThreadRecorder(env.num_clients, _live_arrays))
  # The first exchange runs on the heartbeat thread, off the caller's
  # critical path.
  heartbeat.start_threads()
  state.links.watch(heartbeat)
  _current = heartbeat
  return heartbeat.event


def _my_id() -> int:
  cluster = runtime.cluster()
  return cluster.client_id if cluster is not None else -1


def blame_peer(departure: Departure) -> Departure:
  """Decides whether the failed `departure` is this client's own or a
  consequence of another client that the heartbeat has named.

  A collective's error about a connection to another client that went away
  (``peer_lost``) first waits briefly for the heartbeat to name that client
  (the liveness links see a process end at once; a missed beat takes up to
  two periods). Any other failure only checks whether a verdict under
  "terminate" came first: its thread is then already ending this process
  (code 75), and this client leaves as its consequence.

  The decision is taken with the heartbeat's own (`Heartbeat.abandon`): a
  verdict that comes after it is not acted on, so the process never both
  announces its own failure and ends on someone else's.

  Returns:
    A consequence departure (code 75) naming the verdict, or `departure`
    unchanged when the failure is this client's own.
  """
  hb = _current
  if hb is None or hb.exiting is not None:
    return departure
  me = _my_id()
  if departure.peer_lost:
    if departure.join_wait is not None:
      # Nobody else can name a client that never reached the collective: it
      # is alive and beating. Every waiter names it from the same beats.
      hb.late_for_collective(departure.join_wait)
    hb.stopped.wait(min(2 * hb.period + ROLL_CALL_GRACE, HOST_EXIT_WAIT))
  failure = hb.abandon()
  culprits = [] if failure is None else [c for c in failure.client_ids if c != me]
  if not culprits or not (departure.peer_lost or hb.terminating):
    return departure
  return Departure(PEER_FAILURE_EXIT_CODE, f"{departure.why}, after {failure}", True,
                   peer_lost=departure.peer_lost, consequence=True)


def leave(departure: Departure) -> bool:
  """This client's way out (the exit handler calls it).

  A failure is announced to every client at once and nothing collective is
  attempted. A normal end beats "at exit" until every client has ended (the
  agreed end, then the exchange's teardown), bounded by
  the shutdown time-out.

  Returns:
    Whether JAX's own shutdown barrier can still succeed.
  """
  state = runtime.state()
  links = state.links
  hb = _current
  me = _my_id()
  if departure.failed:
    if hb is not None:
      hb.abandon()
    if departure.consequence:
      # The heartbeat has told everyone (and the launcher) whom it blames;
      # under "terminate" it says so here too: each thing is said once. Its
      # verdict may be on its way out on another thread (the links'), which
      # this exit would cut short: wait for the line, or say it here.
      if hb is None or not hb.terminating or not hb.said.wait(HOST_EXIT_WAIT):
        sys.stderr.write(f"jdtensor: client {me} {departure.why}\n")
      failure = None if hb is None else hb.failure
      culprits = [] if failure is None else [c for c in failure.client_ids if c != me]
      if (culprits and links is not None and hb is not None and hb.culprit_wait > 0
          and not _env.read_report_dir()):
        sys.stderr.flush()
        # See `_ClientProcess.culprit_grace`.
        links.wait_ended(culprits, min(hb.culprit_wait, CULPRIT_EXIT_GRACE))
    else:
      if links is not None:
        links.announce_departure(departure.code, departure.why, True,
                                 raised=bool(departure.exception))
      _tell_launcher(_departure_report(me, departure.why, departure.exception))
      sys.stderr.write(f"jdtensor: client {me} {departure.why}; the other clients "
                       "have been told.\n")
    sys.stderr.flush()
    if me == 0 and links is not None:
      # Client 0 hosts the coordination service: ending it now would abort
      # clients still on their own way out inside JAX (a C++ fatal error)
      # before their exit code and reason are out. Bounded: a client that
      # does not leave is ended by JAX when the service goes.
      links.wait_peers_gone(HOST_EXIT_WAIT)
    return False
  if links is not None:
    links.announce_departure(0, departure.why, False)
  directory = _env.read_report_dir()
  if directory:
    from jdtensor._report import mark_finished  # pylint: disable=g-import-not-at-top
    mark_finished(directory, me)
  if hb is None:
    return state.peer_failure is None
  if hb.failure is not None or hb.stopped.is_set():
    return hb.failure is None and hb.closed_cleanly is not False
  hb.finish()
  if not _wait_for_the_agreed_end(hb, state.timeouts.shutdown, me):
    return False
  return hb.failure is None and hb.closed_cleanly is not False


def _wait_for_the_agreed_end(hb: Heartbeat, patience: float, me: int) -> bool:
  """Waits until the heartbeat has ended (the agreed end and its teardown, or
  a verdict); False if its thread is gone without ending it.

  Late is not dead: a client that finishes long after the others (a final
  save) is waited for as long as it is alive and beating; past `patience`
  (the shutdown time-out) this client says once whom it waits for.
  """
  if hb.stopped.wait(patience):
    return True
  others = [c for c in hb.clients("running") or () if c != me]
  logging.warning("jdtensor: client %d ended its script; waiting for client%s %s, "
                  "still running and beating, to end theirs.", me,
                  "s" if len(others) != 1 else "", ", ".join(map(str, others)) or "?")
  while not hb.stopped.wait(hb.period):
    # The thread sets `stopped` before it ends: one that ended between the
    # wait and this check has ended the heartbeat (a client that took this
    # for a lost heartbeat would skip JAX's shutdown barrier, and the others'
    # barrier would abort them).
    if not hb.running() and not hb.stopped.is_set():
      return False
  return True


_guard: ExitGuard | None = None


def install_exit_guard(at_clean_end: Callable[[], None] | None = None) -> None:
  """Installs this client's exit hooks (multi-client runs; once).

  Args:
    at_clean_end: Called when this client ends cleanly, before JAX's own exit
      handler (see `ExitGuard`).
  """
  global _guard
  from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
  with _lock:
    if _guard is not None:
      return
    links = runtime.state().links

    def thread_died(text: str) -> None:
      logging.warning("jdtensor: %s", text)
      if links is not None:
        links.notice(text)
    _guard = ExitGuard(leave, jax_private.detach_from_jax_shutdown, thread_died,
                       blame_peer, at_clean_end=at_clean_end,
                       exit_watch=SystemExitWatch())
    _guard.install()
    _install_stack_dump_signal()


def _install_stack_dump_signal() -> None:
  """SIGUSR1 prints every thread's stack (the launcher forwards its own)."""
  try:
    # Only where nobody else handles it (None: a handler installed from C).
    if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, signal.SIG_IGN):
      faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
  except (ValueError, OSError, AttributeError, RuntimeError):
    pass  # Not the main thread, or no SIGUSR1 on this platform.


def dump_stacks(file: IO[str] | None = None) -> str:
  """This client's threads' Python stacks, the main thread first.

  Args:
    file: Where to write them too (e.g. ``sys.stderr``); None writes nothing.

  Returns:
    The text.
  """
  text = format_stacks()
  if file is not None:
    file.write(text + "\n")
    file.flush()
  return text
