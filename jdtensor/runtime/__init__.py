"""The JAX runtime underneath jdtensor: the one package that owns its state.

Only this package calls ``jax.config.update`` and (for multi-client runs,
`startup`) ``jax.distributed.initialize``; other modules read its state
through the functions below, which act on the default `Runtime` (`state`),
and never assign to it. It holds the one cluster record
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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jdtensor import _env
from jdtensor.runtime.state import (PLATFORMS, Runtime, RuntimeState, StartupPlan,
                                    backend_initialized, process_index)

if TYPE_CHECKING:
  from jdtensor.tpu.topology import SimulatedTopology, Topology

__all__ = [
    "Runtime",
    "RuntimeState",
    "StartupPlan",
    "default",
    "state",
    "cluster",
    "is_initialized",
    "initialize",
    "shutdown",
    "backend_initialized",
    "cpu_device_count",
    "jax_platforms",
    "process_index",
    "client_devices",
    "device_string",
    "PLATFORMS",
    "simulated_tpu",
    "forget_devices",
    "register_tpu_mesh",
    "registered_tpu_mesh_devices",
    "next_auto_mesh_name",
    "record_peer_failure",
    "check_health",
]

_default = Runtime()


def default() -> Runtime:
  """The process's runtime (the one `initialize_accelerator_system` starts)."""
  return _default


def state() -> RuntimeState:
  """The current runtime state (read-only by convention)."""
  return _default.state


def cluster() -> _env.ClusterEnv | None:
  """Who this process is (`Runtime.cluster`); None before initialisation."""
  return _default.cluster()


def is_initialized() -> bool:
  """`Runtime.is_initialized` of the default runtime."""
  return _default.is_initialized()


def jax_platforms() -> tuple[str, ...] | None:
  """`Runtime.jax_platforms` of the default runtime."""
  return _default.jax_platforms()


def cpu_device_count(explicit_only: bool = False) -> int | None:
  """`Runtime.cpu_device_count` of the default runtime."""
  return _default.cpu_device_count(explicit_only)


def simulated_tpu() -> SimulatedTopology | None:
  """`Runtime.simulated_tpu` of the default runtime."""
  return _default.simulated_tpu()


def client_devices(device_type: str, client: int) -> list[Any]:
  """`Runtime.client_devices` of the default runtime."""
  return _default.client_devices(device_type, client)


def device_string(device: Any) -> str:
  """`Runtime.device_string` of the default runtime."""
  return _default.device_string(device)


def initialize(plan: StartupPlan,
               tpu_setup: Callable[[], Topology] | None = None) -> str:
  """`Runtime.initialize` of the default runtime."""
  return _default.initialize(plan, tpu_setup)


def shutdown() -> None:
  """`Runtime.shutdown` of the default runtime."""
  return _default.shutdown()


def forget_devices() -> None:
  """`Runtime.forget_devices` of the default runtime."""
  return _default.forget_devices()


def register_tpu_mesh(name: str, devices: list[Any]) -> None:
  """`Runtime.register_tpu_mesh` of the default runtime."""
  return _default.register_tpu_mesh(name, devices)


def registered_tpu_mesh_devices(name: str) -> list[Any] | None:
  """`Runtime.registered_tpu_mesh_devices` of the default runtime."""
  return _default.registered_tpu_mesh_devices(name)


def next_auto_mesh_name() -> str:
  """`Runtime.next_auto_mesh_name` of the default runtime."""
  return _default.next_auto_mesh_name()


def record_peer_failure(error: Exception) -> None:
  """`Runtime.record_peer_failure` of the default runtime."""
  return _default.record_peer_failure(error)


def check_health() -> None:
  """`Runtime.check_health` of the default runtime."""
  return _default.check_health()
