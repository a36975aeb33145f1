"""jdtensor: TF DTensor's multi-client runtime, on JAX.

The public surface, with DTensor's names. Importing jdtensor never imports
jax and never starts a backend; only the runtime calls do.
"""

from jdtensor.accelerator import (
    dtensor_initialize_multi_client,
    initialize_accelerator_system,
    initialize_multi_client_cluster,
    initialize_multi_client,
    initialize_tpu_system,
    is_initialized,
    shutdown_accelerator_system,
    shutdown_tpu_system,
)
from jdtensor.api import call_with_layout, fetch_layout, pack, relayout, unpack
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
    BarrierTimeoutError,
    NotInitializedError,
    PeerFailureError,
    StartupError,
    StartupTimeoutError,
)
from jdtensor.layout import MATCH, UNSHARDED, Layout, LayoutType, Mesh, MeshDimension
from jdtensor.mesh_util import barrier, create_distributed_mesh, create_mesh
from jdtensor.tpu.mesh import create_tpu_mesh, get_device_ids, get_device_locations

__version__ = "0.1.0"

__all__ = [
    "AlreadyInitializedError",
    "BarrierTimeoutError",
    "ConfigError",
    "DeviceSpec",
    "JDTensorError",
    "Layout",
    "LayoutType",
    "MATCH",
    "Mesh",
    "MeshDimension",
    "NotInitializedError",
    "PeerFailureError",
    "StartupError",
    "StartupTimeoutError",
    "UNSHARDED",
    "barrier",
    "call_with_layout",
    "client_id",
    "create_distributed_mesh",
    "create_mesh",
    "create_tpu_mesh",
    "dtensor_initialize_multi_client",
    "fetch_layout",
    "full_job_name",
    "get_device_ids",
    "get_device_locations",
    "heartbeat_enabled",
    "initialize_accelerator_system",
    "initialize_multi_client",
    "initialize_multi_client_cluster",
    "initialize_tpu_system",
    "is_initialized",
    "job_name",
    "jobs",
    "local_devices",
    "num_clients",
    "num_global_devices",
    "num_local_devices",
    "pack",
    "preferred_device_type",
    "relayout",
    "shutdown_accelerator_system",
    "shutdown_tpu_system",
    "unpack",
]
