"""The JAX runtime underneath jdtensor: the one module that owns its state.

Only this module calls ``jax.config.update`` and (for multi-client runs)
``jax.distributed.initialize``; other modules read its state through the
functions below and never assign to it. It holds the one cluster record
("who am I"), the dense device table, the TPU mesh registry and the
heartbeat's failure record. What to start is decided above it
(`jdtensor.accelerator` resolves arguments, environment and cluster into a
`StartupPlan`); TPU system set-up is `jdtensor.tpu.system`'s.

It also owns the dense DTensor device table: DTensor device
``/job:J/replica:0/task:T/device:TYPE:I`` is the I-th visible TYPE device of
JAX process T, ordered by JAX device id. JAX device ids themselves are never
DTensor ids.
"""

from __future__ import annotations

import atexit
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jdtensor import _env, _wire
from jdtensor.runtime import rendezvous
from jdtensor import _logging as logging
from jdtensor._deadline import Deadline
from jdtensor.runtime.links import Links
from jdtensor.device_spec import DEVICE_TYPES
from jdtensor.errors import (PEER_FAILURE_EXIT_CODE, AlreadyInitializedError,
                             NotInitializedError, StartupTimeoutError)
from jdtensor.tpu.topology import (SimulatedTopology, Topology,
                                   read_simulated_topology)

__all__ = [
    "RuntimeState",
    "StartupPlan",
    "state",
    "is_initialized",
    "initialize",
    "shutdown",
    "backend_initialized",
    "cpu_device_count",
    "process_index",
    "client_devices",
    "device_string",
    "PLATFORMS",
    "simulated_tpu",
    "register_tpu_mesh",
    "registered_tpu_mesh_devices",
    "next_auto_mesh_name",
    "heartbeat_service",
    "record_peer_failure",
    "check_health",
]

# DTensor device type -> JAX platform name.
PLATFORMS = {t: t.lower() for t in DEVICE_TYPES}


@dataclass
class RuntimeState:
  """What `initialize` set up. Read it with `state()`; never assign to it.

  Attributes:
    device_type: The initialised accelerator type, or None.
    env: The cluster variables as read at initialisation.
    multi_client: Whether jax.distributed was initialised.
    timeouts: The time-outs in force.
    simulated_tpu: The simulated TPU slice, if TPU cores are simulated on CPU.
    tpu_topology: The merged TPU topology (TPU runs).
    tpu_meshes: Devices of each mesh `create_tpu_mesh` registered, by name.
    peer_failure: The failure the heartbeat recorded under policy "raise".
    links: The rendezvous connections, kept as liveness links.
    heartbeat_port: Port of the heartbeat's private coordination service on
      client 0's coordinator host (reserved at the rendezvous).
    heartbeat_socket: Client 0: the socket holding that port until the
      heartbeat's service binds it.
    gloo_host: The DTENSOR_JOBS host of this client when it is an address of
      this machine (gloo listens there), else None.
    init_seconds: Wall time `initialize` took.
  """

  device_type: str | None = None
  env: _env.ClusterEnv | None = None
  multi_client: bool = False
  timeouts: _env.Timeouts = field(default_factory=_env.Timeouts)
  init_seconds: float = 0.0
  simulated_tpu: SimulatedTopology | None = None
  tpu_topology: Topology | None = None
  tpu_meshes: dict[str, list[Any]] = field(default_factory=dict)
  auto_mesh_names: int = 0
  peer_failure: Exception | None = None
  links: Links | None = None
  heartbeat_port: int | None = None
  heartbeat_socket: Any = None
  gloo_host: str | None = None
  _device_table: dict[tuple[str, int], list[Any]] = field(default_factory=dict)


_lock = threading.RLock()
_state = RuntimeState()


def state() -> RuntimeState:
  """The current runtime state (read-only by convention)."""
  return _state


def is_initialized() -> bool:
  """Whether `initialize_accelerator_system` has run (and not been shut down)."""
  return _state.device_type is not None


def backend_initialized() -> bool:
  """Whether a JAX backend exists in this process. Never starts one."""
  if "jax" not in sys.modules:
    return False
  from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
  return jax_private.backends_initialized()


def cpu_device_count(explicit_only: bool = False) -> int | None:
  """How many CPU devices the JAX CPU backend has or will have (the one
  reader of that number). Never starts a backend.

  After start-up: the real devices. Before: ``jax_num_cpu_devices`` (if jax
  is imported), then the environment (``JAX_NUM_CPU_DEVICES``, XLA's forced
  host device count), else JAX's default of 1.

  Args:
    explicit_only: Only what the user configured: None instead of the
      default, and the configuration rather than a running backend's count.
  """
  if not explicit_only and backend_initialized():
    return len(client_devices("CPU", process_index()))
  if "jax" in sys.modules:
    import jax  # pylint: disable=g-import-not-at-top
    configured = jax.config.jax_num_cpu_devices
    if configured and configured > 0:
      return int(configured)
  from_env = _env.read_cpu_device_count()
  if from_env is not None:
    return from_env
  return None if explicit_only else 1


def process_index() -> int:
  """This process's JAX process index (starts the backend)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index()


def simulated_tpu() -> SimulatedTopology | None:
  """The simulated TPU slice in force (as initialised, else from the env)."""
  if is_initialized():
    return _state.simulated_tpu
  return read_simulated_topology()


def _platform(device_type: str) -> str | None:
  if device_type == "TPU" and simulated_tpu() is not None:
    return "cpu"  # Simulated TPU cores are this client's CPU devices.
  return PLATFORMS.get(device_type)


def client_devices(device_type: str, client: int) -> list[Any]:
  """The visible `device_type` devices of one client, in DTensor index order.

  Starts the backend. A type the backend does not have gives ``[]``.
  """
  key = (device_type.upper(), int(client))
  with _lock:
    cached = _state._device_table.get(key)  # pylint: disable=protected-access
    if cached is None:
      import jax  # pylint: disable=g-import-not-at-top
      platform = _platform(key[0])
      try:
        devices = jax.devices(platform) if platform else []
      except RuntimeError:  # No backend for this platform.
        devices = []
      for (dtype, task), table in _group(devices, key[0]).items():
        _state._device_table[(dtype, task)] = table  # pylint: disable=protected-access
      cached = _state._device_table.setdefault(key, [])  # pylint: disable=protected-access
    return list(cached)


def _group(devices: list[Any], device_type: str) -> dict[tuple[str, int], list[Any]]:
  table: dict[tuple[str, int], list[Any]] = {}
  for d in sorted(devices, key=lambda d: (d.process_index, d.id)):
    table.setdefault((device_type, d.process_index), []).append(d)
  return table


def heartbeat_service() -> tuple[str, int, Any]:
  """Where the heartbeat's private coordination service runs.

  Returns:
    (host to connect to, port, the socket reserving the port: client 0 only,
    and only until the first call; the caller closes it once the service
    binds the port).

  Raises:
    NotInitializedError: Outside an initialised multi-client run.
  """
  with _lock:
    if not _state.multi_client or _state.heartbeat_port is None:
      raise NotInitializedError("The heartbeat needs an initialised multi-client "
                                "run (DTENSOR_JOBS with several clients).")
    host, _ = _wire.split_host_port(_state.env.coordinator_address)
    reserved, _state.heartbeat_socket = _state.heartbeat_socket, None
    return host, _state.heartbeat_port, reserved


def device_string(device: Any) -> str:
  """The DTensor device string of a ``jax.Device``."""
  device_type = {v: k for k, v in PLATFORMS.items()}.get(device.platform,
                                                         device.platform.upper())
  if device_type == "CPU" and _state.device_type == "TPU" and _state.simulated_tpu:
    device_type = "TPU"
  devices = client_devices(device_type, device.process_index)
  if device not in devices:
    raise ValueError(f"JAX device {device} is not a device jdtensor can use.")
  job = _state.env.job_name if _state.env else _env.job_name()
  return (f"/job:{job}/replica:0/task:{device.process_index}/device:"
          f"{device_type}:{devices.index(device)}")


@dataclass(frozen=True)
class StartupPlan:
  """What `initialize` starts, resolved and checked by the caller
  (`jdtensor.accelerator`) from its arguments and the environment.

  Attributes:
    device_type: CPU, GPU or TPU.
    cluster: The cluster to join (one client: local mode).
    timeouts: The time-outs in force.
    deadline: The whole start-up's deadline (``timeouts.init``), shared by
      the handshake, the coordination service and JAX's registration.
    cpu_devices: CPU devices to configure; None keeps JAX's.
    reset_requested: ``experimental_reset_context`` (single client).
    local_devices: This client's device count, compared at the handshake.
    bind: Where client 0's coordinator listens (host, port), or Nones for
      the default.
    secret: The run secret; None runs the handshake unauthenticated.
    agreed: Settings every client must share, by variable name.
    simulated_tpu: The simulated TPU slice (TPU on CPU devices), if any.
  """
  device_type: str
  cluster: _env.ClusterEnv
  timeouts: _env.Timeouts
  deadline: Deadline
  cpu_devices: int | None = None
  reset_requested: bool = False
  local_devices: int = 1
  bind: tuple[str | None, int | None] = (None, None)
  secret: str | None = None
  agreed: Mapping[str, object] = field(default_factory=dict)
  simulated_tpu: SimulatedTopology | None = None


def initialize(plan: StartupPlan,
               tpu_setup: Callable[[], Topology] | None = None) -> str:
  """Starts the runtime `plan` describes and records it.

  Args:
    plan: What to start.
    tpu_setup: For TPU: DTensor's TPU system set-up (`jdtensor.tpu.system`),
      run once the runtime is up and before it counts as initialised.

  Returns:
    The device type.

  Raises:
    AlreadyInitializedError: DTensor's message.
    StartupError, StartupTimeoutError: Multi-client start-up failed.
    ValueError: This process has no device of the type.
    RuntimeError: A running backend prevents the set-up.
  """
  start = time.monotonic()
  with _lock:
    if is_initialized():
      # DTensor-compatible message.
      raise AlreadyInitializedError(
          "Accelerator system has already been initialized. Call "
          "tf.experimental.dtensor.shutdown_accelerator_system() first.")
    env, device_type = plan.cluster, plan.device_type
    multi_client = env.num_clients > 1
    if multi_client:
      _start_distributed(plan)
    else:
      _set_cpu_device_count(plan.cpu_devices, plan.reset_requested)
    if not client_devices(device_type, process_index()):
      raise ValueError(
          f"initialize_accelerator_system({device_type!r}): this process has no "
          f"{device_type} devices. Use device_type='CPU', or run where "
          f"{device_type}s are attached (or simulate a TPU slice with "
          f"{_env.JDTENSOR_SIMULATED_TPU_TOPOLOGY}).")
    if device_type == "TPU" and tpu_setup is not None:
      _state.tpu_topology = tpu_setup()
      _state.simulated_tpu = plan.simulated_tpu
    if _state.links is not None:
      _state.links.watch(None)  # The heartbeat, if on, takes the links over.
    _state.device_type = device_type
    _state.env = env
    _state.multi_client = multi_client
    _state.timeouts = plan.timeouts
    _state.init_seconds = time.monotonic() - start
    logging.info("jdtensor initialised %s in %.3f s (client %d of %d)",
                 device_type, _state.init_seconds, env.client_id, env.num_clients)
    return device_type


def _job_host_on_this_machine(env: _env.ClusterEnv) -> str | None:
  """This client's own DTENSOR_JOBS host, if an address of this machine."""
  entry = env.jobs[env.client_id]
  if entry.startswith("/bns/"):
    return None
  host, _ = _wire.split_host_port(entry)
  try:
    family, _, _, _, sockaddr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
      probe.bind(sockaddr[:2] if family == socket.AF_INET else sockaddr)
  except OSError:
    return None
  return host


def _bind_collectives_to_job_address(host: str | None, client_id: int) -> None:
  """Makes gloo listen on this client's DTENSOR_JOBS host.

  JAX builds its CPU collectives with the machine's hostname, which may
  resolve to an address other hosts cannot reach (a loopback alias, another
  interface). DTENSOR_JOBS[i] names client i's address, so that is where its
  collectives listen. Left to JAX when that host is not an address of this
  machine (e.g. Open MPI placeholders), or when gloo is not in use.
  """
  import jax  # pylint: disable=g-import-not-at-top

  from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
  if host is None or jax.config.jax_cpu_collectives_implementation != "gloo":
    return
  jax_private.bind_cpu_collectives(host)
  logging.info("jdtensor: CPU collectives listen on %s (DTENSOR_JOBS[%d])", host,
               client_id)


class _StartupWatch:
  """Liveness-link events during start-up: a peer's death stops this client."""

  @staticmethod
  def peer_died(client: int, how: str) -> None:
    _died_during_startup(client, how)


def _died_during_startup(client: int, how: str) -> None:
  sys.stderr.write(
      f"StartupError: client {client}'s process ended during start-up ({how}) "
      "after meeting the coordinator; this client cannot join the cluster and "
      f"stops (exit {PEER_FAILURE_EXIT_CODE}).\n")
  sys.stderr.flush()
  os._exit(PEER_FAILURE_EXIT_CODE)  # The main thread is inside JAX's connect.


def _start_distributed(plan: StartupPlan) -> None:
  """Rendezvous, then ``jax.distributed.initialize``, then cross-checks, all
  within the plan's one deadline."""
  env, timeouts, deadline = plan.cluster, plan.timeouts, plan.deadline
  if backend_initialized():
    raise RuntimeError(
        "The JAX backend has already been started in this process, so it cannot "
        "join a multi-client cluster. Call initialize_accelerator_system() "
        "before any JAX call that starts the backend (jax.devices(), creating "
        "arrays, jit).")
  coordinator = env.coordinator_address
  bind = rendezvous.bind_address(coordinator, *plan.bind)
  if plan.secret is None:
    logging.warning(
        "jdtensor: the start-up handshake is not authenticated: %s is not set, "
        "so any process that can reach DTENSOR_JOBS[0] can join or disturb it. "
        "`jdtensor launch` sets one per run; set the same one on every client.",
        _env.JDTENSOR_RUN_SECRET)
  logging.info("jdtensor client %d of %d: meeting the coordinator at %s",
               env.client_id, env.num_clients, coordinator)
  settings = {**plan.agreed, _env.JDTENSOR_INIT_TIMEOUT: timeouts.init,
              _env.JDTENSOR_COORDINATION_TIMEOUT: timeouts.coordination,
              _env.JDTENSOR_SHUTDOWN_TIMEOUT: timeouts.shutdown,
              _env.DTENSOR_JOB_NAME: env.job_name}
  meeting = rendezvous.rendezvous(
      rendezvous.Hello(env.client_id, env.num_clients, env.jobs,
                        plan.local_devices, env.heartbeat_enabled,
                        tuple(sorted(settings.items()))),
      coordinator, bind, deadline, plan.secret)
  _state.links = meeting.links
  _state.heartbeat_port = meeting.heartbeat_port
  _state.heartbeat_socket = meeting.heartbeat_socket
  atexit.register(_state.links.goodbye)
  # Until initialisation ends, a client that dies leaves the others in JAX's
  # C++ connect (which aborts at its time-out) or in the TPU core-id merge:
  # stop cleanly. `initialize` hands the links on when it is done.
  _state.links.watch(_StartupWatch())
  _set_cpu_device_count(plan.cpu_devices, False)
  import jax  # pylint: disable=g-import-not-at-top
  if env.client_id != 0:
    rendezvous.wait_for_service(coordinator, deadline, env.client_id)
  if deadline.expired():
    raise StartupTimeoutError(
        f"Client {env.client_id}: start-up used up the init timeout "
        f"({timeouts.init:g} s, {_env.JDTENSOR_INIT_TIMEOUT}) before JAX's "
        "registration; raise it on every client.")
  host, port = bind
  jax.distributed.initialize(
      coordinator_address=coordinator,
      num_processes=env.num_clients,
      process_id=env.client_id,
      cluster_detection_method="deactivate",  # DTENSOR_* is the source of truth.
      initialization_timeout=deadline.whole_seconds_left(),
      heartbeat_timeout_seconds=math.ceil(timeouts.coordination),
      shutdown_timeout_seconds=math.ceil(timeouts.shutdown),
      coordinator_bind_address=_wire.format_host_port(host, port))
  _state.gloo_host = _job_host_on_this_machine(env)
  _bind_collectives_to_job_address(_state.gloo_host, env.client_id)
  if jax.process_index() != env.client_id or jax.process_count() != env.num_clients:
    raise RuntimeError(
        f"JAX disagrees with DTENSOR_*: it says process {jax.process_index()} "
        f"of {jax.process_count()}, DTensor says client {env.client_id} of "
        f"{env.num_clients}.")
  platform = _platform(plan.device_type)
  try:
    devices = jax.devices(platform) if platform else []
  except RuntimeError:
    devices = []
  counts = {c: 0 for c in range(env.num_clients)}
  for d in devices:
    counts[d.process_index] = counts.get(d.process_index, 0) + 1
  if len(set(counts.values())) > 1:
    raise RuntimeError(
        f"Clients have different numbers of {plan.device_type} devices: "
        + ", ".join(f"client {c}: {n}" for c, n in sorted(counts.items()))
        + ". DTensor meshes need the same number on every client.")


def _set_cpu_device_count(count: int | None, reset_requested: bool) -> None:
  """Applies `count` CPU devices; it must happen before the backend starts."""
  import jax  # pylint: disable=g-import-not-at-top
  if not backend_initialized():
    if count is not None:
      jax.config.update("jax_num_cpu_devices", count)
    return
  if reset_requested:
    logging.warning(
        "experimental_reset_context is True. Resetting TensorFlow context. "
        "Existing TensorFlow objects (e.g. Tensors and resources) are "
        "invalidated. (jdtensor: a JAX backend cannot be reset; the running "
        "one is kept.)")
  actual = cpu_device_count()
  if count is not None and count != actual:
    raise RuntimeError(
        f"num_logical_cpu_devices={count} cannot take effect: the JAX backend "
        f"has already started with {actual} CPU device(s). Call "
        "initialize_accelerator_system() before any JAX call that starts the "
        "backend (jax.devices(), creating arrays, jit), or run it in a fresh "
        "process.")


def shutdown() -> None:
  """Tears the runtime down; see `jdtensor.shutdown_accelerator_system`."""
  with _lock:
    if not is_initialized():
      # DTensor-compatible message.
      raise NotInitializedError(
          "Accelerator system is not initialized. Call "
          "tf.experimental.dtensor.initialize_accelerator_system first.")
    if _state.multi_client:
      # DTensor-compatible: the system stays initialised.
      raise ValueError("Shutting down accelerator system under multi-client "
                       "mode is not supported.")
    if _state.device_type == "TPU":
      _state.tpu_topology = None
      _state.tpu_meshes.clear()
      logging.info("TPU system shut down.")
    _state.device_type = None
    _state.env = None


def register_tpu_mesh(name: str, devices: list[Any]) -> None:
  """Records the devices of a TPU mesh by name (DTensor's ``set_tpu_core_ids``).

  Raises:
    ValueError: DTensor's message if the name is already registered.
  """
  with _lock:
    if name in _state.tpu_meshes:
      # DTensor-compatible message.
      raise ValueError(f"Mesh name already in use: {name}")
    _state.tpu_meshes[name] = list(devices)


def registered_tpu_mesh_devices(name: str) -> list[Any] | None:
  """The devices `register_tpu_mesh` recorded for `name`, if any."""
  return _state.tpu_meshes.get(name)


def next_auto_mesh_name() -> str:
  """A default TPU mesh name that is the same on every client.

  DTensor uses ``"mesh_%f" % time.time()``, which differs between clients.
  """
  with _lock:
    name = f"mesh_{_state.auto_mesh_names}"
    _state.auto_mesh_names += 1
    return name


def record_peer_failure(error: Exception) -> None:
  """Keeps a heartbeat failure to raise at the next jdtensor call."""
  with _lock:
    if _state.peer_failure is None:
      _state.peer_failure = error


def check_health() -> None:
  """Raises the recorded heartbeat failure (policy "raise"), if any."""
  if _state.peer_failure is not None:
    raise _state.peer_failure
