"""This client's process as the heartbeat and the way out use it: the
launcher's report, the status it asks for, the failure kept for the next
jdtensor call, where the stacks go at a verdict, and the exit hooks that
take the process out by `jdtensor.heartbeat.leaving.WayOut`.

The real `jdtensor.heartbeat.interfaces.ProcessHooks`; a test gives
`protocol.Heartbeat` and `leaving.WayOut` a fake of a few lines instead.
Everything the launcher reads goes through ``JDTENSOR_REPORT_DIR``
(`jdtensor._report`): the launcher's root cause is the client that failed
first, so a client tells it whom it blames, or that it left with a failure of
its own.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from jdtensor import _env, _trace, runtime
from jdtensor import _logging as logging
from jdtensor._report import Reason, Report, VerdictStack, mark_finished
from jdtensor.errors import PeerFailureError
from jdtensor.heartbeat.departure import ExitGuard, SystemExitWatch, describe_exception
from jdtensor.heartbeat.failures import CULPRIT_EXIT_GRACE
from jdtensor.heartbeat.flight import RUNNING, WAITING
from jdtensor.heartbeat.interfaces import ProcessHooks
from jdtensor.heartbeat.leaving import LeavingHeartbeat, WayOut
from jdtensor.heartbeat.progress import ByteMeter

__all__ = ["ClientProcess", "tell_launcher_start_failed", "install_exit_guard"]

_lock = threading.Lock()
_guard: ExitGuard | None = None


def _write_report(report: Report) -> None:
  """Writes `report` where `jdtensor launch` reads it (nowhere outside it)."""
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
  _write_report(_departure_report(int(raw), f"failed: {exception}", exception))


def _rss_mib() -> float | None:
  """This process's resident memory, MiB (Linux; None elsewhere)."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
  except (OSError, ValueError, IndexError):
    return None


class ClientProcess(ProcessHooks):
  """This client's process: the real exit, the launcher's reports, and the
  failure kept for the next jdtensor call (policy raise).

  Args:
    client_id: This client's id.
    meter: Counts the bytes the process moves (`ByteMeter`); None: not
      measured.
  """

  def __init__(self, client_id: int, meter: ByteMeter | None = None):
    self.client_id = client_id
    self.report_dir = _env.read_report_dir()  # Under `jdtensor launch` only.
    self._meter = meter
    self.trace_dir = _env.read_trace_dir()
    self.tracing = bool(self.trace_dir)
    self._trace: _trace.PhaseSlices | None = None
    self._trace_lock = threading.Lock()

  def _trace_meta(self) -> dict[str, Any]:
    """Who this track is, for `jdtensor._trace.track_metadata`."""
    return {"client": self.client_id, "host": socket.gethostname(), "pid": os.getpid(),
            "restart": _env.read_restart_count()}

  def trace_open(self, thread: str = "main thread") -> None:
    pid = os.getpid()
    assert self.trace_dir is not None
    try:
      out = _trace.TraceFile(
          os.path.join(self.trace_dir, f"client-{self.client_id}-{pid}.json"), pid,
          f"client {self.client_id} ({socket.gethostname()}, pid {pid})",
          sort_index=self.client_id, metadata=self._trace_meta(), thread=thread)
    except OSError as e:
      self.tracing = False
      sys.stderr.write(f"jdtensor: client {self.client_id} cannot write its trace in "
                       f"{self.trace_dir} ({e.strerror}); the run goes on without it.\n")
      return
    with self._trace_lock:
      self._trace = _trace.PhaseSlices(out)

  def trace_begin(self, offset: float, residual: float) -> None:
    # A residual of NaN: client 0 never answered, and the offset is 0.
    clock: dict[str, Any] = {"clock_offset_s": offset}
    if residual == residual:
      clock["clock_residual_s"] = residual
    label = (f"clock: client 0's, within {residual * 1e3:.2f} ms" if residual == residual
             else "clock: its own (client 0 did not answer)")
    with self._trace_lock:
      if self._trace is not None:
        self._trace.out.offset = offset
        self._trace.out.labels(label, clock)

  def trace_beat(self, phase: int, seconds: float, joined: bool, busy: float,
                 service_wait: bool = False) -> None:
    with self._trace_lock:
      if self._trace is None:
        return
      now = time.time()
      if not joined and phase == RUNNING:
        name = _trace.SET_UP
      elif service_wait and phase == WAITING:
        name = _trace.SERVICE_WAIT
      else:
        name = _trace.PHASE_SLICE_NAMES.get(phase, "?")
      self._trace.sample(now, name, seconds)
      rss = _rss_mib()
      self._trace.counters(now, {"cpu %": busy, **({} if rss is None else {"rss MiB": rss})})

  def trace_event(self, name: str, text: str) -> None:
    with self._trace_lock:
      if self._trace is not None:
        self._trace.out.instant(name, time.time(), {"text": text})

  def trace_end(self) -> None:
    with self._trace_lock:
      if self._trace is not None:
        self._trace.end(time.time())
        self._trace.out.close()
        self._trace = None

  def bytes_moved(self, sockets: bool) -> int | None:
    return None if self._meter is None else self._meter.total(sockets)

  def tell_launcher(self, clients: list[int], reason: Reason, leaving: bool) -> None:
    _write_report(Report(self.client_id, tuple(clients), reason.heartbeat_line(),
                         time.time(), leaving=leaving, detail=reason.detail,
                         subject=reason.subject, reporter=reason.reporter))

  def tell_launcher_left(self, why: str, exception: str) -> None:
    _write_report(_departure_report(self.client_id, why, exception))

  def tell_launcher_finished(self) -> None:
    if self.report_dir:
      mark_finished(self.report_dir, self.client_id)

  def culprit_grace(self) -> float:
    # Under `jdtensor launch` the launcher names the root cause; under an
    # engine (mpirun, srun) the first process to fail is the one it names.
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


def _way_out(heartbeat: Callable[[], LeavingHeartbeat | None]) -> WayOut:
  """This client's way out, as the runtime is now (read at exit: the
  heartbeat may start, and the runtime shut down and start again, after the
  guard is installed)."""
  state, cluster = runtime.state(), runtime.cluster()
  me = cluster.client_id if cluster is not None else -1
  return WayOut(me, heartbeat, **({"peers": state.links} if state.links is not None else {}),
                process=ClientProcess(me),
                shutdown_timeout=state.timeouts.shutdown if state.timeouts else 300.0,
                no_peer_failure=lambda: state.peer_failure is None)


def install_exit_guard(heartbeat: Callable[[], LeavingHeartbeat | None],
                       at_clean_end: Callable[[], None] | None = None) -> None:
  """Installs this client's exit hooks (multi-client runs; once): its way out
  is `jdtensor.heartbeat.leaving.WayOut`.

  Args:
    heartbeat: Returns this client's heartbeat, if one runs (read at exit).
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
    _guard = ExitGuard(lambda departure: _way_out(heartbeat).leave(departure),
                       jax_private.detach_from_jax_shutdown, thread_died,
                       lambda departure: _way_out(heartbeat).blame_peer(departure),
                       at_clean_end=at_clean_end, exit_watch=SystemExitWatch())
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
