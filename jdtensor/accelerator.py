"""DTensor's accelerator-system entry points over the JAX runtime.

Environment variables read at initialisation (all parsed strictly):

* ``DTENSOR_JOBS``: comma-separated ``host:port`` per client, in client order.
  Unset or empty: local (single-client) mode. The first entry is the JAX
  coordinator's address; the other entries' ports are not used by JAX (its
  clients need no server port; gloo picks its own ports).
* ``DTENSOR_CLIENT_ID``: this client's index in ``DTENSOR_JOBS`` (default 0).
* ``DTENSOR_JOB_NAME``: job name in device strings (default ``localhost`` for
  one client, ``worker`` otherwise).
* ``DTENSOR_NUM_CLIENTS`` (legacy): if set, must equal ``len(DTENSOR_JOBS)``.
* ``DTENSOR_ENABLE_HEARTBEAT``: start the heartbeat in multi-client runs
  (default true); ``JDTENSOR_HEARTBEAT_PERIOD`` (default 2 s) and
  ``JDTENSOR_HEARTBEAT_POLICY`` (terminate, raise, log): see
  `jdtensor.heartbeat`.
* ``JDTENSOR_INIT_TIMEOUT`` (default 120 s), ``JDTENSOR_COORDINATION_TIMEOUT``
  (100 s; deprecated name ``JDTENSOR_HEARTBEAT_TIMEOUT``),
  ``JDTENSOR_SHUTDOWN_TIMEOUT`` (60 s): see `initialize_accelerator_system`.
* ``JDTENSOR_COORDINATOR_BIND_ADDRESS``: where client 0's coordinator listens
  (default: the host of ``DTENSOR_JOBS[0]``; loopback for ``localhost``).
* ``JDTENSOR_CLUSTER_DETECTION``: ``none`` (default), ``auto``, ``tpu``,
  ``slurm`` or ``ompi``; see `jdtensor.cluster`.
* ``JDTENSOR_SIMULATED_TPU_TOPOLOGY``: ``XxYxZxC``, simulate a TPU slice on
  CPU devices; see `jdtensor.tpu.topology`.

Mapping of TF concepts that JAX does not have:

* The *collective leader* (``/job:worker/replica:0/task:0``) is the JAX
  coordinator, which always runs in client 0 at ``DTENSOR_JOBS[0]``.
* TF's per-client gRPC *server port* (``DTENSOR_JOBS[i]`` for i > 0, or the
  ``port`` argument) has no JAX counterpart and is not used.
* ``enable_coordination_service``: JAX always runs its coordination service.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

from jdtensor import _device_nodes, _env, config, heartbeat, runtime
from jdtensor.heartbeat.process import install_exit_guard, tell_launcher_start_failed
from jdtensor import _logging as logging
from jdtensor._deadline import Deadline
from jdtensor.errors import (AlreadyInitializedError, ConfigError, StartupError,
                             inherited_client_message)

if TYPE_CHECKING:
  from jdtensor.tpu.topology import SimulatedTopology

# Start-up imports only what a CPU or GPU client needs (every client pays for
# each module it imports, and compiles it where no bytecode is cached): the
# TPU modules and cluster detection are imported where they are used.

__all__ = [
    "initialize_accelerator_system",
    "initialize_multi_client",
    "initialize_tpu_system",
    "shutdown_accelerator_system",
    "shutdown_tpu_system",
    "is_initialized",
    "dtensor_initialize_multi_client",
    "dtensor_initialize_tpu_system",
    "initialize_multi_client_cluster",
]


def initialize_accelerator_system(
    device_type: str | None = None,
    enable_coordination_service: bool | None = True,
    num_logical_cpu_devices: int | None = None,
    experimental_reset_context: bool | None = False,
    experimental_enable_megcore: bool | None = False,
    *,
    init_timeout: float | None = None,
    coordination_timeout: float | None = None,
    shutdown_timeout: float | None = None,
    coordinator_bind_address: str | None = None,
    cluster_detection: str | None = None,
    heartbeat_timeout: float | None = None,
) -> str:
  """Initialises the accelerator system (DTensor semantics, JAX underneath).

  In a multi-client run (``DTENSOR_JOBS`` lists several clients) this meets
  every client at ``DTENSOR_JOBS[0]`` and calls ``jax.distributed.initialize``
  with ``num_processes = len(DTENSOR_JOBS)``, ``process_id =
  DTENSOR_CLIENT_ID``, cluster auto-detection off and the coordinator bound
  to ``DTENSOR_JOBS[0]``'s host. Start-up failures (port taken, coordinator
  never up, a client missing, inconsistent clusters) raise `StartupError` /
  `StartupTimeoutError` instead of aborting the process.

  Must run before any JAX call that starts the backend, since the CPU device
  count and the distributed runtime can only be set before that.

  Args:
    device_type: CPU, GPU or TPU (any case); defaults to
      `jdtensor.preferred_device_type()`.
    enable_coordination_service: Kept for DTensor compatibility; JAX always
      uses its coordination service.
    num_logical_cpu_devices: Number of CPU devices for this client (JAX's
      ``jax_num_cpu_devices``). Not given: the count the environment gives
      JAX (``JAX_NUM_CPU_DEVICES``, ``XLA_FLAGS``'s
      ``--xla_force_host_platform_device_count``, as `jdtensor launch`
      ``--devices-per-client`` sets it), else 1; given, it must agree with
      that count (``ConfigError`` naming both). For GPU/TPU it defaults to at
      least the accelerator count, as in DTensor.
    experimental_reset_context: JAX cannot reset a running backend; with
      True, a running backend is kept (with DTensor's warning) instead of
      being an error (single-client only).
    experimental_enable_megcore: TPU megacore: one device per chip, core ids
      doubled (as DTensor).
    init_timeout: Seconds for the whole multi-client start-up
      (``JDTENSOR_INIT_TIMEOUT``, default 120).
    coordination_timeout: Seconds JAX's coordination service waits for a
      silent client before declaring it dead (``JDTENSOR_COORDINATION_TIMEOUT``,
      100). JAX's own heartbeat, not jdtensor's (`jdtensor.heartbeat`). A
      short one shortens jdtensor's stuck time-out and period when those are
      unset (``jax.distributed``'s ``heartbeat_timeout_seconds=5`` works
      as is); unset, it is lengthened to fit a long ``JDTENSOR_STUCK_TIMEOUT``.
    shutdown_timeout: Seconds the exit barrier waits for the other clients
      (``JDTENSOR_SHUTDOWN_TIMEOUT``, 60).
    coordinator_bind_address: Host (or host:port) client 0's coordinator
      listens on (``JDTENSOR_COORDINATOR_BIND_ADDRESS``). The coordination
      service has no authentication: widen this (e.g. ``0.0.0.0``) only on a
      trusted network.
    cluster_detection: ``none`` (default, DTensor semantics), ``auto``,
      ``tpu``, ``slurm`` or ``ompi`` (``JDTENSOR_CLUSTER_DETECTION``): fill in
      unset DTENSOR_JOBS/DTENSOR_CLIENT_ID from a TPU pod, SLURM or Open MPI
      environment (see `jdtensor.cluster`).
    heartbeat_timeout: Deprecated name of `coordination_timeout`.

  Returns:
    The initialised device type, upper-case.

  Raises:
    ValueError: DTensor's errors (already initialised, unknown device type,
      too few logical CPUs) and any invalid DTENSOR_*/JDTENSOR_* variable.
    StartupError: Multi-client start-up failed (see above).
    RuntimeError: If a running JAX backend prevents the requested set-up.
  """
  del enable_coordination_service  # See above.
  if heartbeat_timeout is not None:
    warnings.warn("heartbeat_timeout is deprecated: it is JAX's coordination-"
                  "service time-out; pass coordination_timeout.",
                  DeprecationWarning, stacklevel=2)
    if coordination_timeout is not None and coordination_timeout != heartbeat_timeout:
      raise ConfigError(
          f"coordination_timeout={coordination_timeout!r} and its deprecated name "
          f"heartbeat_timeout={heartbeat_timeout!r} disagree; pass only "
          "coordination_timeout.")
    coordination_timeout = heartbeat_timeout
  return _initialize(
      megacore=bool(experimental_enable_megcore),
      device_type=device_type,
      num_logical_cpu_devices=num_logical_cpu_devices,
      experimental_reset_context=bool(experimental_reset_context),
      init_timeout=init_timeout, coordination_timeout=coordination_timeout,
      shutdown_timeout=shutdown_timeout,
      coordinator_bind_address=coordinator_bind_address,
      cluster_detection=cluster_detection)


def shutdown_accelerator_system() -> None:
  """Shuts the accelerator system down (DTensor semantics).

  Multi-client runs cannot be shut down (as in DTensor; JAX shuts its
  distributed runtime down at exit with a barrier bounded by the shutdown
  timeout).

  Raises:
    ValueError: DTensor's messages if it is not initialised, or in a
      multi-client run.
  """
  runtime.shutdown()


def is_initialized() -> bool:
  """Whether the accelerator system is initialised."""
  return runtime.is_initialized()


def _initialize(device_type: str | None = None,
                num_logical_cpu_devices: int | None = None,
                experimental_reset_context: bool = False, *,
                cluster: _env.ClusterEnv | None = None,
                init_timeout: float | None = None,
                coordination_timeout: float | None = None,
                shutdown_timeout: float | None = None,
                coordinator_bind_address: str | None = None,
                megacore: bool = False,
                cluster_detection: str | None = None) -> str:
  """Resolves what to start (`_plan`), starts the runtime with the TPU system
  set-up, then installs the exit guard and the heartbeat (multi-client)."""
  # Read the heartbeat settings first: a bad value must fail before the
  # cluster forms, not after; every client must have the same.
  # A stuck time-out, period or coordination time-out left unset is derived
  # from those set, so that JAX's shortened heartbeat (its own test harness
  # passes 5 s) works with jdtensor's defaults.
  try:
    settings, coordination_timeout = _env.read_heartbeat_and_coordination(
        coordination=coordination_timeout)
    plan = _plan(device_type, num_logical_cpu_devices, experimental_reset_context,
                 cluster, init_timeout, coordination_timeout, shutdown_timeout,
                 coordinator_bind_address, cluster_detection, settings.handshake())
    device_type = runtime.initialize(plan, tpu_setup=lambda: _tpu_setup(plan, megacore))
  except AlreadyInitializedError:
    raise  # The runtime is up: its exit guard reports what ends the process.
  except Exception as error:
    tell_launcher_start_failed(error)
    raise
  tell_launcher_start_failed(None)
  if runtime.state().multi_client:
    install_exit_guard(heartbeat.current, at_clean_end=_forget_jax_objects)
    if plan.cluster.heartbeat_enabled:
      heartbeat.start_with(settings)
  return device_type


def _forget_jax_objects() -> None:
  """At a clean end: drops the JAX devices, meshes and compiled functions
  jdtensor caches, before JAX's exit handler clears its backends.

  Kept, they kept JAX's CPU backend alive until Python's finalisation cleared
  jdtensor's modules, and with it gloo's event loop, which wakes every 10 ms:
  through the whole finalisation instead of its first tenth as in raw JAX
  (about 300 more wake-ups a client at 32 clients on 2 cores).
  """
  from jdtensor.runtime import interop  # pylint: disable=g-import-not-at-top
  runtime.forget_devices()
  interop.forget_jax_objects()
  api = sys.modules.get("jdtensor.api")  # Never imported: nothing cached.
  if api is not None:
    api.forget_compiled_calls()


def _tpu_setup(plan: runtime.StartupPlan, megacore: bool) -> Any:
  from jdtensor.tpu import system as tpu_system  # pylint: disable=g-import-not-at-top
  return tpu_system.initialize(plan.cluster, plan.simulated_tpu, megacore)


def _plan(device_type: Any, num_logical_cpu_devices: Any,
          reset_requested: bool, cluster: _env.ClusterEnv | None,
          init_timeout: float | None, coordination_timeout: float | None,
          shutdown_timeout: float | None, coordinator_bind_address: Any,
          cluster_detection: str | None,
          agreed: dict[str, object]) -> runtime.StartupPlan:
  """Every argument and variable of `initialize_accelerator_system`, checked
  (DTensor's order and messages), as the runtime's `StartupPlan`."""
  if runtime.is_initialized():
    inherited = _env.read_inherited_client()
    if inherited is not None:
      # A 'fork' child of an initialised client: a copy of its runtime.
      raise StartupError(inherited_client_message(os.getpid(), inherited[1],
                                                  inherited[0]))
    # DTensor-compatible message.
    raise AlreadyInitializedError(
        "Accelerator system has already been initialized. Call "
        "tf.experimental.dtensor.shutdown_accelerator_system() first.")
  if cluster is None:
    # Detection fills in only what the user left unset. It does not write
    # os.environ: the config functions answer from the runtime's record once
    # initialised, and child processes get the exports only when asked
    # (`jdtensor env`).
    exports = {}
    if cluster_detection is not None or _env.detection_method() != "none":
      from jdtensor import cluster as _cluster  # pylint: disable=g-import-not-at-top
      exports = _cluster.resolve(method=cluster_detection)
    if exports:
      logging.info("jdtensor: cluster detected: %s", exports)
    cluster = _env.read_cluster_env(overrides=exports)
  timeouts = _env.read_timeouts(init=init_timeout, coordination=coordination_timeout,
                                shutdown=shutdown_timeout)
  deadline = Deadline(timeouts.init)
  # Parsed now: a bad value fails before the cluster forms, naming itself.
  bind = _env.read_bind_override(coordinator_bind_address)
  secret = _env.read_run_secret()
  if device_type is None:
    device_type = config.preferred_device_type()
  if not isinstance(device_type, str):
    raise TypeError(f"device_type must be a str, got {device_type!r}.")
  device_type = device_type.upper()
  if device_type not in runtime.PLATFORMS:
    # DTensor-compatible message.
    raise ValueError(f"Unknown device_type {device_type}. Allowed values are "
                     "CPU, GPU, or TPU")
  if num_logical_cpu_devices is not None and (
      not isinstance(num_logical_cpu_devices, int) or
      isinstance(num_logical_cpu_devices, bool) or num_logical_cpu_devices < 1):
    raise ValueError("num_logical_cpu_devices must be a positive int, got "
                     f"{num_logical_cpu_devices!r}.")
  cpu_devices = num_logical_cpu_devices
  if device_type == "CPU" and cpu_devices is not None:
    # The count the environment gives JAX must agree (the launcher's rule).
    _env.resolve_cpu_device_count(cpu_devices, "num_logical_cpu_devices")
  simulated = None
  if device_type == "TPU":
    from jdtensor.tpu.topology import read_simulated_topology  # pylint: disable=g-import-not-at-top
    simulated = read_simulated_topology()
  if simulated is not None:
    cpu_devices = _simulated_cpu_devices(simulated, cluster, cpu_devices)
  elif device_type != "CPU":
    n = config.num_local_devices(device_type)
    if cpu_devices is None:
      cpu_devices = max(runtime.cpu_device_count(), n)
    elif cpu_devices < n:
      # DTensor-compatible message.
      raise ValueError(
          f"If set, `num_logical_cpu_devices` (={cpu_devices}) must be greater "
          f"than or equal to the number of local {device_type} devices (={n})")
  if device_type == "CPU" or simulated is not None:
    local_devices = cpu_devices or runtime.cpu_device_count()
  else:
    local_devices = config.num_local_devices(device_type)
  gpus: tuple[_device_nodes.GpuIdentity, ...] = ()
  if device_type == "GPU" and cluster.num_clients > 1:
    # Compared at the handshake: two clients on one GPU fail NCCL's first
    # collective, so they are refused unless the user allows it.
    agreed = {**agreed, _env.JDTENSOR_SHARE_GPUS: _env.read_bool(
        _env.JDTENSOR_SHARE_GPUS, False)}
    gpus = _device_nodes.gpu_identities(_env.process_environ(), _env.read_visible_gpus())
  return runtime.StartupPlan(
      device_type=device_type, cluster=cluster, timeouts=timeouts,
      deadline=deadline, cpu_devices=cpu_devices, reset_requested=reset_requested,
      local_devices=local_devices, bind=bind, secret=secret, agreed=agreed,
      simulated_tpu=simulated, gpus=gpus)


def _simulated_cpu_devices(sim: SimulatedTopology, cluster: _env.ClusterEnv,
                           requested: int | None) -> int:
  """Checks a simulated TPU slice against the cluster; its CPU device count."""
  name = f"{_env.JDTENSOR_SIMULATED_TPU_TOPOLOGY}={sim.text!r}"
  if sim.num_hosts != cluster.num_clients:
    raise ConfigError(
        f"{name} has {sim.num_hosts} host(s) of {sim.cores_per_host} cores, but "
        f"there are {cluster.num_clients} client(s) in DTENSOR_JOBS; run one "
        f"client per host (`jdtensor launch -n {sim.num_hosts} "
        f"--devices-per-client {sim.cores_per_host}`).")
  have = requested if requested is not None else runtime.cpu_device_count(
      explicit_only=True)
  if have is not None and have != sim.cores_per_host:
    raise ConfigError(
        f"{name} gives each host {sim.cores_per_host} cores, but this client is "
        f"configured for {have} CPU devices (num_logical_cpu_devices, "
        "JAX_NUM_CPU_DEVICES or the launcher's --devices-per-client); use "
        f"{sim.cores_per_host}.")
  return sim.cores_per_host


# DTensor's aliases.
initialize_multi_client = initialize_accelerator_system
initialize_tpu_system = initialize_accelerator_system
shutdown_tpu_system = shutdown_accelerator_system


def dtensor_initialize_multi_client(
    enable_coordination_service: bool | None = False) -> None:
  """The seed's ``dtensor_initialize_multi_client`` (TF 2.9/2.10).

  Multi-client mode when ``DTENSOR_JOB_NAME`` is not ``localhost`` (2.9) or
  when there is more than one client (2.10). As in 2.9, a
  ``DTENSOR_NUM_CLIENTS`` other than 1 with job name ``localhost`` is an
  error. Initialises the preferred device type.

  Raises:
    ValueError: The seed's messages, and any invalid DTENSOR_* variable.
  """
  legacy = _env.read_legacy_num_clients()
  name = _env.read_seed_job_name()
  if name == "localhost" and legacy is not None and legacy != 1:
    # Seed-compatible message (TF 2.9).
    raise ValueError("DTENSOR_NUM_CLIENTS is set and not 1, while "
                     "DTENSOR_JOB_NAME is set to localhost for single client "
                     "mode.")
  if name != "localhost" or _env.num_clients() > 1:
    initialize_multi_client_cluster(
        job_name=_env.job_name(), dtensor_jobs=_env.jobs(),
        client_id=_env.client_id(),
        collective_leader=f"{_env.job_name()}/replica:0/task:0",
        enable_coordination_service=enable_coordination_service)
  else:
    initialize_accelerator_system()


def dtensor_initialize_tpu_system(enable_coordination_service: bool = False
                                  ) -> None:
  """The seed's ``dtensor_initialize_tpu_system`` (TF 2.9/2.10), on JAX.

  Multi-client when ``DTENSOR_JOB_NAME`` is not ``localhost`` (its default
  here, as in the seed): the cluster comes from ``DTENSOR_JOBS`` and
  ``DTENSOR_CLIENT_ID`` through `initialize_multi_client_cluster`. Then
  DTensor's TPU system set-up: local core ids, merged across clients by a
  psum (simulated TPU slices work too).

  Raises:
    ValueError: The seed's message when ``DTENSOR_JOBS`` is missing in
      multi-client mode, and any invalid DTENSOR_* variable.
  """
  name = _env.read_seed_job_name()
  if name != "localhost":
    jobs = _env.jobs()
    if not jobs:
      # Seed-compatible message (the missing space is the seed's).
      raise ValueError("DTENSOR_JOBS environment variable is required when"
                       "using multi-client to properly set up communications "
                       "between servers")
    initialize_multi_client_cluster(
        job_name=name, dtensor_jobs=jobs, client_id=_env.client_id(),
        collective_leader=f"{name}/replica:0/task:0",
        enable_coordination_service=enable_coordination_service,
        _device_type="TPU")
  else:
    initialize_accelerator_system("TPU")


def initialize_multi_client_cluster(job_name: str,
                                    dtensor_jobs: list[str],
                                    client_id: int,
                                    collective_leader: str,
                                    port: int | None = None,
                                    enable_coordination_service: bool = False,
                                    *, _device_type: str | None = None
                                    ) -> None:
  """The seed's ``initialize_multi_client_cluster`` (TF 2.10), on JAX.

  Args:
    job_name: Job name of every client.
    dtensor_jobs: ``host:port`` of every client; the first is the JAX
      coordinator.
    client_id: This client's id.
    collective_leader: Must name task 0 (the JAX coordinator), with or without
      the ``/job:`` prefix.
    port: TF's gRPC server port of this client; JAX has none, so it is not
      used.
    enable_coordination_service: Kept for compatibility (always on in JAX).

  Raises:
    ValueError: The seed's messages, in the seed's order, then bad arguments.
  """
  del port, enable_coordination_service  # No JAX counterpart (module docstring).
  # Seed-compatible checks and messages (TF 2.10 multi_client_util).
  if runtime.is_initialized():
    raise ValueError("Multi-client mode has already been initialized.")
  legacy = _env.read_legacy_num_clients()
  n = legacy if legacy is not None else len(dtensor_jobs)
  if n <= 1:
    raise ValueError("DTENSOR_NUM_CLIENTS must be set greater than 1 for "
                     "multi-client mode.")
  if not dtensor_jobs or len(dtensor_jobs) <= 1:
    raise ValueError("DTENSOR_JOBS environment variable is required when using "
                     "multi-client mode to properly set up communications "
                     "between servers.")
  if len(dtensor_jobs) != n:
    raise ValueError("DTENSOR_JOBS environment variable must be configured with "
                     "the same number of items as DTENSOR_NUM_CLIENTS.")
  jobs = _env.parse_jobs(",".join(dtensor_jobs))
  leader = collective_leader.removeprefix("/job:")
  if leader not in (f"{job_name}/replica:0/task:0", f"{job_name}/task:0"):
    raise ConfigError(
        f"collective_leader={collective_leader!r}: in jdtensor the collective "
        f"leader is the JAX coordinator, task 0 ('/job:{job_name}/replica:0/"
        "task:0').")
  if not isinstance(client_id, int) or not 0 <= client_id < len(jobs):
    raise ConfigError(f"client_id={client_id!r} must be an int in "
                      f"[0, {len(jobs)}).")
  _env.job_name({_env.DTENSOR_JOB_NAME: job_name})  # Validates the name.
  cluster = _env.ClusterEnv(
      jobs=tuple(jobs), num_clients=len(jobs), client_id=client_id,
      job_name=job_name, heartbeat_enabled=_env.read_bool(
          _env.DTENSOR_ENABLE_HEARTBEAT, True),
      gpu_use_nccl_communication=False)
  _initialize(cluster=cluster, device_type=_device_type)
