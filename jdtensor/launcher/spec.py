"""What `jdtensor launch` runs, and what each client gets: the launcher's types.

PURE of JAX: standard library only. `LaunchSpec` (what to run), `Attempt`
(one start of one node's clients), `LaunchResult` (how they ended),
`NodeFailure` and `Interrupt` (what stops a run), the ports and `worker_env`
(the contract with the clients: the DTENSOR_* variables).
"""

from __future__ import annotations

import dataclasses
import secrets
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jdtensor import _env
from jdtensor.device_spec import DEVICE_TYPES

__all__ = ["LaunchSpec", "LaunchResult", "Attempt", "NodeFailure", "Interrupt",
           "HeldPorts", "free_ports", "worker_env"]



@dataclass(frozen=True)
class LaunchSpec:
  """What to launch.

  Attributes:
    command: The command every client runs.
    num_clients: Number of client processes (per node). None: one per GPU
      (GPU runs only; see `devices_per_client`).
    devices_per_client: CPU runs: simulated CPU devices per client. None:
      the count the clients' environment gives JAX (``JAX_NUM_CPU_DEVICES``
      or ``XLA_FLAGS``'s ``--xla_force_host_platform_device_count``), else
      JAX's default of 1; a count given both ways must agree (`resolved`).
      GPU runs: GPUs per client, from the node's pool (its
      ``CUDA_VISIBLE_DEVICES``, else its GPUs; `jdtensor.launcher.gpus`);
      None: the pool split evenly over `num_clients`.
    device_type: CPU, GPU or TPU.
    gpu_assignment: GPU runs, set by `resolved`: each of the node's clients'
      ``CUDA_VISIBLE_DEVICES`` entries, by local index.
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
    log_dir: A folder for one log file per client (``client-<k>.log``: the
      client's stdout and stderr as written, each attempt after a header
      line); None keeps the output on the console only.
    log_only: With `log_dir`, the clients' output goes to the files only
      (the launcher's own lines stay on the console).
    compile_cache: With `max_restarts`, the attempts share one JAX
      persistent compilation cache (`jdtensor.launcher.compile_cache`), so
      that a restart reads what the last attempt compiled.
    trace: Where to write the run's trace (`jdtensor.launcher.trace`: every
      client's timeline, Perfetto's format); None writes none.
  """
  command: tuple[str, ...]
  num_clients: int | None = 2
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
  log_dir: str | None = None
  log_only: bool = False
  compile_cache: bool = True
  trace: str | None = None
  gpu_assignment: tuple[tuple[str, ...], ...] | None = field(default=None, repr=False)

  def __post_init__(self) -> None:
    if not self.command:
      raise ValueError("LaunchSpec.command is empty: give the command each "
                       "client runs, e.g. `jdtensor launch -n 2 -- python train.py`.")
    if self.num_clients is None and self.device_type.upper() != "GPU":
      raise ValueError("num_clients may be left out (one client per GPU) only with "
                       f"device_type GPU, not {self.device_type!r}.")
    if self.num_clients is not None and self.num_clients < 1:
      raise ValueError(f"num_clients must be >= 1, got {self.num_clients}.")
    if self.devices_per_client is not None and self.devices_per_client < 1:
      raise ValueError(
          f"devices_per_client must be >= 1, got {self.devices_per_client}.")
    if self.device_type.upper() not in DEVICE_TYPES:
      raise ValueError(f"device_type must be CPU, GPU or TPU, got "
                       f"{self.device_type!r}.")
    if self.port is not None and not 1 <= self.port <= 65535 - (self.num_clients or 1) + 1:
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

  def resolved(self, environ: Mapping[str, str], argument: str = "devices_per_client",
               device_dir: str = "/dev") -> LaunchSpec:
    """This spec made concrete for this node: CPU runs, the device count
    taken from `environ` when not given (see
    `_env.resolve_cpu_device_count`); GPU runs, each client's GPUs
    (`gpu_assignment`) and, if not given, the client count; TPU as is.

    Raises:
      ConfigError: If `devices_per_client` and the environment's count
        differ, or the node's GPUs cannot serve the clients (`gpus.assign_gpus`).
    """
    if self.device_type.upper() == "GPU":
      from jdtensor.launcher import gpus  # pylint: disable=g-import-not-at-top
      assignment = gpus.assign_gpus(
          gpus.node_gpu_pool(environ, device_dir), self.num_clients,
          self.devices_per_client,
          share=_env.read_bool(_env.JDTENSOR_SHARE_GPUS, False, environ))
      return dataclasses.replace(self, num_clients=len(assignment),
                                 devices_per_client=len(assignment[0]),
                                 gpu_assignment=assignment)
    if self.device_type.upper() != "CPU":
      return self
    count = _env.resolve_cpu_device_count(self.devices_per_client, argument, environ)
    return self if count == self.devices_per_client else dataclasses.replace(
        self, devices_per_client=count)


@dataclass(frozen=True)
class LaunchResult:
  """How the clients ended (built once, when the run ends).

  Attributes:
    returncodes: Each local client's return code (negative: killed by that
      signal), in `client_ids` order.
    pids: Each local client's process id.
    first_failure: The root cause: the earliest client that failed by itself,
      or the one the others named (a client id, on any node); None when every
      client exited 0.
    reason: The summary line, or '' when every client exited 0.
    cause: What the summary says of the root cause (``client 2 exited with
      code 70: client 2 stalled: ...``), or '' when there is none.
    exit_code: What the launcher exits with.
    ended_at: When the launcher saw each client end (``time.time()``), or
      None for one still running.
    client_ids: The (global) ids of this node's clients.
    own_failure: Whether `first_failure` failed by itself (not stopped as a
      consequence, nor by the launcher).
    failed_at: When the root cause failed (``time.time()``), if known.
    restarts: How many times the group was started again.
    stopped: The clients the launcher's stop ended (the root cause too,
      where it was not on its own way out; never a client that had already
      ended its script).
    killed: Those of them SIGKILLed after ignoring SIGTERM for the grace.
    frozen: Those of them SIGKILLed at once, being stopped processes
      (SIGSTOP, a debugger), without the grace.
    verdict_stacks: The lines under the summary when a client's heartbeat
      named a verdict: where each of this node's clients' main thread was
      (one line per place), or that it could not answer.
    started_at: When this attempt's clients were started (``time.time()``).
    first_step_at: When the last of this node's clients said it completed
      its first step (`jdtensor.step_done`), or None.
  """
  returncodes: list[int | None] = field(default_factory=list)
  pids: list[int] = field(default_factory=list)
  first_failure: int | None = None
  reason: str = ""
  cause: str = ""
  exit_code: int = 0
  ended_at: list[float | None] = field(default_factory=list)
  client_ids: list[int] = field(default_factory=list)
  own_failure: bool = False
  failed_at: float | None = None
  restarts: int = 0
  stopped: list[int] = field(default_factory=list)
  killed: list[int] = field(default_factory=list)
  frozen: list[int] = field(default_factory=list)
  verdict_stacks: list[str] = field(default_factory=list)
  started_at: float | None = None
  first_step_at: float | None = None


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
  env.pop(_env.JDTENSOR_CLIENT_PROCESS, None)  # A launch from inside a client.
  if attempt.secret is not None:
    env[_env.JDTENSOR_RUN_SECRET] = attempt.secret
  # Always set (0 on the first attempt), as torchrun's TORCHELASTIC_RESTART_COUNT.
  env[_env.JDTENSOR_RESTART_COUNT] = str(attempt.restart_count)
  local = attempt.client_ids.index(client)
  env[_env.JDTENSOR_LOCAL_CLIENT_ID] = str(local)
  env[_env.JDTENSOR_LOCAL_NUM_CLIENTS] = str(len(attempt.client_ids))
  if spec.gpu_assignment is not None:
    env[_env.CUDA_VISIBLE_DEVICES] = ",".join(spec.gpu_assignment[local])
  if spec.device_type.upper() == "CPU":
    env["JAX_PLATFORMS"] = "cpu"
    if spec.devices_per_client is not None:
      env[_env.JAX_NUM_CPU_DEVICES] = str(spec.devices_per_client)
  env.setdefault("PYTHONUNBUFFERED", "1")
  return env


class Interrupt:
  """The stop signals the launcher received (SIGINT, SIGTERM, SIGHUP,
  SIGQUIT): the first stops every client of every attempt, with the grace;
  a second one cuts the grace short. Set by `launch`'s signal handlers.

  Attributes:
    signal: The first stop signal, or None.
    count: How many stop signals came.
    suspend_refused: Ctrl-Z (SIGTSTP) came, and is not yet said to be
      refused.
  """

  def __init__(self) -> None:
    self.signal: int | None = None
    self.count = 0
    self.suspend_refused = False

  def received(self, signum: int) -> None:
    """Called by the signal handler (so: plain assignments only)."""
    if self.signal is None:
      self.signal = signum
    self.count += 1

  @property
  def urgent(self) -> bool:
    """A second stop signal came: the clients are killed at once."""
    return self.count >= 2


@dataclass(frozen=True)
class NodeFailure:
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
