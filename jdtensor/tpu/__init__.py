"""TPU support: ring orders (pure), topology and core-id merge, TPU meshes.

``jdtensor.tpu.ring_order`` is the pure ordering behind ``create_tpu_mesh``.
The names load on first use (PEP 562): the runtime imports
`jdtensor.tpu.topology` for its types without paying for the ring algorithms.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "CoreLocation",
    "build_all_reduce_ring",
    "build_orthogonal_rings",
    "enumerate_core_locations",
    "ring_order",
]

if TYPE_CHECKING:
  from jdtensor.tpu.ring import (  # noqa: F401
      CoreLocation,
      build_all_reduce_ring,
      build_orthogonal_rings,
      enumerate_core_locations,
      ring_order,
  )


def __getattr__(name: str) -> Any:
  if name in __all__:
    return getattr(importlib.import_module("jdtensor.tpu.ring"), name)
  raise AttributeError(f"module 'jdtensor.tpu' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(list(globals()) + __all__)
