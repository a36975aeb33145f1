"""TF DTensor's TPU ring algorithms, ported literally (``tpu_util.py``, TF 2.21).

Not used at run time. It is the oracle that the vectorised `jdtensor.tpu.ring`
is tested against, and the "DTensor pure Python" baseline in benchmarks/ (TF
itself is never a dependency). Quirks are kept on purpose: lexicographic
``ring_bounds`` checks, unclipped host bounds, and the in-place mutation in
`build_orthogonal_rings`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

__all__ = ["CoreLocation", "enumerate_core_locations", "build_all_reduce_ring",
           "build_orthogonal_rings"]


class CoreLocation(NamedTuple):
  x: int = 0
  y: int = 0
  z: int = 0
  core: int = 0


def _cumprods(xs: list[int]) -> list[int]:
  out = [1]
  for x in xs[:-1]:
    out.append(out[-1] * x)
  return out


def _enumerate_cores(bounds, ring_bounds, ring_sizes, host_bounds, host_sizes):
  if not bounds:
    return [[]]
  partials = _enumerate_cores(bounds[:-1], ring_bounds[:-1], ring_sizes[:-1],
                              host_bounds[:-1], host_sizes[:-1])
  results = []
  for ring_i in range(0, bounds[-1], ring_bounds[-1]):
    for ring_j in range(0, len(partials), ring_sizes[-1]):
      for host_i in range(ring_i, ring_i + ring_bounds[-1], host_bounds[-1]):
        for host_j in range(ring_j, ring_j + ring_sizes[-1], host_sizes[-1]):
          for i in range(host_i, host_i + host_bounds[-1]):
            for j in range(host_j, host_j + host_sizes[-1]):
              results.append(partials[j] + [i])
  return results


def enumerate_core_locations(bounds, ring_bounds, axes,
                             can_split_host_across_rings, ring_size):
  num_cores_per_chip = bounds[3]
  if num_cores_per_chip != 1 and num_cores_per_chip != 2:
    raise ValueError("Unsupported TPU slice size: %s" % bounds)
  axes = [{"x": 0, "y": 1, "z": 2, "core": 3}[axis] for axis in axes]
  bounds = [bounds[i] for i in axes]
  if can_split_host_across_rings:
    host_bounds = [1, 1, 1, 1]
  elif np.prod(bounds) <= 2:
    host_bounds = [[1, 1, 1, num_cores_per_chip][i] for i in axes]
  else:
    host_bounds = [[2, 2, 1, num_cores_per_chip][i] for i in axes]
  host_sizes = _cumprods(host_bounds)
  host_size = np.prod(host_bounds)
  if ring_size < host_size:
    raise ValueError("Rings too small for can_split_host_across_rings = "
                     "False: %d" % ring_size)
  ring_bounds = [ring_bounds[i] for i in axes]
  if ring_bounds < host_bounds:
    raise ValueError("ring_bounds %s should be >= host_bounds %s" %
                     (ring_bounds, host_bounds))
  ring_sizes = _cumprods(ring_bounds)
  cores = _enumerate_cores(bounds, ring_bounds, ring_sizes, host_bounds,
                           host_sizes)
  return [CoreLocation(c[axes.index(0)], c[axes.index(1)], c[axes.index(2)],
                       c[axes.index(3)]) for c in cores]


def build_all_reduce_ring(core_locations, rotate=False):
  permutation = list(range(len(core_locations)))
  if not permutation:
    return permutation
  first_column = min(l.x for l in core_locations)
  first_row = min(l.y for l in core_locations)
  same_z = len({l.z for l in core_locations}) == 1

  def _cmp_2d(ia, ib):
    a, b = core_locations[ia], core_locations[ib]
    if not rotate:
      a_first = a.x == first_column and a.y != first_row
      b_first = b.x == first_column and b.y != first_row
      if a_first != b_first:
        return -1 if b_first else 1
      if a.y != b.y:
        return b.y - a.y if a_first else a.y - b.y
      if a.x != b.x:
        return a.x - b.x if a.y % 2 == 0 else b.x - a.x
      return a.core - b.core
    a_first = a.y == first_row and a.x != first_column
    b_first = b.y == first_row and b.x != first_column
    if a_first != b_first:
      return -1 if b_first else 1
    if a.x != b.x:
      return b.x - a.x if a_first else a.x - b.x
    if a.y != b.y:
      return a.y - b.y if a.x % 2 == 0 else b.y - a.y
    return a.core - b.core

  def _cmp_3d(ia, ib):
    a, b = core_locations[ia], core_locations[ib]
    a_corner = a.x == first_column and a.y == first_row
    b_corner = b.x == first_column and b.y == first_row
    if a_corner and b_corner:
      return b.z - a.z if a.z != b.z else a.core - b.core
    if a_corner != b_corner:
      return -1 if b_corner else 1
    if a.z == b.z:
      return _cmp_2d(ia, ib) if a.z % 2 == 0 else -_cmp_2d(ia, ib)
    return a.z - b.z

  permutation.sort(key=functools.cmp_to_key(_cmp_2d if same_z else _cmp_3d))
  return permutation


def build_orthogonal_rings(core_locations, ring_size, rotate_ring_across_rings):
  num_cores = len(core_locations)
  permutation = build_all_reduce_ring(core_locations[:ring_size])
  for r in range(0, num_cores, ring_size):
    core_locations[r:r + ring_size] = [
        core_locations[r + permutation[i]] for i in range(ring_size)]
  transposed = []
  for i in range(ring_size):
    transposed += [core_locations[g + i] for g in range(0, num_cores, ring_size)]
  num_rings = int(num_cores / ring_size)
  permutation = build_all_reduce_ring(transposed[:num_rings],
                                      rotate=rotate_ring_across_rings)
  for r in range(0, num_cores, num_rings):
    transposed[r:r + num_rings] = [
        transposed[r + permutation[i]] for i in range(num_rings)]
  untransposed = []
  for i in range(num_rings):
    untransposed += [transposed[g + i] for g in range(0, num_cores, num_rings)]
  return untransposed
