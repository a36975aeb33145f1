"""jdtensor: TF DTensor's multi-client runtime, on JAX.

The public surface, with DTensor's names. Names are imported on first use
(PEP 562), so `import jdtensor` is cheap and never imports jax or starts a
backend; the launcher's parent process stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it.
_EXPORTS = {
    "AlreadyInitializedError": "jdtensor.errors",
    "BarrierTimeoutError": "jdtensor.errors",
    "ConfigError": "jdtensor.errors",
    "DeviceSpec": "jdtensor.device_spec",
    "JDTensorError": "jdtensor.errors",
    "Layout": "jdtensor.layout",
    "LayoutType": "jdtensor.layout",
    "MATCH": "jdtensor.layout",
    "Mesh": "jdtensor.layout",
    "MeshDimension": "jdtensor.layout",
    "NotInitializedError": "jdtensor.errors",
    "PeerFailureError": "jdtensor.errors",
    "StartupError": "jdtensor.errors",
    "StartupTimeoutError": "jdtensor.errors",
    "UNSHARDED": "jdtensor.layout",
    "barrier": "jdtensor.mesh_util",
    "call_with_layout": "jdtensor.api",
    "check_layout": "jdtensor.api",
    "copy_to_mesh": "jdtensor.api",
    "default_mesh": "jdtensor.api",
    "device_name": "jdtensor.api",
    "get_default_mesh": "jdtensor.api",
    "is_dtensor": "jdtensor.api",
    "relayout_like": "jdtensor.api",
    "run_on": "jdtensor.api",
    "client_id": "jdtensor.config",
    "create_distributed_mesh": "jdtensor.mesh_util",
    "create_mesh": "jdtensor.mesh_util",
    "create_tpu_mesh": "jdtensor.tpu.mesh",
    "dtensor_initialize_multi_client": "jdtensor.accelerator",
    "dtensor_initialize_tpu_system": "jdtensor.accelerator",
    "fetch_layout": "jdtensor.api",
    "full_job_name": "jdtensor.config",
    "get_device_ids": "jdtensor.tpu.mesh",
    "get_device_locations": "jdtensor.tpu.mesh",
    "heartbeat_enabled": "jdtensor.config",
    "initialize_accelerator_system": "jdtensor.accelerator",
    "initialize_multi_client": "jdtensor.accelerator",
    "initialize_multi_client_cluster": "jdtensor.accelerator",
    "initialize_tpu_system": "jdtensor.accelerator",
    "is_initialized": "jdtensor.accelerator",
    "job_name": "jdtensor.config",
    "jobs": "jdtensor.config",
    "local_devices": "jdtensor.config",
    "num_clients": "jdtensor.config",
    "num_global_devices": "jdtensor.config",
    "num_local_devices": "jdtensor.config",
    "pack": "jdtensor.api",
    "preferred_device_type": "jdtensor.config",
    "relayout": "jdtensor.api",
    "shutdown_accelerator_system": "jdtensor.accelerator",
    "shutdown_tpu_system": "jdtensor.accelerator",
    "step_done": "jdtensor.steps",
    "unpack": "jdtensor.api",
    "watch_thread": "jdtensor.heartbeat.watched",
}

if TYPE_CHECKING:  # Static view of the lazy names for type checkers and IDEs.
  from jdtensor.errors import (  # noqa: F401
      AlreadyInitializedError,
      BarrierTimeoutError,
      ConfigError,
      JDTensorError,
      NotInitializedError,
      PeerFailureError,
      StartupError,
      StartupTimeoutError,
  )
  from jdtensor.device_spec import (  # noqa: F401
      DeviceSpec,
  )
  from jdtensor.layout import (  # noqa: F401
      Layout,
      LayoutType,
      MATCH,
      Mesh,
      MeshDimension,
      UNSHARDED,
  )
  from jdtensor.mesh_util import (  # noqa: F401
      barrier,
      create_distributed_mesh,
      create_mesh,
  )
  from jdtensor.api import (  # noqa: F401
      call_with_layout,
      check_layout,
      copy_to_mesh,
      default_mesh,
      device_name,
      fetch_layout,
      get_default_mesh,
      is_dtensor,
      pack,
      relayout,
      relayout_like,
      run_on,
      unpack,
  )
  from jdtensor.config import (  # noqa: F401
      client_id,
      full_job_name,
      heartbeat_enabled,
      job_name,
      jobs,
      local_devices,
      num_clients,
      num_global_devices,
      num_local_devices,
      preferred_device_type,
  )
  from jdtensor.tpu.mesh import (  # noqa: F401
      create_tpu_mesh,
      get_device_ids,
      get_device_locations,
  )
  from jdtensor.accelerator import (  # noqa: F401
      dtensor_initialize_multi_client,
      dtensor_initialize_tpu_system,
      initialize_accelerator_system,
      initialize_multi_client,
      initialize_multi_client_cluster,
      initialize_tpu_system,
      is_initialized,
      shutdown_accelerator_system,
      shutdown_tpu_system,
  )
  from jdtensor.steps import (  # noqa: F401
      step_done,
  )
  from jdtensor.heartbeat.watched import (  # noqa: F401
      watch_thread,
  )


def __getattr__(name: str) -> Any:
  module = _EXPORTS.get(name)
  if module is None:
    raise AttributeError(f"module 'jdtensor' has no attribute {name!r}")
  value = getattr(importlib.import_module(module), name)
  globals()[name] = value  # Later lookups skip __getattr__.
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_EXPORTS))


# The public names are the keys of _EXPORTS (tests/test_architecture.py
# checks the TYPE_CHECKING imports above list the same).
__all__ = sorted(_EXPORTS)
