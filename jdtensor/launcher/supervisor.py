"""One node's clients, supervised for one attempt: the poll loop and signals.

PURE of JAX: the parent only spawns and watches processes. `run_attempt` runs
one attempt of one node's clients to its end (see `jdtensor.launcher` for what
the clients get and how a failure ends the others); `jdtensor.launcher.nodes`
drives several attempts and several nodes on top of it. The pieces: the
types and the clients' environment (`spec`), their processes (`processes`),
their output (`output`); the root cause is `jdtensor._report`'s, a pure
function of what the clients wrote and how they ended.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, NamedTuple

from jdtensor import _env, _status
from jdtensor._ids import ids_text
from jdtensor._report import (ClientEnd, Report, VerdictStack, describe_exit,
                              finished_clients, first_steps, root_cause, stack_lines,
                              summary)
from jdtensor.errors import LAUNCH_TIMEOUT_EXIT_CODE, PEER_FAILURE_EXIT_CODE
from jdtensor.launcher.output import ClientLog, Output
from jdtensor.launcher.processes import (Orphans, ask_starting_clients, frozen_groups,
                                         signal_groups, stop_escaped,
                                         stop_process_groups, why_it_cannot_start,
                                         wrapped)
from jdtensor.launcher.spec import (Attempt, NodeFailure, Interrupt,
                                    LaunchResult, LaunchSpec, worker_env)

__all__ = ["Signals", "run_attempt"]

_POLL_SECONDS = 0.05
# Seconds between SIGTERM and SIGKILL for a process a client left behind
# outside its group once every client has ended (a forked worker inherits
# JAX's SIGTERM handler, which only records a preemption notice).
ESCAPED_GRACE = 1.0
# Linux's limits on a new process's environment (MAX_ARG_STRLEN, one
# variable; and a quarter of the default 8 MiB stack for all of them).
_MAX_ARG_STRLEN = 128 * 1024
_MAX_ARGS_ENV = 2 * 1024 * 1024
_STACK_DUMP_SECONDS = 2.0
# How long, after a client failed, its peers' reports may take to arrive.
_REPORT_SECONDS = 0.5
# How long the clients still running may take to show where they were at a
# verdict (they write it as they name it); one that has not by then cannot
# answer (stopped, or its interpreter held by C code).
_VERDICT_STACK_SECONDS = 1.0


class _End(NamedTuple):
  """How an attempt ends, as the watching loop found it.

  Attributes:
    why: What the summary names (the root cause's text, a signal, a time-out,
      another node's failure); None when every client exited 0.
    exit_code: What the launcher exits with.
    root_cause: The client of this node that failed by itself, if one did.
    failed_at: When the run failed without a client's failure (a time-out).
  """
  why: str | None = None
  exit_code: int = 0
  root_cause: NodeFailure | None = None
  failed_at: float | None = None


class _Supervisor:
  """Starts, watches and stops one node's clients for one attempt.

  Args:
    spec: What to launch.
    out, err: Where the clients' tagged output goes.
    base_env: The clients' base environment.
    attempt: The clients' ids, the group's jobs and secret.
    interrupt: Set by the launcher's signal handlers.
    stop_request: Polled while the clients run: a reason to stop them all
      (another node failed), or None.
    on_failure: Told at once when a local client fails (before the others
      are stopped), so that other nodes stop too.
    timeout_at: Polled while the clients run, in place of `spec.timeout`:
      (the monotonic time the run times out at, the time-out in seconds to
      name), or None for no time-out now (`jdtensor.testing`'s warm
      clusters: each test has its own).
  """

  def __init__(self, spec: LaunchSpec, out: IO[str], err: IO[str],
               base_env: Mapping[str, str], attempt: Attempt,
               interrupt: Interrupt | None = None,
               stop_request: Callable[[], str | None] | None = None,
               on_failure: Callable[[NodeFailure], None] | None = None,
               started: float | None = None,
               timeout_at: Callable[[], tuple[float, float] | None] | None = None):
    self.spec = spec
    self.attempt = attempt
    self.ids = list(attempt.client_ids)
    self.base_env = base_env
    self.report_dir = tempfile.mkdtemp(prefix="jdtensor-launch-")
    self.registration: str | None = None
    self.started = started if started is not None else time.time()
    self.exit_times: dict[int, float] = {}  # Monotonic, by local index.
    self.exit_wall: dict[int, float] = {}
    self.output = Output(out, err)
    self.procs: list[subprocess.Popen[bytes]] = []
    self.readers: list[threading.Thread] = []
    self.interrupt = interrupt or Interrupt()
    self.stop_request = stop_request or (lambda: None)
    self.on_failure = on_failure or (lambda failure: None)
    self.killed: list[int] = []  # Clients SIGKILLed after the grace.
    self.frozen: list[int] = []  # Clients SIGKILLed at once: frozen (SIGSTOP).
    self.stopped: list[int] = []  # Clients the stop ended (see `summary`).
    self.cut_short: str | None = None  # Why the last stop's grace was cut short.
    self.logs: dict[int, ClientLog] = {}  # By client id, with --log-dir.
    # Lines under the summary: each client's main thread at the verdict.
    self.stack_lines: list[str] = []
    self.timeout_at = timeout_at
    # When every client of this node said it completed its first step.
    self.first_step_at: float | None = None
    self.orphans = Orphans()  # What it adopts (`Signals`: the main thread's).

  def own_pids(self) -> set[int]:
    """The clients' processes not yet reaped (never the orphans')."""
    return {p.pid for p in self.procs if p.returncode is None}

  def start(self) -> None:
    # `jdtensor status` finds the run here (this user's, this machine's).
    self.registration = _status.register_run({
        "pid": os.getpid(), "started": self.started, "command": list(self.spec.command),
        "num_clients": len(self.attempt.jobs), "client_ids": self.ids,
        "node_rank": self.spec.node_rank, "restarts": self.attempt.restart_count,
        "report_dir": self.report_dir})
    for client in self.ids:
      env = worker_env(self.spec, client, [], self.base_env, self.attempt)
      env[_env.JDTENSOR_REPORT_DIR] = self.report_dir
      self.procs.append(subprocess.Popen(
          wrapped(self.spec.command), env=env,
          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
          start_new_session=True))
    for client, proc in zip(self.ids, self.procs):
      log = None
      if self.spec.log_dir is not None:
        log = self.logs[client] = ClientLog(
            self.log_path(client),
            f"==== jdtensor launch: client {client}, attempt "
            f"{self.attempt.restart_count + 1}, pid {proc.pid}, "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} ====",
            on_failure=functools.partial(self._log_failed, client))
      console = not (self.spec.log_only and log is not None)
      for pipe, sink in ((proc.stdout, self.output.out), (proc.stderr, self.output.err)):
        t = threading.Thread(target=self.output.pump,
                             args=(client, pipe, sink if console else None, log, sink),
                             daemon=True)
        t.start()
        self.readers.append(t)

  def _log_failed(self, client: int, log: ClientLog) -> None:
    """Said once on the console, by the pump whose write failed first."""
    where = ("goes to the console instead" if self.spec.log_only
             else "is on the console only")
    self.output.line(f"jdtensor launch: cannot write client {client}'s log {log.path} "
                     f"{log.failed}: its output from then on {where}")

  def log_path(self, client: int) -> str:
    """Client `client`'s log file (with --log-dir)."""
    assert self.spec.log_dir is not None
    return os.path.join(self.spec.log_dir, f"client-{client}.log")

  def _signal_all(self, sig: int) -> None:
    signal_groups(self.procs, sig)

  def stop_all(self) -> list[int]:
    """SIGTERM, grace, SIGKILL (at once for a stopped client: `frozen`);
    returns the ids of the clients stopped: the ones still running, less
    those that had already ended their script normally (waiting at exit for
    the others: the stop ended no work)."""
    killed: list[int] = []
    frozen: list[int] = []
    # Read before the stop: a client that ends its script because of it (a
    # preemption save, then a normal end) was stopped.
    finished = finished_clients(self.report_dir)
    signals_before = self.interrupt.count
    running = stop_process_groups(self.procs, self.spec.grace, killed,
                                  cut_short=lambda: self._cut_short(signals_before),
                                  frozen=frozen)
    self.killed += [self.ids[i] for i in killed]
    self.frozen += [self.ids[i] for i in frozen]
    return [self.ids[i] for i in running if self.ids[i] not in finished]

  def _cut_short(self, signals_before: int) -> bool:
    """Whether a stop signal came during the stop (a second Ctrl-C, or a
    first one during a failure's stop): the grace ends, SIGKILL now."""
    if self.interrupt.count <= signals_before:
      return False
    if self.cut_short is None:
      assert self.interrupt.signal is not None
      name = signal.Signals(self.interrupt.signal).name
      self.cut_short = f"{name} again" if signals_before else name
      self.output.line(f"jdtensor launch: received {self.cut_short}: killing the "
                       "clients now (SIGKILL)")
    return True

  def _say_stopping(self, signum: int) -> None:
    """The first stop signal's notice: what happens, how long it may take,
    and how to cut it short."""
    running = [self.ids[i] for i, p in enumerate(self.procs) if p.poll() is None]
    if not running or self.interrupt.urgent:
      return
    name = signal.Signals(signum).name
    again = "press Ctrl-C again" if signum == signal.SIGINT else f"send {name} again"
    self.output.line(
        f"jdtensor launch: received {name}: stopping client"
        f"{'s' if len(running) > 1 else ''} {ids_text(running)} (SIGTERM, then "
        f"SIGKILL after {self.spec.grace:g} s); {again} to kill them now")

  def summary(self, what: str, stopped: Sequence[int], also: Sequence[str] = ()) -> str:
    """The summary line of this attempt (`jdtensor._report.summary`); the
    stopped clients are remembered for the nodes' own summary."""
    self.stopped = list(stopped)
    return summary(what, stopped, also=also, killed=self.killed, grace=self.spec.grace,
                   cut_short=self.cut_short, frozen=self.frozen)

  def _poll(self) -> list[int | None]:
    codes = [p.poll() for p in self.procs]
    now = time.monotonic()
    for i, code in enumerate(codes):
      if code is not None and i not in self.exit_times:
        self.exit_times[i] = now
        self.exit_wall[i] = time.time()
        # Nothing the client started outlives it (a helper, a forked child it
        # did not wait for): its process group goes with it.
        try:
          os.killpg(self.procs[i].pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
          pass
    return codes

  def reports(self) -> dict[int, Report]:
    """What the clients wrote, by client id (`jdtensor._report`)."""
    return Report.read_all(self.report_dir)

  def _settle(self, codes: list[int | None]) -> list[int | None]:
    """Before stopping everyone, waits briefly (at most 3 s) for clients that
    are ending by themselves to end with their own code: one that reported
    its own failure, or a verdict it leaves on (policy terminate), and is on
    its way out (client 0 leaves last); while only consequences (75) have
    failed, the root cause. The clients' reports get a moment
    (`_REPORT_SECONDS`) to arrive: a survivor's heartbeat names a killed
    client within milliseconds, but the launcher may see the death first.
    A frozen client (SIGSTOP) cannot end by itself: not waited for."""
    start = time.monotonic()
    deadline = start + min(self.spec.grace, 3.0)
    first_look = start + min(self.spec.grace, _REPORT_SECONDS)
    frozen: list[int] | None = None  # Looked at once, at the first look.
    while time.monotonic() < deadline:
      if all(c is not None for c in codes):
        break
      reports = self.reports()
      leaving = [i for i, c in enumerate(codes) if c is None and self.ids[i] in reports
                 and reports[self.ids[i]].on_its_way_out]
      cause_missing = all(c in (None, 0, PEER_FAILURE_EXIT_CODE) for c in codes)
      if not leaving and time.monotonic() >= first_look:
        if not cause_missing:
          break
        if frozen is None:
          frozen = frozen_groups(self.procs)
        if all(c is not None or i in frozen for i, c in enumerate(codes)):
          break
      time.sleep(_POLL_SECONDS)
      codes = self._poll()
    return codes

  def _root_cause(self, codes: list[int | None]) -> tuple[NodeFailure, int]:
    """The root cause among this node's clients, and the exit code
    (`jdtensor._report.root_cause`)."""
    ends = [ClientEnd(self.ids[i], code, self.exit_wall.get(i))
            for i, code in enumerate(codes)]
    cause = root_cause(ends, self.reports())
    assert cause is not None  # Only called once a client failed.
    return NodeFailure(cause.client, cause.what, cause.own, cause.at), cause.exit_code

  def run(self) -> LaunchResult:
    """Watches the clients until the attempt ends, then ends it (`_end`)."""
    return self._end(self._watch())

  def _watch(self) -> _End:
    """The watching loop: polls the clients, the signals, the nodes and the
    clock until something ends the attempt, and says what (nothing is
    stopped here)."""
    timeout_at = self.timeout_at
    if timeout_at is None:
      limit = self.spec.timeout
      at = None if limit is None else time.monotonic() + limit
      timeout_at = lambda: None if at is None else (at, limit)  # noqa: E731
    while True:
      codes = self._poll()
      self.orphans.reap()
      if self.first_step_at is None:
        self.first_step_at = first_steps(self.report_dir, self.ids)
      if self.interrupt.suspend_refused:
        self.interrupt.suspend_refused = False
        self.output.line(
            "jdtensor launch: Ctrl-Z ignored: the clients run on (paused for "
            "longer than the heartbeat's stuck time-out, they would count "
            "themselves stuck); Ctrl-C stops the run")
      if self.interrupt.signal is not None:
        self._say_stopping(self.interrupt.signal)
        name = signal.Signals(self.interrupt.signal).name
        return _End(f"received {name}", 128 + self.interrupt.signal)
      if any(c not in (None, 0) for c in codes):
        codes = self._settle(codes)
        failure, exit_code = self._root_cause(codes)
        self._collect_verdict_stacks(failure.client)
        self.on_failure(failure)
        return _End(failure.what, exit_code, root_cause=failure)
      if all(c == 0 for c in codes):
        return _End()
      if self.output.closed:
        return _End("its output was closed (the reader of its pipe exited)",
                    128 + signal.SIGPIPE)
      why = self.stop_request()
      if why is not None:
        return _End(why, PEER_FAILURE_EXIT_CODE)
      timeout = timeout_at()
      if timeout is not None and time.monotonic() > timeout[0]:
        self._dump_stacks_before_stopping()
        what, at = f"timed out after {timeout[1]:g} s", time.time()
        self.on_failure(NodeFailure(None, what, True, at))
        return _End(what, LAUNCH_TIMEOUT_EXIT_CODE, failed_at=at)
      time.sleep(_POLL_SECONDS)

  def _end(self, end: _End) -> LaunchResult:
    """The one way an attempt ends: stops every client still running (not
    the root cause, on its own way out: client 0 leaves last), words the
    summary, waits for the clients' output, and builds the result."""
    reason = ""
    if end.why is not None:
      root = end.root_cause
      # The root cause is stopped too where the stop ended it: it was not on
      # its own way out (a frozen client, one named by the others).
      leaving = {c for c, r in self.reports().items() if r.on_its_way_out}
      stopped = [c for c in self.stop_all()
                 if root is None or c != root.client or c not in leaving]
      reason = self.summary(self._subject(end), stopped,
                            self._also(root, self._poll(), stopped) if root else ())
    self._stop_escaped_output_holders()
    for t in self.readers:
      t.join(timeout=5)
    self._poll()
    if self.first_step_at is None:  # Said just before the clients ended.
      self.first_step_at = first_steps(self.report_dir, self.ids)
    root = end.root_cause
    return LaunchResult(
        returncodes=[p.poll() for p in self.procs], pids=[p.pid for p in self.procs],
        first_failure=None if root is None else root.client, reason=reason,
        cause="" if root is None else root.what,
        exit_code=end.exit_code,
        ended_at=[self.exit_wall.get(i) for i in range(len(self.procs))],
        client_ids=list(self.ids), own_failure=root is not None and root.own,
        failed_at=root.at if root is not None else end.failed_at,
        stopped=list(self.stopped), killed=list(self.killed), frozen=list(self.frozen),
        verdict_stacks=list(self.stack_lines), started_at=self.started,
        first_step_at=self.first_step_at)

  def _subject(self, end: _End) -> str:
    """What the summary says ended the attempt; for a client's failure, with
    where its log is (--log-dir)."""
    root = end.root_cause
    if root is None or root.client not in self.logs:
      return end.why or ""
    log = self.logs.get(root.client)
    if log is not None and log.failed is not None:
      return (f"{end.why} (its log, {self.log_path(root.client)}, could not be "
              f"written {log.failed}: see the console)")
    return f"{end.why} (its log: {self.log_path(root.client)})"

  def _also(self, root: NodeFailure, codes: list[int | None],
            stopped: Sequence[int]) -> list[str]:
    """The other clients that failed by themselves, in the order they ended."""
    return [f"client {self.ids[c]} {describe_exit(k)}"
            for c, k in sorted(((i, k) for i, k in enumerate(codes)
                                if k not in (None, 0) and self.ids[i] != root.client
                                and self.ids[i] not in stopped),
                               key=lambda f: self.exit_times.get(f[0], 0.0))]

  def _stop_escaped_output_holders(self) -> None:
    """Every client has ended, but a client's output is still open: a process
    it started outside its process group (a data loader's worker that called
    ``setsid()``) holds it. Stopped now (`ESCAPED_GRACE`), so that the run
    ends with its clients rather than after the readers' time-out."""
    for t in self.readers:
      t.join(timeout=0.1)
    if any(t.is_alive() for t in self.readers):
      stop_escaped(_env.JDTENSOR_REPORT_DIR, self.report_dir,
                   min(self.spec.grace, ESCAPED_GRACE))
      self.orphans.stop(min(self.spec.grace, ESCAPED_GRACE))

  def _collect_verdict_stacks(self, root: int | None = None) -> list[int | None]:
    """Where each client was when its heartbeat named the verdict: waits up
    to `_VERDICT_STACK_SECONDS` for those still running (none, if no client
    shows one within `_REPORT_SECONDS`: no heartbeat, no verdict), and asks
    the root cause `root` if it is still in its start-up; keeps the lines
    for under the summary and writes every thread's stack into each
    client's log (--log-dir). Returns the exit codes now."""
    start = time.monotonic()
    while True:  # Names only while waiting; the records are read once.
      codes = self._poll()
      answered = VerdictStack.answered(self.report_dir)
      silent = [i for i, c in enumerate(codes) if c is None and self.ids[i] not in answered]
      waited = time.monotonic() - start
      if (not silent or waited >= _VERDICT_STACK_SECONDS
          or (not answered and waited >= _REPORT_SECONDS)):
        break
      time.sleep(_POLL_SECONDS)
    stacks = VerdictStack.read_all(self.report_dir) if answered else {}
    # A root cause still in its start-up has no heartbeat to answer for it:
    # it is asked (client 0 whose JAX coordination service never came up).
    stacks.update(ask_starting_clients(
        self.report_dir, {self.ids[i]: self.procs[i].pid for i, c in enumerate(codes)
                          if c is None and self.ids[i] == root and root not in stacks},
        _REPORT_SECONDS))
    if not stacks:
      return codes
    ended = {self.ids[i]: c for i, c in enumerate(codes) if c is not None}
    self.stack_lines = stack_lines(self.ids, stacks, ended,
                                   self.spec.node_rank if self.spec.nnodes > 1 else None)
    for client, record in stacks.items():
      log = self.logs.get(client)
      if log is not None and record.stacks:
        log.write("==== jdtensor launch: every thread's stack when the verdict was "
                  f"named ====\n{record.stacks}\n")
    return codes

  def dump_stacks(self) -> None:
    """Forwards SIGUSR1: every jdtensor client prints its threads' stacks."""
    self._signal_all(signal.SIGUSR1)

  def _dump_stacks_before_stopping(self) -> None:
    """On time-out, where each client still running was: its stacks, read
    until its output goes quiet (at most `_STACK_DUMP_SECONDS`)."""
    asked = time.monotonic()
    self.dump_stacks()
    while time.monotonic() < asked + _STACK_DUMP_SECONDS:
      now = time.monotonic()
      if self.output.last_output > asked and now - self.output.last_output > 0.2:
        break  # The dumps came, and the output has gone quiet.
      if self.output.last_output <= asked and now - asked > 0.5:
        break  # Nothing came: not jdtensor clients, or stopped ones.
      time.sleep(_POLL_SECONDS)


# What a terminal, a dropped ssh session or a scheduler sends to stop a job;
# each stops the run the same way (torchrun's set).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Signals:
  """The launcher's handlers, installed from the main thread only, and
  restored afterwards: `STOP_SIGNALS` stop every client (SIGTERM, the grace,
  SIGKILL; a second one kills at once), SIGUSR1 is forwarded (every client
  prints its stacks), and SIGTSTP (Ctrl-Z) is refused with a notice: the
  launcher stays in charge of running clients."""

  def __init__(self, interrupt: Interrupt):
    self.interrupt = interrupt
    self.current: _Supervisor | None = None
    self._previous: dict[int, Any] = {}
    self.orphans = Orphans(
        lambda: set() if self.current is None else self.current.own_pids())

  def __enter__(self) -> Signals:
    if threading.current_thread() is threading.main_thread():
      # The process is the launcher's (its main thread runs it): it reaps
      # and stops its clients' orphans (off the main thread, the process is
      # someone else's, whose children it cannot tell from theirs).
      self.orphans.adopt()
      def on_signal(signum: int, _frame: object) -> None:
        self.interrupt.received(signum)

      def on_tstp(signum: int, _frame: object) -> None:
        self.interrupt.suspend_refused = True

      def on_usr1(signum: int, _frame: object) -> None:
        if self.current is not None:
          self.current.dump_stacks()
      for sig in STOP_SIGNALS:
        self._previous[sig] = signal.signal(sig, on_signal)
      self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, on_usr1)
      self._previous[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, on_tstp)
    return self

  def __exit__(self, *exc: object) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self.orphans.release()


def run_attempt(spec: LaunchSpec, attempt: Attempt, out: IO[str], err: IO[str],
                env: Mapping[str, str], signals: Signals,
                stop_request: Callable[[], str | None] | None = None,
                on_failure: Callable[[NodeFailure], None] | None = None,
                quiet: bool = False,
                timeout_at: Callable[[], tuple[float, float] | None] | None = None
                ) -> LaunchResult:
  """Runs this node's clients once, to the end; see `launch`.

  Args:
    quiet: Do not write the summary line (the caller words it).
    timeout_at: In place of `spec.timeout` (see `_Supervisor`).
  """
  sup = _Supervisor(spec, out, err, env, attempt, signals.interrupt,
                    stop_request, on_failure, timeout_at=timeout_at)
  sup.orphans = signals.orphans
  signals.current = sup
  try:
    try:
      problem = why_it_cannot_start(spec.command[0], env)
      if problem is not None:
        raise OSError(errno.ENOENT, problem)
      sup.start()
    except OSError as e:
      sup.stop_all()
      why = e.strerror
      if e.errno == errno.E2BIG:
        jobs = len(",".join(attempt.jobs))
        why = (f"the clients' environment is too large (DTENSOR_JOBS alone is "
               f"{jobs:,} bytes for {len(attempt.jobs):,} clients; Linux allows "
               f"{_MAX_ARG_STRLEN:,} bytes in one variable and about "
               f"{_MAX_ARGS_ENV:,} in all): use fewer clients per launch, or "
               "several nodes")
      result = LaunchResult(reason=f"jdtensor launch: cannot start "
                            f"{spec.command[0]!r}: {why}", exit_code=127,
                            client_ids=list(attempt.client_ids))
    else:
      try:
        result = sup.run()
      except BaseException:
        # An exception raised into the launcher's thread (pytest-timeout's
        # signal method, a KeyboardInterrupt past our handlers): the clients
        # go with it, bounded by the grace.
        sup.stop_all()
        raise
    # Every client that ended normally recorded how long the others waited
    # for each one over the run: said when it was uneven.
    waits = _status.wait_summary(_status.read_waits(sup.report_dir))
  finally:
    signals.current = None
    for log in sup.logs.values():
      log.close()
    _status.unregister_run(sup.registration)
    # A worker that left its client's process group (setsid) outlived the
    # group's stop: found by the run folder its environment carries.
    stop_escaped(_env.JDTENSOR_REPORT_DIR, sup.report_dir,
                 min(spec.grace, ESCAPED_GRACE))
    # What it adopted (whatever its environment and session): it goes too.
    signals.orphans.stop(min(spec.grace, ESCAPED_GRACE))
    shutil.rmtree(sup.report_dir, ignore_errors=True)
  if result.reason and not quiet:
    sup.output.line(result.reason)
  if not quiet:  # Else the caller writes them under its summary.
    for line in result.verdict_stacks:
      sup.output.line(line)
  if waits:  # Not the caller's to word (`quiet` is for the summary line).
    sup.output.line(waits)
  return result
