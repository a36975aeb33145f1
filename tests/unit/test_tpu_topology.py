"""TPU topology maths: simulated slices, core ids, and real-TPU devices (fakes)."""

import itertools
from dataclasses import dataclass

import pytest

from jdtensor.errors import ConfigError
from jdtensor.tpu import ring
from jdtensor.tpu import topology as T


def test_simulated_topology_hosts():
  sim = T.read_simulated_topology({"JDTENSOR_SIMULATED_TPU_TOPOLOGY": "4x4x1x2"})
  assert sim.shape == (4, 4, 1, 2) and sim.num_hosts == 4 and sim.cores_per_host == 8
  # Host 1 is the next 2x2 block along x; cores fastest, then x, then y.
  assert sim.host_locations(1) == [(2, 0, 0, 0), (2, 0, 0, 1), (3, 0, 0, 0),
                                   (3, 0, 0, 1), (2, 1, 0, 0), (2, 1, 0, 1),
                                   (3, 1, 0, 0), (3, 1, 0, 1)]
  assert sim.host_core_ids(1) == [4, 5, 6, 7, 12, 13, 14, 15]
  assert sim.host_core_ids(2)[:2] == [16, 17]  # y = 2 block.
  one = T.read_simulated_topology({"JDTENSOR_SIMULATED_TPU_TOPOLOGY": "2x1x1x2"})
  assert one.num_hosts == 1 and one.cores_per_host == 4  # Clipped to the slice.
  three_d = T.read_simulated_topology({"JDTENSOR_SIMULATED_TPU_TOPOLOGY": "2x2x2x1"})
  assert three_d.num_hosts == 2 and three_d.host_locations(1)[0] == (0, 0, 1, 0)
  assert T.read_simulated_topology({}) is None


@pytest.mark.parametrize("raw,fragment", [
    ("4x4x1", "is not a TPU slice shape"),
    ("4x4x0x2", "is not a TPU slice shape"),
    ("axbxcxd", "is not a TPU slice shape"),
    ("2x2x1x4", "TPU chips have 1 or 2 cores, got 4."),
    ("2x3x1x1", "the y size must be 1 or even, got 3."),
])
def test_simulated_topology_errors(raw, fragment):
  with pytest.raises(ConfigError) as e:
    T.read_simulated_topology({"JDTENSOR_SIMULATED_TPU_TOPOLOGY": raw})
  assert str(e.value).startswith(f"JDTENSOR_SIMULATED_TPU_TOPOLOGY={raw!r}")
  assert fragment in str(e.value)


def test_core_id_round_trip():
  bounds = [4, 2, 3, 2]
  ids = list(range(48))
  locs = T.core_ids_to_locations(ids, bounds)
  assert [T.core_id(*l, bounds) for l in locs] == ids
  assert locs[9] == (0, 1, 0, 1)


def test_build_topology():
  sim = T.SimulatedTopology((2, 4, 1, 2))
  merged = [i for h in range(2) for i in sim.host_core_ids(h)]
  topo = T.build_topology(merged, sim.shape, 2)
  assert topo.mesh_shape == (2, 4, 1, 2)
  assert topo.device_coordinates.shape == (2, 8, 4)
  assert topo.device_coordinates[1, 0].tolist() == [0, 2, 0, 0]
  assert topo.task_ordinal()[(1, 3, 0, 1)] == (1, 7)


@dataclass(frozen=True)
class FakeTpu:
  """A real TPU device as JAX describes it (cannot exist on this machine)."""
  id: int
  process_index: int
  coords: tuple
  core_on_chip: int


def test_device_core_ids_from_jax_devices():
  # A v3-style 2x2 slice with 2 cores per chip on one host, ids in runtime order.
  devices = [FakeTpu(i, 0, (x, y, 0), c) for i, (y, x, c) in enumerate(
      (y, x, c) for y in range(2) for x in range(2) for c in range(2))]
  bounds, ids = T.device_core_ids(devices[::-1])  # Input order does not matter.
  assert bounds == [2, 2, 1, 2]
  assert ids == list(range(8))


@dataclass(frozen=True)
class FakeSliceTpu(FakeTpu):
  slice_index: int = 0


def _multislice(num_slices, x, y, z, cores, hosts_per_slice):
  """Devices of `num_slices` x-by-y-by-z slices, processes slice by slice."""
  devices = []
  per_slice = x * y * z * cores
  for s in range(num_slices):
    for i, (zz, yy, xx, c) in enumerate(itertools.product(
        range(z), range(y), range(x), range(cores))):
      host = s * hosts_per_slice + i * hosts_per_slice // per_slice
      devices.append(FakeSliceTpu(len(devices), host, (xx, yy, zz), c, s))
  return devices


@pytest.mark.parametrize("num_slices,shape", [(2, (4, 2, 1, 1)), (3, (2, 2, 2, 2)),
                                              (4, (4, 4, 1, 1))])
def test_multislice_stacks_slices_along_z_onto_the_outer_mesh_axis(num_slices, shape):
  x, y, z, cores = shape
  devices = _multislice(num_slices, x, y, z, cores, hosts_per_slice=2)
  bounds, ids = T.device_core_ids(devices)
  assert bounds == [x, y, z * num_slices, cores]
  assert sorted(ids) == list(range(len(devices)))  # unique: the merge works
  # Each slice's cores are one z-block, and a mesh whose outer axis is the
  # slice count holds one whole slice per index (ICI rings stay inside).
  per_slice = len(devices) // num_slices
  order = ring.ring_order(bounds, [num_slices, per_slice])
  for s in range(num_slices):
    assert {loc[2] // z for loc in order[s * per_slice:(s + 1) * per_slice]} == {s}
  topo = T.build_topology(ids, bounds, num_slices * 2)
  assert topo.device_coordinates.shape == (num_slices * 2, per_slice // 2, 4)


def test_multislice_slices_of_different_shapes_are_refused():
  devices = _multislice(2, 2, 2, 1, 1, 1)
  devices[-1] = FakeSliceTpu(devices[-1].id, 1, (2, 1, 0), 0, 1)
  with pytest.raises(ValueError, match=r"The TPU slices differ in shape \(slice 0: "
                     r"2x2x1x1, slice 1: 3x2x1x1\); a multi-slice mesh needs "
                     "slices of one topology."):
    T.device_core_ids(devices)
