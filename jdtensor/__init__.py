"""jdtensor: TF DTensor's multi-client runtime, on JAX.

The public surface, with DTensor's names. Importing jdtensor never imports
jax and never starts a backend; only the runtime calls do.
"""

from jdtensor.accelerator import (
    initialize_accelerator_system,
    initialize_multi_client,
    initialize_tpu_system,
    is_initialized,
    shutdown_accelerator_system,
    shutdown_tpu_system,
)
from jdtensor.config import (
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
from jdtensor.device_spec import DeviceSpec
from jdtensor.errors import (
    AlreadyInitializedError,
    ConfigError,
    JDTensorError,
    NotInitializedError,
    StartupError,
    StartupTimeoutError,
)
from jdtensor.layout import MATCH, UNSHARDED, Layout, LayoutType, Mesh, MeshDimension
from jdtensor.mesh_util import create_mesh

__version__ = "0.1.0"

__all__ = [
    "AlreadyInitializedError",
    "ConfigError",
    "DeviceSpec",
    "JDTensorError",
    "Layout",
    "LayoutType",
    "MATCH",
    "Mesh",
    "MeshDimension",
    "NotInitializedError",
    "StartupError",
    "StartupTimeoutError",
    "UNSHARDED",
    "client_id",
    "create_mesh",
    "full_job_name",
    "heartbeat_enabled",
    "initialize_accelerator_system",
    "initialize_multi_client",
    "initialize_tpu_system",
    "is_initialized",
    "job_name",
    "jobs",
    "local_devices",
    "num_clients",
    "num_global_devices",
    "num_local_devices",
    "preferred_device_type",
    "shutdown_accelerator_system",
    "shutdown_tpu_system",
]
