"""DTensor's configuration API (``tf.experimental.dtensor.client_id`` etc.).

Every function here can be called before `initialize_accelerator_system` and
none of them ever starts a JAX backend: device counts come from the configured
CPU device count, or, for GPU/TPU before start-up, from the device nodes the
driver exposes (``/dev/nvidia<N>``, ``/dev/accel<N>``, ``/dev/vfio/<N>``), as
TF's ``list_physical_devices`` does. Once the backend has started they count
the real devices.

Before initialisation the environment is read at call time (as DTensor
does) and parsed strictly; see `jdtensor._env` for the differences from TF.
After `initialize_accelerator_system` (or `initialize_multi_client_cluster`
with explicit arguments, or a detected cluster), every function answers from
the runtime's one cluster record instead, so "who am I" has one answer, the
one JAX runs with.
"""

from __future__ import annotations

from collections.abc import Mapping

from jdtensor import _device_nodes, _env, runtime
from jdtensor.device_spec import DEVICE_TYPES, DeviceSpec

__all__ = [
    "client_id",
    "num_clients",
    "job_name",
    "full_job_name",
    "jobs",
    "heartbeat_enabled",
    "local_devices",
    "num_local_devices",
    "num_global_devices",
    "preferred_device_type",
    "is_local_mode",
    "gpu_use_nccl_communication",
    "use_multi_device_mode",
]


def client_id() -> int:
  """This client's id, from ``DTENSOR_CLIENT_ID`` (default 0).

  Raises:
    ValueError: If it is not an integer in ``[0, num_clients())``.
  """
  cluster = runtime.cluster()
  return cluster.client_id if cluster else _env.client_id()


def num_clients() -> int:
  """The number of clients: entries in ``DTENSOR_JOBS``, or 1 in local mode.

  Raises:
    ValueError: If ``DTENSOR_JOBS`` is malformed, or the legacy
      ``DTENSOR_NUM_CLIENTS`` disagrees with it.
  """
  cluster = runtime.cluster()
  return cluster.num_clients if cluster else _env.num_clients()


def job_name() -> str:
  """``DTENSOR_JOB_NAME``; default ``localhost`` (1 client) or ``worker``."""
  cluster = runtime.cluster()
  return cluster.job_name if cluster else _env.job_name()


def full_job_name(task_id: int | None = None) -> str:
  """``{job_name}/replica:0/task:{task_id}`` (no leading ``/job:``, as DTensor).

  Args:
    task_id: The client id; defaults to `client_id()`.

  Raises:
    ValueError: DTensor's ``Unexpected task ID`` error for a non-zero task in
      a local run.
  """
  if task_id is None:
    task_id = client_id()
  if num_clients() == 1 and task_id != 0:
    # DTensor-compatible message.
    raise ValueError(f"Unexpected task ID {task_id} in local runs")
  return f"{job_name()}/replica:0/task:{task_id}"


def jobs() -> list[str]:
  """The ``DTENSOR_JOBS`` entries, in client order; ``[]`` in local mode."""
  cluster = runtime.cluster()
  return list(cluster.jobs) if cluster else _env.jobs()


def is_local_mode() -> bool:
  """True when ``DTENSOR_JOBS`` is unset or empty."""
  return not jobs()


def heartbeat_enabled() -> bool:
  """``DTENSOR_ENABLE_HEARTBEAT`` (default true)."""
  cluster = runtime.cluster()
  return (cluster.heartbeat_enabled if cluster else
          _env.read_bool(_env.DTENSOR_ENABLE_HEARTBEAT, True))


def gpu_use_nccl_communication() -> bool:
  """``DTENSOR_GPU_USE_NCCL_COMMUNICATION`` (default false).

  JAX always uses NCCL for GPU collectives; this is kept for compatibility.
  """
  cluster = runtime.cluster()
  return (cluster.gpu_use_nccl_communication if cluster else
          _env.read_bool(_env.DTENSOR_GPU_USE_NCCL_COMMUNICATION, False))


def use_multi_device_mode() -> bool:
  """``DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION`` (default false)."""
  return _env.read_bool(_env.DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION, False)


def _check_device_type(device_type: str) -> str:
  if not isinstance(device_type, str) or device_type.upper() not in DEVICE_TYPES:
    # DTensor-compatible message.
    raise ValueError(f"Device type {device_type} is not CPU, GPU, or TPU.")
  return device_type.upper()


def _physical_device_count(device_type: str,
                           environ: Mapping[str, str] | None = None) -> int:
  """GPUs/TPUs attached to this host, found without starting a backend."""
  if device_type == "GPU":
    count = _device_nodes.gpu_node_count()
    visible = _env.read_visible_gpu_limit(environ)
    return count if visible is None else min(count, visible)
  return _device_nodes.tpu_node_count()


def num_local_devices(device_type: str) -> int:
  """Number of `device_type` devices of this client.

  For CPU: the configured simulated device count. Never starts a backend.

  Raises:
    ValueError: If `device_type` is not CPU, GPU or TPU.
  """
  device_type = _check_device_type(device_type)
  if device_type == "CPU":
    return runtime.cpu_device_count()
  if device_type == "TPU":
    simulated = runtime.simulated_tpu()
    if simulated is not None:
      return simulated.cores_per_host
  if runtime.backend_initialized():
    return len(runtime.client_devices(device_type, runtime.process_index()))
  return _physical_device_count(device_type)


def num_global_devices(device_type: str) -> int:
  """`num_local_devices` times `num_clients` (every client alike, as DTensor)."""
  return num_local_devices(device_type) * num_clients()


def local_devices(device_type: str,
                  for_client_id: int | None = None) -> list[DeviceSpec]:
  """This client's devices as full DeviceSpecs, e.g. ``/job:localhost/replica:0/task:0/device:CPU:0``.

  Args:
    device_type: CPU, GPU or TPU (any case).
    for_client_id: Whose devices; defaults to `client_id()`.

  Raises:
    ValueError: DTensor's message for an unknown device type.
  """
  device_type = _check_device_type(device_type)
  if for_client_id is None:
    for_client_id = client_id()
  return [DeviceSpec(job=job_name(), replica=0, task=for_client_id,
                     device_type=device_type, device_index=i)
          for i in range(num_local_devices(device_type))]


def preferred_device_type() -> str:
  """The device type JAX will use: TPU if present, else GPU if present, else
  CPU; where JAX is limited to some platforms (``JAX_PLATFORMS``, or
  ``jax.config.jax_platforms``), the first of them this host has, in their
  order (``JAX_PLATFORMS=cpu`` on a GPU machine is a CPU run). Never starts a
  backend.

  A listed platform this host does not have is passed over; when none is
  present, the first listed (JAX will fail to start it, and
  `initialize_accelerator_system` says so). A simulated TPU slice
  (``JDTENSOR_SIMULATED_TPU_TOPOLOGY``) is TPU, whatever backs it.
  """
  if runtime.simulated_tpu() is not None:
    # A simulated slice is TPU whatever platform backs it (the CPU, which
    # JAX_PLATFORMS=cpu names); a malformed one raises its ConfigError here.
    return "TPU"
  platforms = runtime.jax_platforms()
  if platforms is None:
    candidates = ["TPU", "GPU"]
  else:
    candidates = list(dict.fromkeys(_env.PLATFORM_DEVICE_TYPES[p] for p in platforms
                                    if p in _env.PLATFORM_DEVICE_TYPES))
  for device_type in candidates:
    if device_type == "CPU" or num_local_devices(device_type):
      return device_type
  return candidates[0] if candidates and platforms is not None else "CPU"
