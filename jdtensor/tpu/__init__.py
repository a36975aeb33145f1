"""TPU support: ring orders (pure), topology and core-id merge, TPU meshes.

``jdtensor.tpu.ring_order`` is the pure ordering behind ``create_tpu_mesh``.
"""

from jdtensor.tpu.ring import (
    CoreLocation,
    build_all_reduce_ring,
    build_orthogonal_rings,
    enumerate_core_locations,
    ring_order,
)

__all__ = [
    "CoreLocation",
    "build_all_reduce_ring",
    "build_orthogonal_rings",
    "enumerate_core_locations",
    "ring_order",
]
