"""The JAX runtime underneath jdtensor: the one module that owns its state.

Only this module calls ``jax.config.update`` and (for multi-client runs)
``jax.distributed.initialize``; other modules read its state through the
functions below and never assign to it.

It also owns the dense DTensor device table: DTensor device
``/job:J/replica:0/task:T/device:TYPE:I`` is the I-th visible TYPE device of
JAX process T, ordered by JAX device id. JAX device ids themselves are never
DTensor ids.
"""

from __future__ import annotations

import atexit
import math
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jdtensor import _logging as logging

from jdtensor import _env, _rendezvous
from jdtensor import cluster as _cluster
from jdtensor.errors import (PEER_FAILURE_EXIT_CODE, AlreadyInitializedError,
                             BarrierTimeoutError, ConfigError,
                             NotInitializedError)
from jdtensor.tpu.topology import (JDTENSOR_SIMULATED_TPU_TOPOLOGY,
                                   SimulatedTopology, Topology,
                                   read_simulated_topology)

__all__ = [
    "RuntimeState",
    "state",
    "is_initialized",
    "initialize",
    "shutdown",
    "backend_initialized",
    "configured_cpu_device_count",
    "process_index",
    "client_devices",
    "device_string",
    "PLATFORMS",
    "next_barrier_id",
    "wait_at_barrier",
    "simulated_tpu",
    "register_tpu_mesh",
    "registered_tpu_mesh_devices",
    "next_auto_mesh_name",
    "heartbeat_service",
    "coordination_client",
    "record_peer_failure",
    "check_health",
]

# DTensor device type -> JAX platform name.
PLATFORMS = {"CPU": "cpu", "GPU": "gpu", "TPU": "tpu"}
_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


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
  barrier_counts: dict[str, int] = field(default_factory=dict)
  simulated_tpu: SimulatedTopology | None = None
  tpu_topology: Topology | None = None
  tpu_meshes: dict[str, list[Any]] = field(default_factory=dict)
  auto_mesh_names: int = 0
  peer_failure: Exception | None = None
  links: _rendezvous.Links | None = None
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
  from jdtensor import _jax_private  # pylint: disable=g-import-not-at-top
  return _jax_private.backends_initialized()


def configured_cpu_device_count(environ: Mapping[str, str] | None = None) -> int:
  """How many CPU devices the JAX CPU backend has or will have.

  Never starts a backend: after start-up it counts the real devices; before,
  it reads ``jax_num_cpu_devices`` (if jax is imported), then
  ``JAX_NUM_CPU_DEVICES``, then ``XLA_FLAGS``' forced host device count, else 1.
  """
  if backend_initialized():
    return len(client_devices("CPU", process_index()))
  if "jax" in sys.modules:
    import jax  # pylint: disable=g-import-not-at-top
    configured = jax.config.jax_num_cpu_devices
    if configured and configured > 0:
      return int(configured)
  env = _env._environ(environ)  # pylint: disable=protected-access
  raw = env.get("JAX_NUM_CPU_DEVICES", "").strip()
  if raw.isdigit() and int(raw) > 0:
    return int(raw)
  match = _DEVICE_COUNT_FLAG.search(env.get("XLA_FLAGS", ""))
  return int(match.group(1)) if match else 1


def process_index() -> int:
  """This process's JAX process index (starts the backend)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index()


def simulated_tpu() -> SimulatedTopology | None:
  """The simulated TPU slice in force (as initialised, else from the env)."""
  if is_initialized():
    return _state.simulated_tpu
  return read_simulated_topology(os.environ)


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
    host, _ = _rendezvous.split_host_port(_state.env.coordinator_address)
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


def initialize(device_type: str | None = None,
               num_logical_cpu_devices: int | None = None,
               experimental_reset_context: bool = False, *,
               cluster: _env.ClusterEnv | None = None,
               init_timeout: float | None = None,
               heartbeat_timeout: float | None = None,
               shutdown_timeout: float | None = None,
               coordinator_bind_address: str | None = None,
               megacore: bool = False,
               cluster_detection: str | None = None,
               agreed: Mapping[str, object] | None = None) -> str:
  """Sets up the runtime; see `jdtensor.initialize_accelerator_system`.

  Args:
    cluster: The cluster to join; defaults to the DTENSOR_* variables.
    agreed: Settings every client must share (by variable name), checked
      at the start-up handshake with the time-outs.
    (others): See `jdtensor.initialize_accelerator_system`.
  """
  from jdtensor import config  # pylint: disable=g-import-not-at-top
  start = time.monotonic()
  with _lock:
    if is_initialized():
      # DTensor-compatible message.
      raise AlreadyInitializedError(
          "Accelerator system has already been initialized. Call "
          "tf.experimental.dtensor.shutdown_accelerator_system() first.")
    if cluster is None:
      # Detection fills in only what the user left unset. It does not write
      # os.environ: the config functions answer from this record once
      # initialised, and child processes get the exports only when asked
      # (`jdtensor env`).
      exports = _cluster.resolve(method=cluster_detection)
      if exports:
        logging.info("jdtensor: cluster detected: %s", exports)
      cluster = _env.read_cluster_env({**os.environ, **exports})
    env = cluster
    timeouts = _env.read_timeouts(init=init_timeout, heartbeat=heartbeat_timeout,
                                  shutdown=shutdown_timeout)
    # Parsed now: a bad value fails before the cluster forms, naming itself.
    if coordinator_bind_address is not None:
      bind_override = _env.parse_bind_address("coordinator_bind_address",
                                              coordinator_bind_address)
    elif os.environ.get(_env.JDTENSOR_COORDINATOR_BIND_ADDRESS) is not None:
      bind_override = _env.parse_bind_address(
          _env.JDTENSOR_COORDINATOR_BIND_ADDRESS,
          os.environ[_env.JDTENSOR_COORDINATOR_BIND_ADDRESS])
    else:
      bind_override = (None, None)
    secret = _env.read_run_secret()
    if device_type is None:
      device_type = config.preferred_device_type()
    if not isinstance(device_type, str):
      raise TypeError(f"device_type must be a str, got {device_type!r}.")
    device_type = device_type.upper()
    if device_type not in PLATFORMS:
      # DTensor-compatible message.
      raise ValueError(f"Unknown device_type {device_type}. Allowed values are "
                       "CPU, GPU, or TPU")
    if num_logical_cpu_devices is not None and (
        not isinstance(num_logical_cpu_devices, int) or
        isinstance(num_logical_cpu_devices, bool) or num_logical_cpu_devices < 1):
      raise ValueError("num_logical_cpu_devices must be a positive int, got "
                       f"{num_logical_cpu_devices!r}.")
    simulated = read_simulated_topology(os.environ) if device_type == "TPU" else None
    if simulated is not None:
      num_logical_cpu_devices = _simulated_cpu_devices(simulated, env,
                                                       num_logical_cpu_devices)
    elif device_type != "CPU":
      n = config.num_local_devices(device_type)
      if num_logical_cpu_devices is None:
        num_logical_cpu_devices = max(configured_cpu_device_count(), n)
      elif num_logical_cpu_devices < n:
        # DTensor-compatible message.
        raise ValueError(
            f"If set, `num_logical_cpu_devices` (={num_logical_cpu_devices}) "
            "must be greater than or equal to the number of local "
            f"{device_type} devices (={n})")
    multi_client = env.num_clients > 1
    if multi_client:
      _start_distributed(env, device_type, num_logical_cpu_devices, timeouts,
                         bind_override, secret, agreed or {})
    else:
      _set_cpu_device_count(num_logical_cpu_devices, experimental_reset_context)
    if not client_devices(device_type, process_index()):
      raise ValueError(
          f"initialize_accelerator_system({device_type!r}): this process has no "
          f"{device_type} devices. Use device_type='CPU', or run where "
          f"{device_type}s are attached (or simulate a TPU slice with "
          f"{JDTENSOR_SIMULATED_TPU_TOPOLOGY}).")
    if device_type == "TPU":
      _state.tpu_topology = _init_tpu_system(env, simulated, megacore)
      _state.simulated_tpu = simulated
    if _state.links is not None:
      _state.links.watch(None)  # The heartbeat, if on, takes the links over.
    _state.device_type = device_type
    _state.env = env
    _state.multi_client = multi_client
    _state.timeouts = timeouts
    _state.init_seconds = time.monotonic() - start
    logging.info("jdtensor initialised %s in %.3f s (client %d of %d)",
                 device_type, _state.init_seconds, env.client_id, env.num_clients)
    return device_type


def _explicit_cpu_device_count() -> int | None:
  """The CPU device count the user configured for JAX, if any."""
  if "jax" in sys.modules:
    import jax  # pylint: disable=g-import-not-at-top
    if jax.config.jax_num_cpu_devices and jax.config.jax_num_cpu_devices > 0:
      return int(jax.config.jax_num_cpu_devices)
  if os.environ.get("JAX_NUM_CPU_DEVICES") or _DEVICE_COUNT_FLAG.search(
      os.environ.get("XLA_FLAGS", "")):
    return configured_cpu_device_count()
  return None


def _simulated_cpu_devices(sim: SimulatedTopology, env: _env.ClusterEnv,
                           requested: int | None) -> int:
  """Checks a simulated TPU slice against the cluster; its CPU device count."""
  raw = os.environ.get(JDTENSOR_SIMULATED_TPU_TOPOLOGY)
  if sim.num_hosts != env.num_clients:
    raise ConfigError(
        f"{JDTENSOR_SIMULATED_TPU_TOPOLOGY}={raw!r} has {sim.num_hosts} host(s) "
        f"of {sim.cores_per_host} cores, but there are {env.num_clients} "
        f"client(s) in DTENSOR_JOBS; run one client per host (`jdtensor launch "
        f"-n {sim.num_hosts} --devices-per-client {sim.cores_per_host}`).")
  have = requested if requested is not None else _explicit_cpu_device_count()
  if have is not None and have != sim.cores_per_host:
    raise ConfigError(
        f"{JDTENSOR_SIMULATED_TPU_TOPOLOGY}={raw!r} gives each host "
        f"{sim.cores_per_host} cores, but this client is configured for {have} "
        "CPU devices (num_logical_cpu_devices, JAX_NUM_CPU_DEVICES or the "
        f"launcher's --devices-per-client); use {sim.cores_per_host}.")
  return sim.cores_per_host


def _init_tpu_system(env: _env.ClusterEnv, sim: SimulatedTopology | None,
                     megacore: bool) -> Topology:
  """DTensor's TPU system init: local core ids, psum merge, topology."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from jdtensor.layout import Mesh  # pylint: disable=g-import-not-at-top
  from jdtensor.tpu import topology  # pylint: disable=g-import-not-at-top
  n, cid = env.num_clients, env.client_id
  if sim is not None:
    bounds = list(sim.shape)
    expected = [i for host in range(n) for i in sim.host_core_ids(host)]
    source = f"{JDTENSOR_SIMULATED_TPU_TOPOLOGY}={os.environ.get(JDTENSOR_SIMULATED_TPU_TOPOLOGY)!r}"
  else:
    bounds, expected = topology.device_core_ids(jax.devices("tpu"))
    source = "JAX's global TPU device view"
  per_task = len(expected) // n
  local = expected[cid * per_task:(cid + 1) * per_task]
  if megacore:
    if bounds[3] != 1:
      raise ValueError(
          "experimental_enable_megcore needs one device per TPU chip, but "
          f"{source} has {bounds[3]} cores per chip.")
    logging.info("Using TPU megacore")
    local, expected = [2 * i for i in local], [2 * i for i in expected]
    bounds = bounds[:3] + [2]  # Core ids count physical cores: 2 per chip.
  logging.info("TPU core IDs: %s", local)
  strings = [f"/job:{env.job_name}/replica:0/task:{cid}/device:TPU:{k}"
             for k in range(per_task)]
  merge_mesh = Mesh(["x"], np.arange(len(expected)),
                    list(range(cid * per_task, (cid + 1) * per_task)), strings)
  merged = topology.merge_core_ids(local, cid, n, merge_mesh)
  logging.info("All TPU core IDs: %s", merged)
  bad = [t for t in range(n) if merged[t * per_task:(t + 1) * per_task] !=
         expected[t * per_task:(t + 1) * per_task]]
  if bad:
    raise RuntimeError(
        "The TPU core ids merged across clients disagree with "
        f"{source} for client(s) {', '.join(map(str, bad))}: merged {merged}, "
        f"expected {expected}. Every client must run on the slice it reports "
        "(same topology on every client).")
  topo = topology.build_topology(merged, bounds, n)
  logging.info("All TPU core locations: %s", topology.core_ids_to_locations(
      merged, bounds))
  logging.vlog(1, "TPU Topology: %s, %s", topo.mesh_shape, topo.device_coordinates)
  return topo


def _job_host_on_this_machine(env: _env.ClusterEnv) -> str | None:
  """This client's own DTENSOR_JOBS host, if an address of this machine."""
  entry = env.jobs[env.client_id]
  if entry.startswith("/bns/"):
    return None
  host, _ = _rendezvous.split_host_port(entry)
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

  from jdtensor import _jax_private  # pylint: disable=g-import-not-at-top
  if host is None or jax.config.jax_cpu_collectives_implementation != "gloo":
    return
  _jax_private.bind_cpu_collectives(host)
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


def _start_distributed(env: _env.ClusterEnv, device_type: str,
                       cpu_devices: int | None, timeouts: _env.Timeouts,
                       bind_override: tuple[str | None, int | None],
                       secret: str | None,
                       agreed: Mapping[str, object]) -> None:
  """Rendezvous, then ``jax.distributed.initialize``, then cross-checks."""
  from jdtensor import config  # pylint: disable=g-import-not-at-top
  if backend_initialized():
    raise RuntimeError(
        "The JAX backend has already been started in this process, so it cannot "
        "join a multi-client cluster. Call initialize_accelerator_system() "
        "before any JAX call that starts the backend (jax.devices(), creating "
        "arrays, jit).")
  deadline = time.monotonic() + timeouts.init
  coordinator = env.coordinator_address
  bind = _rendezvous.bind_address(coordinator, *bind_override)
  if secret is None:
    logging.warning(
        "jdtensor: the start-up handshake is not authenticated: %s is not set, "
        "so any process that can reach DTENSOR_JOBS[0] can join or disturb it. "
        "`jdtensor launch` sets one per run; set the same one on every client.",
        _env.JDTENSOR_RUN_SECRET)
  if device_type in ("CPU",) or (device_type == "TPU" and
                                 read_simulated_topology(os.environ)):
    local = cpu_devices or configured_cpu_device_count()
  else:
    local = config.num_local_devices(device_type)
  logging.info("jdtensor client %d of %d: meeting the coordinator at %s",
               env.client_id, env.num_clients, coordinator)
  settings = {**agreed, _env.JDTENSOR_INIT_TIMEOUT: timeouts.init,
              _env.JDTENSOR_HEARTBEAT_TIMEOUT: timeouts.heartbeat,
              _env.JDTENSOR_SHUTDOWN_TIMEOUT: timeouts.shutdown,
              _env.DTENSOR_JOB_NAME: env.job_name}
  meeting = _rendezvous.rendezvous(
      _rendezvous.Hello(env.client_id, env.num_clients, env.jobs, local,
                        env.heartbeat_enabled, tuple(sorted(settings.items()))),
      coordinator, bind, timeouts.init, secret)
  _state.links = meeting.links
  _state.heartbeat_port = meeting.heartbeat_port
  _state.heartbeat_socket = meeting.heartbeat_socket
  atexit.register(_state.links.goodbye)
  # Until initialisation ends, a client that dies leaves the others in JAX's
  # C++ connect (which aborts at its time-out) or in the TPU core-id merge:
  # stop cleanly. `initialize` hands the links on when it is done.
  _state.links.watch(_StartupWatch())
  _set_cpu_device_count(cpu_devices, False)
  import jax  # pylint: disable=g-import-not-at-top
  if env.client_id != 0:
    _rendezvous.wait_for_service(coordinator, deadline, env.client_id)
  host, port = bind
  jax.distributed.initialize(
      coordinator_address=coordinator,
      num_processes=env.num_clients,
      process_id=env.client_id,
      cluster_detection_method="deactivate",  # DTENSOR_* is the source of truth.
      initialization_timeout=max(10, math.ceil(deadline - time.monotonic())),
      heartbeat_timeout_seconds=math.ceil(timeouts.heartbeat),
      shutdown_timeout_seconds=math.ceil(timeouts.shutdown),
      coordinator_bind_address=(f"[{host}]:{port}" if ":" in host
                                else f"{host}:{port}"))
  _state.gloo_host = _job_host_on_this_machine(env)
  _bind_collectives_to_job_address(_state.gloo_host, env.client_id)
  if jax.process_index() != env.client_id or jax.process_count() != env.num_clients:
    raise RuntimeError(
        f"JAX disagrees with DTENSOR_*: it says process {jax.process_index()} "
        f"of {jax.process_count()}, DTensor says client {env.client_id} of "
        f"{env.num_clients}.")
  platform = PLATFORMS[device_type]
  try:
    devices = jax.devices(platform)
  except RuntimeError:
    devices = []
  counts = {c: 0 for c in range(env.num_clients)}
  for d in devices:
    counts[d.process_index] = counts.get(d.process_index, 0) + 1
  if len(set(counts.values())) > 1:
    raise RuntimeError(
        f"Clients have different numbers of {device_type} devices: "
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
  actual = len(client_devices("CPU", process_index()))
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


def next_barrier_id(name: str) -> str:
  """DTensor's per-name barrier ids: ``name:0``, ``name:1``, ..."""
  with _lock:
    count = _state.barrier_counts.get(name, 0)
    _state.barrier_counts[name] = count + 1
    return f"{name}:{count}"


def wait_at_barrier(barrier_id: str, timeout_ms: int) -> None:
  """A coordination-service barrier over every client (multi-client only).

  Raises:
    TimeoutError: If not every client arrived within `timeout_ms`.
    RuntimeError: If the coordination service reported another failure.
  """
  client = coordination_client()
  try:
    client.wait_at_barrier(barrier_id, int(timeout_ms))
  except Exception as e:  # JaxRuntimeError has no stable import path.
    if "DEADLINE_EXCEEDED" in str(e):
      raise BarrierTimeoutError(
          f"Barrier {barrier_id!r} timed out after {timeout_ms} ms: not every "
          "client arrived. A client that is slow, stuck, or has exited never "
          "reaches it; check the other clients' output.") from None
    raise RuntimeError(f"Barrier {barrier_id!r} failed: {e}") from None


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


def coordination_client() -> Any:
  """JAX's coordination-service client (multi-client runs).

  Raises:
    NotInitializedError: Without a multi-client runtime.
  """
  if "jax" not in sys.modules:
    raise NotInitializedError("No multi-client runtime: call "
                              "initialize_accelerator_system() first.")
  from jdtensor import _jax_private  # pylint: disable=g-import-not-at-top
  client = _jax_private.coordination_client()
  if client is None:
    raise NotInitializedError("No multi-client runtime: call "
                              "initialize_accelerator_system() first.")
  return client


def record_peer_failure(error: Exception) -> None:
  """Keeps a heartbeat failure to raise at the next jdtensor call."""
  with _lock:
    if _state.peer_failure is None:
      _state.peer_failure = error


def check_health() -> None:
  """Raises the recorded heartbeat failure (policy "raise"), if any."""
  if _state.peer_failure is not None:
    raise _state.peer_failure
