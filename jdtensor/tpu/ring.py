"""TPU ring orders for DTensor's ``create_tpu_mesh``, vectorised with numpy.

PURE: numpy only, no jax. Same results as TF DTensor's ``tpu_util.py``
(``_enumerate_core_locations``, ``_build_all_reduce_ring``,
``_build_orthogonal_rings``), bit for bit, with these deliberate fixes:

* ``ring_bounds`` are compared with the topology and the host bounds element
  by element. DTensor compares the lists lexicographically, so
  ``[1, 9, 1, 1]`` passes against ``[2, 2, 1, 1]`` and yields a wrong order.
  The messages are DTensor's.
* ``ring_bounds`` must divide the topology, and host bounds are clipped to the
  slice (a 2x1x1 slice is one host); DTensor enumerates coordinates outside
  the slice in both cases.
* Nothing is modified in place.

The ring comparator is replaced by an equivalent sort key (`_ring_key`), so
rings of 16k cores sort in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = [
    "CoreLocation",
    "enumerate_core_locations",
    "build_all_reduce_ring",
    "build_orthogonal_rings",
    "ring_order",
    "check_ring_dims",
    "check_ring_axes",
    "DEFAULT_RING_AXES",
]

DEFAULT_RING_AXES = ("core", "x", "y", "z")
_AXIS_INDEX = {"x": 0, "y": 1, "z": 2, "core": 3}


class CoreLocation(NamedTuple):
  """DTensor's ``_CoreLocation``: chip coordinates and core on the chip."""
  x: int = 0
  y: int = 0
  z: int = 0
  core: int = 0

  def to_list(self) -> list[int]:
    """``[x, y, z, core]``, DTensor's order."""
    return [self.x, self.y, self.z, self.core]


def _as_array(core_locations: Sequence[Sequence[int]]) -> np.ndarray:
  return np.asarray(core_locations, dtype=np.int64).reshape(-1, 4)


def _ring_key(locs: np.ndarray, rotate: bool) -> list[np.ndarray]:
  """lexsort keys (last = primary) equal to DTensor's ring comparator.

  2-D (rotate=False): cores in the first column, except the first row, go
  last, in descending y; the others go row by row, x ascending on even rows
  and descending on odd rows; then by core. rotate=True swaps x and y. 3-D:
  the corner column (first column and row) goes last in descending z; the
  rest plane by plane, each plane in 2-D order, reversed on odd z.
  """
  x, y, z, core = (locs[:, i] for i in range(4))
  first_column, first_row = x.min(), y.min()
  if rotate:
    x, y, first_column, first_row = y, x, first_row, first_column
  first = ((x == first_column) & (y != first_row)).astype(np.int64)
  major = np.where(first == 1, -y, y)
  minor = np.where(y % 2 == 0, x, -x)
  keys_2d = [first, major, minor, core]
  z = locs[:, 2]
  if (z == z[0]).all():
    return keys_2d[::-1]
  corner = (locs[:, 0] == locs[:, 0].min()) & (locs[:, 1] == locs[:, 1].min())
  sign = np.where(z % 2 == 0, 1, -1)
  zeros = np.zeros_like(z)
  keys_3d = [corner.astype(np.int64), np.where(corner, -z, z)]
  keys_3d += [np.where(corner, zeros, sign * k) for k in keys_2d[:3]]
  keys_3d.append(np.where(corner, core, sign * core))
  return keys_3d[::-1]


def build_all_reduce_ring(core_locations: Sequence[Sequence[int]],
                          rotate: bool = False) -> list[int]:
  """The permutation that orders `core_locations` into an all-reduce ring.

  Args:
    core_locations: (x, y, z, core) per core.
    rotate: Build the 2-D snake along y instead of x.

  Returns:
    ``perm`` such that ``[core_locations[p] for p in perm]`` is the ring.
  """
  locs = _as_array(core_locations)
  if not len(locs):
    return []
  return np.lexsort(_ring_key(locs, rotate)).tolist()


def _ring_permuted(locs: np.ndarray, ring_size: int) -> np.ndarray:
  """Applies the ring of the first block to every block of `ring_size`."""
  perm = np.lexsort(_ring_key(locs[:ring_size], False))
  return locs.reshape(-1, ring_size, 4)[:, perm].reshape(-1, 4)


def build_orthogonal_rings(core_locations: Sequence[Sequence[int]],
                           ring_size: int, rotate_ring_across_rings: bool
                           ) -> list[CoreLocation]:
  """DTensor's ``_build_orthogonal_rings``: rings, and rings across rings.

  Orders each block of `ring_size` into a ring, then orders the i-th members
  of all rings into rings too (optionally rotated). Does not modify its input.
  """
  locs = _as_array(core_locations)
  return [CoreLocation(*l) for l in
          _orthogonal(locs, ring_size, rotate_ring_across_rings).tolist()]


def _orthogonal(locs: np.ndarray, ring_size: int, rotate: bool) -> np.ndarray:
  num_rings = len(locs) // ring_size
  rings = _ring_permuted(locs, ring_size).reshape(num_rings, ring_size, 4)
  across = rings.transpose(1, 0, 2)  # across[i] = i-th member of every ring.
  perm = np.lexsort(_ring_key(across[0], rotate))
  return across[:, perm].transpose(1, 0, 2).reshape(-1, 4)


def _cumprods(xs: Sequence[int]) -> np.ndarray:
  return np.concatenate([[1], np.cumprod(xs[:-1])]).astype(np.int64)


def _enumerate(bounds: list[int], ring_bounds: list[int], host_bounds: list[int]
               ) -> np.ndarray:
  """DTensor's ``_enumerate_cores``, vectorised; lists in axes order.

  Order: ring blocks (bounded by `ring_bounds`), then host blocks inside a
  ring block, then plain mixed radix inside a host block; at every level the
  slowest axis varies slowest and axes[0] fastest. That is a sort of every
  coordinate by (ring block, host block, coordinate) digits per axis.
  """
  grids = np.meshgrid(*[np.arange(b) for b in bounds], indexing="ij")
  coords = np.stack([g.ravel() for g in grids], axis=1)
  keys = []
  # Primary key last for lexsort: ring blocks (slowest axis first), then host
  # blocks within the ring, then the coordinate within the host.
  ring_block = coords // np.array(ring_bounds)
  host_block = (coords % np.array(ring_bounds)) // np.array(host_bounds)
  inner = coords % np.array(host_bounds)
  for digits in (inner, host_block, ring_block):
    keys += [digits[:, a] for a in range(len(bounds))]
  return coords[np.lexsort(keys)]


def enumerate_core_locations(bounds: Sequence[int], ring_bounds: Sequence[int],
                             axes: Sequence[str],
                             can_split_host_across_rings: bool,
                             ring_size: int) -> list[CoreLocation]:
  """DTensor's ``_enumerate_core_locations``.

  Args:
    bounds: Topology ``[x, y, z, cores_per_chip]``.
    ring_bounds: Ring block ``[x, y, z, core]``.
    axes: Permutation of ``x, y, z, core``, fastest-varying first.
    can_split_host_across_rings: Whether a host's cores may span rings.
    ring_size: Number of cores per ring.

  Returns:
    Every core location, ring block by ring block.

  Raises:
    ValueError: DTensor's messages (unsupported slice, rings too small,
      ring_bounds below host bounds).
  """
  return [CoreLocation(*l) for l in _enumerate_locations(
      list(bounds), list(ring_bounds), list(axes), can_split_host_across_rings,
      ring_size).tolist()]


def _enumerate_locations(bounds: list[int], ring_bounds: list[int],
                         axes: list[str], can_split: bool, ring_size: int
                         ) -> np.ndarray:
  cores_per_chip = bounds[3]
  if cores_per_chip not in (1, 2):
    # DTensor-compatible message.
    raise ValueError("Unsupported TPU slice size: %s" % bounds)
  order = [_AXIS_INDEX[a] for a in axes]
  if can_split:
    host = [1, 1, 1, 1]
  elif math.prod(bounds) <= 2:
    host = [1, 1, 1, cores_per_chip]
  else:
    # DTensor's 2x2x1-chip hosts, clipped to the slice (DTensor does not clip).
    host = [min(2, bounds[0]), min(2, bounds[1]), 1, cores_per_chip]
  host_bounds = [host[i] for i in order]
  host_size = math.prod(host_bounds)
  if ring_size < host_size:
    # DTensor-compatible message.
    raise ValueError("Rings too small for can_split_host_across_rings = "
                     "False: %d" % ring_size)
  ring_in_axes = [ring_bounds[i] for i in order]
  if any(r < h for r, h in zip(ring_in_axes, host_bounds)):
    # DTensor's message; DTensor compares the lists lexicographically.
    raise ValueError("ring_bounds %s should be >= host_bounds %s" %
                     (ring_in_axes, host_bounds))
  bounds_in_axes = [bounds[i] for i in order]
  if any(b % r or r % h for b, r, h in zip(bounds_in_axes, ring_in_axes,
                                           host_bounds)):
    raise ValueError(
        f"ring_bounds {list(ring_bounds)} must divide the topology "
        f"{list(bounds)} and be a multiple of the host bounds (in "
        f"{list(axes)} order: {host_bounds}) in every axis.")
  cores = _enumerate(bounds_in_axes, ring_in_axes, host_bounds)
  return cores[:, [order.index(k) for k in range(4)]]


def check_ring_dims(ring_dims: int | None, mesh_shape: Sequence[int]) -> int:
  """DTensor's default (all dims but the first) and range check."""
  if ring_dims is None:
    ring_dims = 1 - len(mesh_shape)
  if not isinstance(ring_dims, int) or isinstance(ring_dims, bool):
    raise TypeError(f"ring_dims must be an int, got {ring_dims!r}.")
  if ring_dims < -len(mesh_shape) or ring_dims > len(mesh_shape):
    # DTensor-compatible message.
    raise ValueError("Invalid ring_dims value: %d" % ring_dims)
  return ring_dims


def check_ring_axes(ring_axes: Sequence[str] | None) -> list[str]:
  """DTensor's default (core, x, y, z) and checks."""
  if ring_axes is None:
    return list(DEFAULT_RING_AXES)
  if len(ring_axes) != 4:
    # DTensor-compatible message.
    raise ValueError("Expected 4 elements in ring_axes, got %s" % ring_axes)
  if sorted(ring_axes) != ["core", "x", "y", "z"]:
    # DTensor-compatible message.
    raise ValueError("Invalid ring_axes value: %s" % ring_axes)
  return list(ring_axes)


def _check_shape(name: str, shape: Sequence[int], length: int | None = None
                 ) -> list[int]:
  values = list(shape)
  if (not values or any(not isinstance(v, (int, np.integer)) or
                        isinstance(v, bool) or v < 1 for v in values) or
      (length is not None and len(values) != length)):
    want = f"{length} " if length else ""
    raise ValueError(f"{name} must be a list of {want}positive ints, got "
                     f"{shape!r}.")
  return [int(v) for v in values]


def ring_order(topology_shape: Sequence[int],
               mesh_shape: Sequence[int],
               ring_dims: int | None = None,
               ring_axes: Sequence[str] | None = None,
               ring_bounds: Sequence[int] | None = None,
               can_split_host_across_rings: bool = True,
               build_ring_across_rings: bool = False,
               rotate_ring_across_rings: bool = False
               ) -> list[tuple[int, int, int, int]]:
  """The (x, y, z, core) of each mesh device, in global device-id order.

  This is the pure part of DTensor's ``create_tpu_mesh``: the mesh's devices
  are the TPU cores in this order.

  Args:
    topology_shape: ``[X, Y, Z, cores_per_chip]`` of the slice.
    mesh_shape: The mesh shape; its size must equal the number of cores.
    ring_dims: Mesh dims that form rings: the first `ring_dims` if positive,
      the last ``-ring_dims`` if negative; default all but the first.
    ring_axes: Physical axes, fastest first; default ``core, x, y, z``.
    ring_bounds: Ring block in ``[x, y, z, core]``; default the topology.
    can_split_host_across_rings: Whether a host's cores may span rings.
    build_ring_across_rings: Also order the rings into rings.
    rotate_ring_across_rings: Rotate the rings across rings.

  Raises:
    ValueError: DTensor's messages, in DTensor's order.
  """
  mesh_shape = _check_shape("mesh_shape", mesh_shape)
  ring_dims = check_ring_dims(ring_dims, mesh_shape)
  axes = check_ring_axes(ring_axes)
  topology = _check_shape("topology_shape", topology_shape, 4)
  if ring_bounds is None:
    ring_bounds = topology
  if len(ring_bounds) != 4:
    # DTensor-compatible message.
    raise ValueError("Expected 4 elements in ring_bounds, got %s" % ring_bounds)
  bounds = _check_shape("ring_bounds", ring_bounds, 4)
  if any(r > t for r, t in zip(bounds, topology)):
    # DTensor's message; DTensor compares the lists lexicographically.
    raise ValueError("ring_bounds %s should be <= topology sizes %s" %
                     (bounds, topology))
  if ring_dims > 0:
    ring_size = math.prod(mesh_shape[:ring_dims])
  elif ring_dims < 0:
    ring_size = math.prod(mesh_shape[ring_dims:])
  else:
    ring_size = 1
  locs = _enumerate_locations(topology, bounds, axes,
                              can_split_host_across_rings, ring_size)
  if math.prod(mesh_shape) != len(locs):
    # DTensor-compatible message.
    raise ValueError("Invalid mesh size: mesh shape %s cannot 1:1 map to %d TPU "
                     "cores" % (list(mesh_shape), len(locs)))
  if build_ring_across_rings:
    locs = _orthogonal(locs, ring_size, rotate_ring_across_rings)
  else:
    locs = _ring_permuted(locs, ring_size)
  return list(map(tuple, locs.tolist()))
