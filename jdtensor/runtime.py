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

import re
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from absl import logging

from jdtensor import _env
from jdtensor.errors import AlreadyInitializedError, NotInitializedError

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
    init_seconds: Wall time `initialize` took.
  """

  device_type: str | None = None
  env: _env.ClusterEnv | None = None
  init_seconds: float = 0.0
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
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  return bool(xla_bridge.backends_are_initialized())


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


def client_devices(device_type: str, client: int) -> list[Any]:
  """The visible `device_type` devices of one client, in DTensor index order.

  Starts the backend. A type the backend does not have gives ``[]``.
  """
  key = (device_type.upper(), int(client))
  with _lock:
    cached = _state._device_table.get(key)  # pylint: disable=protected-access
    if cached is None:
      import jax  # pylint: disable=g-import-not-at-top
      platform = PLATFORMS.get(key[0])
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


def device_string(device: Any) -> str:
  """The DTensor device string of a ``jax.Device``."""
  device_type = {v: k for k, v in PLATFORMS.items()}.get(device.platform,
                                                         device.platform.upper())
  devices = client_devices(device_type, device.process_index)
  if device not in devices:
    raise ValueError(f"JAX device {device} is not a device jdtensor can use.")
  job = _state.env.job_name if _state.env else _env.job_name()
  return (f"/job:{job}/replica:0/task:{device.process_index}/device:"
          f"{device_type}:{devices.index(device)}")


def _local_device_count(device_type: str) -> int:
  if device_type == "CPU" and not backend_initialized():
    return configured_cpu_device_count()
  return len(client_devices(device_type, process_index()))


def initialize(device_type: str | None = None,
               num_logical_cpu_devices: int | None = None,
               experimental_reset_context: bool = False) -> str:
  """Sets up the runtime; see `jdtensor.initialize_accelerator_system`."""
  from jdtensor import config  # pylint: disable=g-import-not-at-top
  start = time.monotonic()
  with _lock:
    if is_initialized():
      # DTensor-compatible message.
      raise AlreadyInitializedError(
          "Accelerator system has already been initialized. Call "
          "tf.experimental.dtensor.shutdown_accelerator_system() first.")
    env = _env.read_cluster_env()
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
    if device_type != "CPU":
      n = _local_device_count(device_type)
      if num_logical_cpu_devices is None:
        num_logical_cpu_devices = max(configured_cpu_device_count(), n)
      elif num_logical_cpu_devices < n:
        # DTensor-compatible message.
        raise ValueError(
            f"If set, `num_logical_cpu_devices` (={num_logical_cpu_devices}) "
            "must be greater than or equal to the number of local "
            f"{device_type} devices (={n})")
    if not env.is_local_mode:
      raise NotImplementedError(
          "Multi-client initialisation is not available yet.")
    _set_cpu_device_count(num_logical_cpu_devices, experimental_reset_context)
    if not client_devices(device_type, process_index()):
      raise ValueError(
          f"initialize_accelerator_system({device_type!r}): this process has no "
          f"{device_type} devices. Use device_type='CPU', or run where "
          f"{device_type}s are attached.")
    _state.device_type = device_type
    _state.env = env
    _state.init_seconds = time.monotonic() - start
    logging.info("jdtensor initialised %s in %.3f s (client %d of %d)",
                 device_type, _state.init_seconds, env.client_id, env.num_clients)
    return device_type


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
    _state.device_type = None
    _state.env = None
