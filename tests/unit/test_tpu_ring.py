"""TPU ring orders: DTensor's DeviceAssignmentTest expectations, literally,
plus properties against DTensor's algorithm ported literally (tests/dtensor_ring_reference.py)."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import dtensor_ring_reference as dtensor
from jdtensor.tpu import ring
from jdtensor.tpu.ring import CoreLocation as L


def chips_with_cores(chips, cores=(0, 1), z=0):
  return [L(x, y, z, c) for x, y in chips for c in cores]


# -- _build_all_reduce_ring --------------------------------------------------------------

def test_ring_4_replicas():
  locs = [L(0, 0), L(0, 1), L(1, 0), L(1, 1)]
  perm = ring.build_all_reduce_ring(locs)
  assert perm == [0, 2, 3, 1]
  assert [locs[p] for p in perm] == [L(0, 0), L(1, 0), L(1, 1), L(0, 1)]


def test_ring_8_replicas_using_two_cores():
  locs = [L(x, y, 0, c) for y in range(2) for x in range(2) for c in range(2)]
  out = [locs[p] for p in ring.build_all_reduce_ring(locs)]
  assert out == chips_with_cores([(0, 0), (1, 0), (1, 1), (0, 1)])
  rotated = [locs[p] for p in ring.build_all_reduce_ring(locs, rotate=True)]
  assert rotated == chips_with_cores([(0, 0), (0, 1), (1, 1), (1, 0)])


def test_ring_32_replicas():
  locs = [L(x, y, 0, c) for y in range(4) for x in range(4) for c in range(2)]
  out = [locs[p] for p in ring.build_all_reduce_ring(locs)]
  assert out == chips_with_cores([
      (0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (2, 1), (1, 1), (1, 2), (2, 2),
      (3, 2), (3, 3), (2, 3), (1, 3), (0, 3), (0, 2), (0, 1)])


def test_ring_3d():
  locs = [L(x, y, z, c) for z in range(2) for y in range(2) for x in range(2)
          for c in range(2)]
  out = [locs[p] for p in ring.build_all_reduce_ring(locs)]
  assert out == [L(1, 0, 0, 0), L(1, 0, 0, 1), L(1, 1, 0, 0), L(1, 1, 0, 1),
                 L(0, 1, 0, 0), L(0, 1, 0, 1), L(0, 1, 1, 1), L(0, 1, 1, 0),
                 L(1, 1, 1, 1), L(1, 1, 1, 0), L(1, 0, 1, 1), L(1, 0, 1, 0),
                 L(0, 0, 1, 0), L(0, 0, 1, 1), L(0, 0, 0, 0), L(0, 0, 0, 1)]


def test_ring_3d_large():
  locs = [L(x, y, z, c) for z in range(2) for y in range(4) for x in range(4)
          for c in range(2)]
  out = [locs[p] for p in ring.build_all_reduce_ring(locs)]
  plane0 = [(1, 0), (2, 0), (3, 0), (3, 1), (2, 1), (1, 1), (1, 2), (2, 2), (3, 2),
            (3, 3), (2, 3), (1, 3), (0, 3), (0, 2), (0, 1)]
  plane1 = [(0, 1), (0, 2), (0, 3), (1, 3), (2, 3), (3, 3), (3, 2), (2, 2), (1, 2),
            (1, 1), (2, 1), (3, 1), (3, 0), (2, 0), (1, 0)]
  expected = (chips_with_cores(plane0, (0, 1), 0) +
              chips_with_cores(plane1, (1, 0), 1) +
              [L(0, 0, 1, 0), L(0, 0, 1, 1), L(0, 0, 0, 0), L(0, 0, 0, 1)])
  assert out == expected


def test_empty_ring():
  assert ring.build_all_reduce_ring([]) == []


# -- _build_orthogonal_rings -------------------------------------------------------------

BLOCKS = {(0, 0): [(0, 0), (1, 0), (1, 1), (0, 1)],
          (2, 0): [(2, 0), (3, 0), (3, 1), (2, 1)],
          (2, 2): [(2, 2), (3, 2), (3, 3), (2, 3)],
          (0, 2): [(0, 2), (1, 2), (1, 3), (0, 3)]}


@pytest.mark.parametrize("rotate,order", [
    (False, [(0, 0), (2, 0), (2, 2), (0, 2)]),
    (True, [(0, 0), (0, 2), (2, 2), (2, 0)])])
def test_orthogonal_rings(rotate, order):
  locs = ring.enumerate_core_locations([4, 4, 1, 2], [2, 2, 1, 2],
                                       ["core", "x", "y", "z"], False, 8)
  before = list(locs)
  out = ring.build_orthogonal_rings(locs, 8, rotate)
  assert locs == before  # Not modified in place (DTensor's is).
  expected = [l for block in order for l in chips_with_cores(BLOCKS[block])]
  assert out == expected
  assert out == dtensor.build_orthogonal_rings(list(locs), 8, rotate)


# -- _enumerate_core_locations ------------------------------------------------------------

def test_enumerate_2x2x1x2_split():
  out = ring.enumerate_core_locations([2, 2, 1, 2], [2, 2, 1, 2],
                                      ["core", "x", "y", "z"], True, 1)
  assert out == [L(0, 0, 0, 0), L(0, 0, 0, 1), L(1, 0, 0, 0), L(1, 0, 0, 1),
                 L(0, 1, 0, 0), L(0, 1, 0, 1), L(1, 1, 0, 0), L(1, 1, 0, 1)]


def test_create_df_mesh_splitting_hosts():
  out = ring.enumerate_core_locations([4, 4, 1, 2], [4, 4, 1, 2],
                                      ["core", "y", "z", "x"], True, 8)
  assert out == [L(x, y, 0, c) for x in range(4) for y in range(4) for c in range(2)]


def test_create_mesh_pf_splitting_hosts():
  out = ring.enumerate_core_locations([4, 4, 4, 2], [4, 4, 4, 2],
                                      ["core", "x", "y", "z"], True, 64)
  assert out == [L(x, y, z, c) for z in range(4) for y in range(4)
                 for x in range(4) for c in range(2)]


def test_create_df_mesh_no_splitting_hosts():
  out = ring.enumerate_core_locations([4, 4, 1, 2], [4, 4, 1, 2],
                                      ["core", "y", "z", "x"], False, 8)
  chips = [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3),
           (2, 0), (2, 1), (3, 0), (3, 1), (2, 2), (2, 3), (3, 2), (3, 3)]
  assert out == chips_with_cores(chips)


def test_create_df_mesh_with_ring_bounds_no_splitting_hosts():
  out = ring.enumerate_core_locations([4, 4, 1, 2], [2, 2, 1, 2],
                                      ["core", "x", "y", "z"], False, 8)
  chips = [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1),
           (0, 2), (1, 2), (0, 3), (1, 3), (2, 2), (3, 2), (2, 3), (3, 3)]
  assert out == chips_with_cores(chips)


@pytest.mark.parametrize("args,message", [
    (([2, 2, 1, 2], [2, 2, 1, 2], ["core", "x", "y", "z"], False, 4),
     "Rings too small for can_split_host_across_rings = False: 4"),
    (([2, 2, 1, 3], [2, 2, 1, 3], ["core", "x", "y", "z"], True, 4),
     "Unsupported TPU slice size: [2, 2, 1, 3]"),
    (([4, 4, 1, 2], [2, 1, 1, 2], ["core", "x", "y", "z"], False, 8),
     "ring_bounds [2, 2, 1, 1] should be >= host_bounds [2, 2, 2, 1]"),
])
def test_enumerate_errors(args, message):
  with pytest.raises(ValueError) as e:
    ring.enumerate_core_locations(*args)
  assert str(e.value) == message


def test_lexicographic_bound_bug_is_fixed():
  # ring_bounds [4, 1, 1, 2] vs host bounds [2, 2, 1, 2]: lexicographically
  # greater (4 > 2), so DTensor accepts it, but y = 1 < 2.
  args = ([4, 4, 1, 2], [4, 1, 1, 2], ["x", "y", "z", "core"], False, 8)
  with pytest.raises(ValueError) as e:
    ring.enumerate_core_locations(*args)
  assert str(e.value) == ("ring_bounds [4, 1, 1, 2] should be >= host_bounds "
                          "[2, 2, 1, 2]")
  # DTensor lets it through and emits duplicates and cores outside the slice.
  out = dtensor.enumerate_core_locations(*args)
  assert len(set(out)) < len(out) and max(l.y for l in out) == 4


def test_unclipped_host_bug_is_fixed():
  # A 2x1x1x2 slice is one host of 4 cores. DTensor assumes a 2x2-chip host
  # of 8 cores, which this slice cannot hold, and refuses every ring size.
  args = ([2, 1, 1, 2], [2, 1, 1, 2], ["core", "x", "y", "z"], False)
  out = ring.enumerate_core_locations(*args, 4)
  assert out == [L(0, 0, 0, 0), L(0, 0, 0, 1), L(1, 0, 0, 0), L(1, 0, 0, 1)]
  with pytest.raises(ValueError, match="Rings too small"):
    dtensor.enumerate_core_locations(*args, 4)
  with pytest.raises(ValueError, match="should be >= host_bounds"):
    dtensor.enumerate_core_locations(*args, 8)


# -- ring_order (create_tpu_mesh's ordering) ------------------------------------------------

def core_id(loc, topology):
  x, y, z, c = loc
  X, Y, _, C = topology
  return c + C * (x + X * (y + Y * z))


@pytest.mark.parametrize("topology,mesh,kwargs,ids", [
    ([2, 2, 1, 2], [2, 4], {}, list(range(8))),
    ([2, 2, 1, 2], [8], {"ring_dims": 1}, [0, 1, 2, 3, 6, 7, 4, 5]),
    ([2, 2, 1, 2], [8], {}, list(range(8))),
    ([2, 4, 1, 2], [2, 8], {},
     [0, 1, 2, 3, 6, 7, 4, 5, 8, 9, 10, 11, 14, 15, 12, 13]),
])
def test_ring_order_worked_examples(topology, mesh, kwargs, ids):
  out = ring.ring_order(topology, mesh, **kwargs)
  assert [core_id(l, topology) for l in out] == ids


@pytest.mark.parametrize("kwargs,message", [
    ({"mesh_shape": [2, 4], "ring_dims": 3}, "Invalid ring_dims value: 3"),
    ({"mesh_shape": [8], "ring_axes": ["x", "y"]},
     "Expected 4 elements in ring_axes, got ['x', 'y']"),
    ({"mesh_shape": [8], "ring_axes": ["x", "y", "z", "w"]},
     "Invalid ring_axes value: ['x', 'y', 'z', 'w']"),
    ({"mesh_shape": [8], "ring_bounds": [2, 2]},
     "Expected 4 elements in ring_bounds, got [2, 2]"),
    ({"mesh_shape": [8], "ring_bounds": [1, 9, 1, 1]},
     "ring_bounds [1, 9, 1, 1] should be <= topology sizes [2, 2, 1, 2]"),
    ({"mesh_shape": [4, 2], "ring_dims": -1, "can_split_host_across_rings": False},
     "Rings too small for can_split_host_across_rings = False: 2"),
    ({"mesh_shape": [4]}, "Invalid mesh size: mesh shape [4] cannot 1:1 map to 8 "
     "TPU cores"),
    ({"mesh_shape": [0, 8]}, "mesh_shape must be a list of positive ints, got [0, 8]."),
])
def test_ring_order_errors(kwargs, message):
  with pytest.raises(ValueError) as e:
    ring.ring_order([2, 2, 1, 2], **kwargs)
  assert str(e.value) == message


def test_ring_bounds_must_divide():
  with pytest.raises(ValueError, match=r"ring_bounds \[3, 2, 1, 2\] must divide "
                     r"the topology \[4, 2, 1, 2\]"):
    ring.ring_order([4, 2, 1, 2], [16], ring_bounds=[3, 2, 1, 2])


# -- properties --------------------------------------------------------------------------

@st.composite
def ring_cases(draw):
  topology = [draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4])),
              draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))]
  n = math.prod(topology)
  factors = [d for d in range(1, n + 1) if n % d == 0]
  first = draw(st.sampled_from(factors))
  mesh = [first, n // first]
  bounds = [draw(st.sampled_from([b for b in (1, 2, 4) if b <= t and t % b == 0]))
            for t in topology]
  return dict(topology_shape=topology, mesh_shape=mesh,
              ring_dims=draw(st.sampled_from([None, -1, 0, 1, 2, -2])),
              ring_axes=draw(st.permutations(["core", "x", "y", "z"])),
              ring_bounds=draw(st.sampled_from([None, bounds])),
              can_split_host_across_rings=draw(st.booleans()),
              build_ring_across_rings=draw(st.booleans()),
              rotate_ring_across_rings=draw(st.booleans()))


def _dtensor_ring_order(topology_shape, mesh_shape, ring_dims, ring_axes,
                        ring_bounds, can_split_host_across_rings,
                        build_ring_across_rings, rotate_ring_across_rings):
  """DTensor's create_tpu_mesh steps 2-9 on the literal port."""
  if ring_dims is None:
    ring_dims = 1 - len(mesh_shape)
  ring_bounds = ring_bounds or topology_shape
  size = (math.prod(mesh_shape[:ring_dims]) if ring_dims > 0 else
          math.prod(mesh_shape[ring_dims:]) if ring_dims < 0 else 1)
  locs = dtensor.enumerate_core_locations(topology_shape, ring_bounds, ring_axes,
                                          can_split_host_across_rings, size)
  if build_ring_across_rings:
    locs = dtensor.build_orthogonal_rings(locs, size, rotate_ring_across_rings)
  else:
    perm = dtensor.build_all_reduce_ring(locs[:size])
    locs = [locs[r + perm[i]] for r in range(0, len(locs), size)
            for i in range(size)]
  return [tuple(l) for l in locs]


@settings(max_examples=300, deadline=None)
@given(ring_cases())
def test_ring_order_matches_dtensor_and_is_a_permutation(case):
  try:
    ours = ring.ring_order(**case)
  except ValueError:
    return
  topology = case["topology_shape"]
  every = set(itertools.product(*[range(t) for t in topology]))
  assert len(ours) == len(every) and set(ours) == every
  bounds = case["ring_bounds"] or topology
  host_leaves_slice = (not case["can_split_host_across_rings"] and
                       math.prod(topology) > 2 and min(topology[:2]) == 1)
  if not host_leaves_slice:  # DTensor enumerates outside the slice there.
    assert ours == _dtensor_ring_order(**case)
  del bounds


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([2, 4, 6, 8]), st.sampled_from([2, 4, 6, 8]),
       st.sampled_from([1, 2]))
def test_2d_ring_neighbours_are_physical_neighbours(x_size, y_size, cores):
  locs = [L(x, y, 0, c) for y in range(y_size) for x in range(x_size)
          for c in range(cores)]
  out = np.array([locs[p] for p in ring.build_all_reduce_ring(locs)])
  hops = np.abs(np.diff(np.vstack([out, out[:1]]), axis=0))[:, :2].sum(axis=1)
  assert hops.max() == 1  # Every step, including the wrap-around, is one hop.


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([2, 4]), st.sampled_from([2, 4]), st.sampled_from([1, 2]),
       st.sampled_from([1, 2]))
def test_hosts_are_never_split_when_not_allowed(x_size, y_size, z_size, cores):
  topology = [x_size, y_size, z_size, cores]
  host = 4 * cores
  for ring_size in [r for r in (host, 2 * host, 4 * host)
                    if math.prod(topology) % r == 0]:
    locs = ring.enumerate_core_locations(topology, topology,
                                         ["core", "x", "y", "z"], False, ring_size)
    for start in range(0, len(locs), ring_size):
      block = locs[start:start + ring_size]
      hosts = {(l.x // 2, l.y // 2, l.z) for l in block}
      # Every host in this ring has all its cores in this ring.
      assert sum(1 for l in locs if (l.x // 2, l.y // 2, l.z) in hosts) == len(block)


def test_ring_order_16k_cores_is_fast():
  import time
  start = time.perf_counter()
  out = ring.ring_order([16, 16, 32, 2], [2, 8192])
  assert len(out) == 16384
  assert time.perf_counter() - start < 2.0  # Typically ~50 ms; generous for CI.
