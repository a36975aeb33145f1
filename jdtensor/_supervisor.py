"""One node's clients, supervised: the machinery under `jdtensor.launcher`.

PURE of JAX: the parent only spawns and watches processes. `run_attempt` runs
one attempt of one node's clients to its end (see `jdtensor.launcher` for what
the clients get and how a failure ends the others); `jdtensor._nodes` drives
several attempts and several nodes on top of it.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from jdtensor import _env
from jdtensor._report import (ClientEnd, Report, describe_exit, finished_clients,
                              root_cause, summary)
from jdtensor.device_spec import DEVICE_TYPES
from jdtensor.errors import PEER_FAILURE_EXIT_CODE

__all__ = ["LaunchSpec", "LaunchResult", "Attempt", "Failure", "Interrupt",
           "Signals", "HeldPorts", "free_ports", "worker_env", "run_attempt", "is_gloo_noise",
           "describe_exit", "stop_process_groups", "EXIT_TIMEOUT"]

# Gloo prints "[Gloo] Rank r is connected to k peer ranks. Expected number of
# connected peer ranks is : k" whenever a device group first communicates
# (jax-ml/jax#32673); the threads of several devices interleave its fragments.
_GLOO_MARKERS = re.compile(r"\[Gloo\]|peer ranks|is connected to")
_GLOO_FRAGMENTS = re.compile(r"\[Gloo\] Rank|is connected to|Expected number of "
                             r"connected peer ranks is :|peer ranks\.?|\d+|\s+")


_GLOO_LEFTOVER = re.compile(r"\s*\d*\s*")
_GLOO_FRAGMENT_SECONDS = 0.5


def is_gloo_noise(line: str) -> bool:
  """Whether `line` holds nothing but fragments of gloo's connection notice."""
  return bool(_GLOO_MARKERS.search(line)) and not _GLOO_FRAGMENTS.sub("", line)


_POLL_SECONDS = 0.05
# Linux's limits on a new process's environment (MAX_ARG_STRLEN, one
# variable; and a quarter of the default 8 MiB stack for all of them).
_MAX_ARG_STRLEN = 128 * 1024
_MAX_ARGS_ENV = 2 * 1024 * 1024
_STACK_DUMP_SECONDS = 2.0
EXIT_TIMEOUT = 124  # The launcher's exit code when its time-out expired.


@dataclass(frozen=True)
class LaunchSpec:
  """What to launch.

  Attributes:
    command: The command every client runs.
    num_clients: Number of client processes.
    devices_per_client: Simulated CPU devices per client (CPU runs). None:
      the count the clients' environment gives JAX (``JAX_NUM_CPU_DEVICES``
      or ``XLA_FLAGS``'s ``--xla_force_host_platform_device_count``), else
      JAX's default of 1; a count given both ways must agree (`resolved`).
    device_type: CPU, GPU or TPU.
    port: First port (client k gets port + k); None picks free ports.
    timeout: Seconds before every client is stopped; None waits forever.
    grace: Seconds between SIGTERM and SIGKILL (default 30, torchrun's): a
      JAX client takes SIGTERM as a preemption notice and runs on, so that
      `multihost_utils.reached_preemption_sync_point` (orbax's
      ``reached_preemption``) lets every client save the same step first.
    secret: The run's ``JDTENSOR_RUN_SECRET``, new for every spec: the
      clients' start-up handshake is authenticated with it, and a client of
      another run (another launch) is refused. Several nodes: the secret the
      nodes share (``JDTENSOR_RUN_SECRET`` of the launchers), from which
      each attempt's client secret is derived; None runs them unauthenticated.
    nnodes: Number of nodes (one launcher each); `num_clients` is per node.
    node_rank: This node's rank; clients are numbered node by node.
    coordinator: ``host:port`` where node 0's launcher meets the others.
    node_address: The address the other nodes reach this node's clients at
      (default: node 0 the coordinator's host, the others the address they
      reach node 0 from).
    max_restarts: How many times the whole group is started again after a
      failure (new ports, new secret, ``JDTENSOR_RESTART_COUNT``).
  """
  command: tuple[str, ...]
  num_clients: int = 2
  devices_per_client: int | None = None
  device_type: str = "CPU"
  port: int | None = None
  timeout: float | None = None
  grace: float = 30.0
  secret: str | None = field(default_factory=lambda: secrets.token_hex(32),
                             repr=False)
  nnodes: int = 1
  node_rank: int = 0
  coordinator: str | None = None
  node_address: str | None = None
  max_restarts: int = 0

  def __post_init__(self) -> None:
    if not self.command:
      raise ValueError("LaunchSpec.command is empty: give the command each "
                       "client runs, e.g. `jdtensor launch -n 2 -- python train.py`.")
    if self.num_clients < 1:
      raise ValueError(f"num_clients must be >= 1, got {self.num_clients}.")
    if self.devices_per_client is not None and self.devices_per_client < 1:
      raise ValueError(
          f"devices_per_client must be >= 1, got {self.devices_per_client}.")
    if self.device_type.upper() not in DEVICE_TYPES:
      raise ValueError(f"device_type must be CPU, GPU or TPU, got "
                       f"{self.device_type!r}.")
    if self.port is not None and not 1 <= self.port <= 65535 - self.num_clients + 1:
      raise ValueError(f"port must leave room for {self.num_clients} ports in "
                       f"1..65535, got {self.port}.")
    if self.timeout is not None and not 0 < self.timeout < float("inf"):
      raise ValueError(f"timeout must be a finite number of seconds > 0, got "
                       f"{self.timeout}.")
    if not 0 <= self.grace < float("inf"):
      raise ValueError(f"grace must be a finite number of seconds >= 0, got "
                       f"{self.grace}.")
    if not 1 <= self.nnodes <= 10_000:
      raise ValueError(f"nnodes must be 1..10000, got {self.nnodes}.")
    if not 0 <= self.node_rank < self.nnodes:
      raise ValueError(f"node_rank must be in [0, nnodes={self.nnodes}), got "
                       f"{self.node_rank}.")
    if self.nnodes > 1 and not self.coordinator:
      raise ValueError("several nodes need a coordinator: --coordinator HOST:PORT, "
                       "where node 0's launcher listens and the others connect.")
    if self.coordinator is not None:
      host, port = _env.parse_bind_address("--coordinator", self.coordinator)
      if host is None or port is None:
        raise ValueError(f"--coordinator={self.coordinator!r} must be HOST:PORT, "
                         "the address of node 0's launcher, e.g. 10.0.0.1:29400.")
    if self.node_address is not None:
      _env.parse_host("node_address", self.node_address, self.node_address)
    if not 0 <= self.max_restarts <= 1000:
      raise ValueError(f"max_restarts must be 0..1000, got {self.max_restarts}.")

  def resolved(self, environ: Mapping[str, str], argument: str = "devices_per_client"
               ) -> LaunchSpec:
    """This spec with its CPU device count taken from `environ` when not
    given (see `_env.resolve_cpu_device_count`); other device types as is.

    Raises:
      ConfigError: If `devices_per_client` and the environment's count differ.
    """
    if self.device_type.upper() != "CPU":
      return self
    count = _env.resolve_cpu_device_count(self.devices_per_client, argument, environ)
    return self if count == self.devices_per_client else dataclasses.replace(
        self, devices_per_client=count)


@dataclass
class LaunchResult:
  """How the clients ended.

  Attributes:
    returncodes: Each local client's return code (negative: killed by that
      signal), in `client_ids` order.
    pids: Each local client's process id.
    first_failure: The root cause: the earliest client that failed by itself,
      or the one the others named (a client id, on any node); None when every
      client exited 0.
    reason: The summary line, or '' when every client exited 0.
    exit_code: What the launcher exits with.
    ended_at: When the launcher saw each client end (``time.time()``), or
      None for one still running.
    client_ids: The (global) ids of this node's clients.
    own_failure: Whether `first_failure` failed by itself (not stopped as a
      consequence, nor by the launcher).
    failed_at: When the root cause failed (``time.time()``), if known.
    restarts: How many times the group was started again.
    stopped: The clients the launcher's stop ended (never the root cause,
      nor a client that had already ended its script).
    killed: Those of them SIGKILLed after ignoring SIGTERM for the grace.
  """
  returncodes: list[int | None] = field(default_factory=list)
  pids: list[int] = field(default_factory=list)
  first_failure: int | None = None
  reason: str = ""
  exit_code: int = 0
  ended_at: list[float | None] = field(default_factory=list)
  client_ids: list[int] = field(default_factory=list)
  own_failure: bool = False
  failed_at: float | None = None
  restarts: int = 0
  stopped: list[int] = field(default_factory=list)
  killed: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Attempt:
  """One start of this node's clients.

  Attributes:
    client_ids: The (global) ids of this node's clients.
    jobs: ``DTENSOR_JOBS`` of the whole group.
    secret: The clients' ``JDTENSOR_RUN_SECRET`` (None: unauthenticated).
    restart_count: ``JDTENSOR_RESTART_COUNT``: 0, then 1, 2, ...
  """
  client_ids: tuple[int, ...]
  jobs: tuple[str, ...]
  secret: str | None
  restart_count: int = 0

  @staticmethod
  def local(spec: LaunchSpec, restart_count: int = 0,
            secret: str | None = None) -> Attempt:
    """One node: clients 0..n-1 on localhost ports (`spec.port` or free)."""
    n = spec.num_clients
    ports = (list(range(spec.port, spec.port + n)) if spec.port is not None
             else free_ports(n))
    return Attempt(tuple(range(n)), tuple(f"localhost:{p}" for p in ports),
                   spec.secret if secret is None else secret, restart_count)


class HeldPorts:
  """`n` distinct free TCP ports on `host`, ascending, kept bound (so that no
  other process, e.g. another node's launcher on the same host, picks them)
  until `release`."""

  def __init__(self, n: int, host: str = "127.0.0.1"):
    self._socks: list[socket.socket] = []
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
      for _ in range(n):
        s = socket.socket(family, socket.SOCK_STREAM)
        self._socks.append(s)
        s.bind((host, 0))
    except BaseException:
      self.release()
      raise
    self.ports = sorted(s.getsockname()[1] for s in self._socks)

  def release(self) -> None:
    for s in self._socks:
      s.close()
    self._socks = []


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
  """`n` distinct free TCP ports on `host`, ascending (bound at once, then
  released)."""
  held = HeldPorts(n, host)
  held.release()
  return held.ports


def worker_env(spec: LaunchSpec, client: int, ports: Sequence[int],
               base: Mapping[str, str], attempt: Attempt | None = None
               ) -> dict[str, str]:
  """The environment of one client (`client`: its global id).

  Args:
    spec: What is launched.
    client: The client's id.
    ports: Its node's client ports on localhost (one node, no `attempt`).
    base: The environment to extend.
    attempt: The group's jobs and secret (several nodes or restarts).
  """
  if attempt is None:
    attempt = Attempt(tuple(range(len(ports))),
                      tuple(f"localhost:{p}" for p in ports), spec.secret)
  env = dict(base)
  env[_env.DTENSOR_CLIENT_ID] = str(client)
  env[_env.DTENSOR_NUM_CLIENTS] = str(len(attempt.jobs))
  env[_env.DTENSOR_JOB_NAME] = "worker"
  env[_env.DTENSOR_JOBS] = ",".join(attempt.jobs)
  env.pop(_env.JDTENSOR_RUN_SECRET, None)
  if attempt.secret is not None:
    env[_env.JDTENSOR_RUN_SECRET] = attempt.secret
  # Always set (0 on the first attempt), as torchrun's TORCHELASTIC_RESTART_COUNT.
  env[_env.JDTENSOR_RESTART_COUNT] = str(attempt.restart_count)
  if spec.device_type.upper() == "CPU":
    env["JAX_PLATFORMS"] = "cpu"
    if spec.devices_per_client is not None:
      env[_env.JAX_NUM_CPU_DEVICES] = str(spec.devices_per_client)
  env.setdefault("PYTHONUNBUFFERED", "1")
  return env


# The guardian: the launcher's direct child for each client, in its own
# process group, that runs the command as its child and stays alive as a
# small supervisor. When the launcher dies (even by SIGKILL), the kernel sends
# the guardian SIGUSR2 (PR_SET_PDEATHSIG), and it SIGKILLs its whole process
# group: the client, a wrapper shell and every grandchild. The command itself
# dies with the guardian (its own PR_SET_PDEATHSIG). The launcher's SIGTERM
# and SIGINT reach the whole group; the guardian ignores them (with a Python
# handler, so the command does not inherit an ignored signal) and waits for
# the command, then exits with its code, or dies of its signal. SIGUSR1 is
# ignored: the launcher forwards it, a jdtensor client installs a stack dump
# for it, and any other program must not die of it. Python runs only in this
# fresh, single-threaded process, never in a fork of a multithreaded one.
_GUARDIAN = """\
import ctypes, os, signal, sys
launcher, command = int(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
def launcher_gone(signum, frame):
  os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGUSR2, launcher_gone)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
  signal.signal(sig, lambda signum, frame: None)
libc.prctl(1, signal.SIGUSR2)
if os.getppid() != launcher:
  os.killpg(0, signal.SIGKILL)
guardian = os.getpid()
child = os.fork()
if child == 0:
  libc.prctl(1, signal.SIGKILL)
  if os.getppid() != guardian:
    os._exit(137)
  try:
    os.execvp(command[0], command)
  except OSError as e:
    os.write(2, f"jdtensor launch: cannot start {command[0]!r}: {e.strerror}\\n".encode())
    os._exit(127)
while True:
  try:
    _, status = os.waitpid(child, 0)
    break
  except InterruptedError:
    continue
if os.WIFSIGNALED(status):
  sig = os.WTERMSIG(status)
  if sig not in (signal.SIGKILL, signal.SIGSTOP):
    signal.signal(sig, signal.SIG_DFL)
  os.kill(guardian, sig)
os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)
"""


def _wrapped(command: Sequence[str]) -> list[str]:
  return [sys.executable, "-S", "-c", _GUARDIAN, str(os.getpid()), *command]


def _signal_groups(procs: Sequence[subprocess.Popen], sig: int) -> None:
  for proc in procs:
    if proc.poll() is None:
      try:
        os.killpg(proc.pid, sig)
      except ProcessLookupError:
        pass


def stop_process_groups(procs: Sequence[subprocess.Popen], grace: float,
                        killed: list[int] | None = None) -> list[int]:
  """Stops processes that each lead a process group, and everything in them.

  SIGTERM to every group still running, up to `grace` seconds on one shared
  deadline for them to end, then SIGKILL; each is reaped (10 s at most), and
  grandchildren that outlived their leader are killed too.

  Args:
    procs: The group leaders.
    grace: Seconds between SIGTERM and SIGKILL.
    killed: Receives the indices of the processes that outlived the grace
      (they ignored SIGTERM, or took longer) and were SIGKILLed.

  Returns:
    The indices of the processes that were still running.
  """
  running = [i for i, p in enumerate(procs) if p.poll() is None]
  _signal_groups(procs, signal.SIGTERM)
  deadline = time.monotonic() + grace
  while time.monotonic() < deadline and any(p.poll() is None for p in procs):
    time.sleep(_POLL_SECONDS)
  if killed is not None:
    killed.extend(i for i, p in enumerate(procs) if p.poll() is None)
  _signal_groups(procs, signal.SIGKILL)
  for proc in procs:
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      pass  # Unkillable (D state); reported by its None return code.
  for proc in procs:  # Grandchildren that outlived their leader.
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
  return running


class Interrupt:
  """A signal received by the launcher (SIGINT, SIGTERM): every client of
  every attempt is stopped. `launch` sets it from its signal handlers."""

  def __init__(self) -> None:
    self.signal: int | None = None


@dataclass(frozen=True)
class Failure:
  """The first failure a node's launcher saw, as it tells the other nodes.

  Attributes:
    client: The root cause's client id.
    what: E.g. ``client 2 exited with code 1``.
    own: Whether that client failed by itself (not as a consequence).
    at: When (``time.time()``).
  """
  client: int | None
  what: str
  own: bool
  at: float


def _segments(pipe: IO[bytes]) -> Any:
  """A client's output as it comes: (text, end) for each line ended by a
  newline, and for each progress update ended by a carriage return
  (tqdm's ``\r``), which a terminal then draws over in place."""
  buf, after_cr = b"", False
  while True:
    try:
      chunk = pipe.read1(65536)  # What has arrived, without waiting for more.
    except (OSError, ValueError):
      chunk = b""
    if not chunk:
      break
    buf += chunk
    while True:
      cut = min((i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0), default=-1)
      if cut < 0:
        break
      text, mark, buf = buf[:cut], buf[cut:cut + 1], buf[cut + 1:]
      if mark == b"\r" and buf.startswith(b"\n"):
        mark, buf = b"\n", buf[1:]  # CRLF: one line.
      if mark == b"\n" and not text and after_cr:
        after_cr = False  # The newline after a progress bar's last update.
        continue
      after_cr = mark == b"\r"
      yield text, mark.decode()
  if buf:
    yield buf, "\n"
  pipe.close()


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
  """

  def __init__(self, spec: LaunchSpec, out: IO[str], err: IO[str],
               base_env: Mapping[str, str], attempt: Attempt,
               interrupt: Interrupt | None = None,
               stop_request: Callable[[], str | None] | None = None,
               on_failure: Callable[[Failure], None] | None = None):
    self.spec = spec
    self.attempt = attempt
    self.ids = list(attempt.client_ids)
    self.base_env = base_env
    self.report_dir = tempfile.mkdtemp(prefix="jdtensor-launch-")
    self.exit_times: dict[int, float] = {}  # Monotonic, by local index.
    self.exit_wall: dict[int, float] = {}
    self.out, self.err = out, err
    self.procs: list[subprocess.Popen[bytes]] = []
    self.readers: list[threading.Thread] = []
    self.write_lock = threading.Lock()
    self.interrupt = interrupt or Interrupt()
    self.stop_request = stop_request or (lambda: None)
    self.on_failure = on_failure or (lambda failure: None)
    self.last_output = 0.0  # Monotonic time of the last line written.
    self.output_closed = False  # Set when writing our output failed.
    self.killed: list[int] = []  # Clients SIGKILLed after the grace.
    self.stopped: list[int] = []  # Clients the stop ended (see `summary`).

  def _pump(self, client: int, pipe: IO[bytes], sink: IO[str]) -> None:
    prefix = f"[client {client}] "
    noise_until = 0.0  # Fragments of a gloo notice may follow it.
    for raw, end in _segments(pipe):
      line = raw.decode(errors="replace")
      if is_gloo_noise(line):
        noise_until = time.monotonic() + _GLOO_FRAGMENT_SECONDS
        continue
      # gloo's C++ threads write their notices byte by byte into the same
      # stream, so an empty line or a lone number right after one is a
      # fragment of it, not the program's output.
      if time.monotonic() < noise_until and _GLOO_LEFTOVER.fullmatch(line):
        continue
      if self.output_closed:
        continue  # Keep draining, so that no client blocks on a full pipe.
      with self.write_lock:
        try:
          sink.write(prefix + line + end)
          sink.flush()
        except (BrokenPipeError, ValueError, OSError):
          # Our reader is gone (`jdtensor launch ... | head -1`): the run is
          # stopped, as torchrun and mpirun do.
          self.output_closed = True
        self.last_output = time.monotonic()

  def start(self) -> None:
    for client in self.ids:
      env = worker_env(self.spec, client, [], self.base_env, self.attempt)
      env[_env.JDTENSOR_REPORT_DIR] = self.report_dir
      self.procs.append(subprocess.Popen(
          _wrapped(self.spec.command), env=env,
          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
          start_new_session=True))
    for client, proc in zip(self.ids, self.procs):
      for pipe, sink in ((proc.stdout, self.out), (proc.stderr, self.err)):
        t = threading.Thread(target=self._pump, args=(client, pipe, sink),
                             daemon=True)
        t.start()
        self.readers.append(t)

  def _signal_all(self, sig: int) -> None:
    _signal_groups(self.procs, sig)

  def stop_all(self) -> list[int]:
    """SIGTERM, grace, SIGKILL; returns the ids of the clients stopped: the
    ones still running, less those that had already ended their script
    normally (waiting at exit for the others: the stop ended no work)."""
    killed: list[int] = []
    # Read before the stop: a client that ends its script because of it (a
    # preemption save, then a normal end) was stopped.
    finished = finished_clients(self.report_dir)
    running = stop_process_groups(self.procs, self.spec.grace, killed)
    self.killed += [self.ids[i] for i in killed]
    return [self.ids[i] for i in running if self.ids[i] not in finished]

  def summary(self, what: str, stopped: Sequence[int], also: Sequence[str] = ()) -> str:
    """The summary line of this attempt (`jdtensor._report.summary`); the
    stopped clients are remembered for the nodes' own summary."""
    self.stopped = list(stopped)
    return summary(what, stopped, also=also, killed=self.killed, grace=self.spec.grace)

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
    its own failure and is on its way out (client 0 leaves last), and, while
    only consequences (75) have failed, the root cause."""
    deadline = time.monotonic() + min(self.spec.grace, 3.0)
    while time.monotonic() < deadline:
      if all(c is not None for c in codes):
        break
      reports = self.reports()
      leaving = [i for i, c in enumerate(codes) if c is None
                 and self.ids[i] in reports and reports[self.ids[i]].departure]
      cause_missing = all(c in (None, 0, PEER_FAILURE_EXIT_CODE) for c in codes)
      if not leaving and not cause_missing:
        break
      time.sleep(_POLL_SECONDS)
      codes = self._poll()
    return codes

  def _root_cause(self, codes: list[int | None]) -> tuple[Failure, int]:
    """The root cause among this node's clients, and the exit code
    (`jdtensor._report.root_cause`)."""
    ends = [ClientEnd(self.ids[i], code, self.exit_wall.get(i))
            for i, code in enumerate(codes)]
    cause = root_cause(ends, self.reports())
    assert cause is not None  # Only called once a client failed.
    return Failure(cause.client, cause.what, cause.own, cause.at), cause.exit_code

  def run(self) -> LaunchResult:
    result = LaunchResult(client_ids=list(self.ids))
    deadline = (time.monotonic() + self.spec.timeout
                if self.spec.timeout is not None else None)
    while True:
      codes = self._poll()
      failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
      if self.interrupt.signal is not None:
        stopped = self.stop_all()
        name = signal.Signals(self.interrupt.signal).name
        result.reason = self.summary(f"received {name}", stopped)
        result.exit_code = 128 + self.interrupt.signal
        break
      if failed:
        codes = self._settle(codes)
        failure, exit_code = self._root_cause(codes)
        self.on_failure(failure)
        # The root cause is on its own way out (client 0 leaves last): the
        # launcher's stop is not why it ended.
        stopped = [c for c in self.stop_all() if c != failure.client]
        codes = self._poll()
        result.first_failure = failure.client
        result.own_failure, result.failed_at = failure.own, failure.at
        also = [f"client {self.ids[c]} {describe_exit(k)}"
                for c, k in sorted(((i, k) for i, k in enumerate(codes)
                                    if k not in (None, 0)
                                    and self.ids[i] != failure.client
                                    and self.ids[i] not in stopped),
                                   key=lambda f: self.exit_times.get(f[0], 0.0))]
        result.reason = self.summary(failure.what, stopped, also)
        result.exit_code = exit_code
        break
      if all(c == 0 for c in codes):
        break
      if self.output_closed:
        stopped = self.stop_all()
        result.reason = self.summary(
            "its output was closed (the reader of its pipe exited)", stopped)
        result.exit_code = 128 + signal.SIGPIPE
        break
      why = self.stop_request()
      if why is not None:
        stopped = self.stop_all()
        result.reason = self.summary(why, stopped)
        result.exit_code = PEER_FAILURE_EXIT_CODE
        break
      if deadline is not None and time.monotonic() > deadline:
        self._dump_stacks_before_stopping()
        stopped = self.stop_all()
        result.reason = self.summary(f"timed out after {self.spec.timeout:g} s",
                                     stopped)
        result.exit_code = EXIT_TIMEOUT
        result.failed_at = time.time()
        self.on_failure(Failure(None, f"timed out after {self.spec.timeout:g} s",
                                True, result.failed_at))
        break
      time.sleep(_POLL_SECONDS)
    for t in self.readers:
      t.join(timeout=5)
    self._poll()
    result.returncodes = [p.poll() for p in self.procs]
    result.pids = [p.pid for p in self.procs]
    result.ended_at = [self.exit_wall.get(i) for i in range(len(self.procs))]
    result.stopped = list(self.stopped)
    result.killed = list(self.killed)
    return result

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
      if self.last_output > asked and now - self.last_output > 0.2:
        break  # The dumps came, and the output has gone quiet.
      if self.last_output <= asked and now - asked > 0.5:
        break  # Nothing came: not jdtensor clients, or stopped ones.
      time.sleep(_POLL_SECONDS)


class Signals:
  """The launcher's handlers for SIGINT/SIGTERM (stop every client) and
  SIGUSR1 (forwarded: every client prints its stacks), installed from the
  main thread only, and restored afterwards."""

  def __init__(self, interrupt: Interrupt):
    self.interrupt = interrupt
    self.current: _Supervisor | None = None
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> Signals:
    if threading.current_thread() is threading.main_thread():
      def on_signal(signum: int, _frame: object) -> None:
        self.interrupt.signal = signum

      def on_usr1(signum: int, _frame: object) -> None:
        if self.current is not None:
          self.current.dump_stacks()
      for sig in (signal.SIGINT, signal.SIGTERM):
        self._previous[sig] = signal.signal(sig, on_signal)
      self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, on_usr1)
    return self

  def __exit__(self, *exc: object) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def run_attempt(spec: LaunchSpec, attempt: Attempt, out: IO[str], err: IO[str],
                env: Mapping[str, str], signals: Signals,
                stop_request: Callable[[], str | None] | None = None,
                on_failure: Callable[[Failure], None] | None = None,
                quiet: bool = False) -> LaunchResult:
  """Runs this node's clients once, to the end; see `launch`.

  Args:
    quiet: Do not write the summary line (the caller words it).
  """
  sup = _Supervisor(spec, out, err, env, attempt, signals.interrupt,
                    stop_request, on_failure)
  signals.current = sup
  try:
    try:
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
  finally:
    signals.current = None
    shutil.rmtree(sup.report_dir, ignore_errors=True)
  if result.reason and not quiet:
    with sup.write_lock:
      err.write(result.reason + "\n")
      err.flush()
  return result
