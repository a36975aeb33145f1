"""Layout: DTensor's checks, string format and shape arithmetic."""

import pickle

import numpy as np
import pytest

from jdtensor import MATCH, UNSHARDED, DeviceSpec, Layout, LayoutType, Mesh

CPU = "/job:localhost/replica:0/task:0/device:CPU:%d"
MESH = "|batch=2,x=2|0,1,2,3|0,1,2,3|" + ",".join(CPU % i for i in range(4))


@pytest.fixture
def mesh():
  return Mesh.from_string(MESH)


def test_string_formats(mesh):
  assert Layout(["batch", UNSHARDED], mesh).to_string() == (
      "sharding_specs:batch,unsharded, mesh:" + MESH)
  assert Layout([], mesh).to_string() == "sharding_specs: mesh:" + MESH
  assert Layout(["x", "batch"], mesh).to_parted().to_string() == (
      "parted:x,batch, mesh:" + MESH)
  assert Layout.from_device(CPU % 0).to_string() == (
      "maximal:true, mesh:" + CPU % 0)


@pytest.mark.parametrize("s", [
    "sharding_specs:batch,x, mesh:" + MESH,
    "sharding_specs:unsharded,unsharded, mesh:" + MESH,
    "sharding_specs:unsharded, mesh:" + MESH,
    "sharding_specs: mesh:" + MESH,
    "parted:x,batch, mesh:" + MESH,
    "maximal:true, mesh:" + CPU % 0,
    "sharding_specs:match,unsharded, mesh:" + MESH,
    "empty_layout",
])
def test_round_trip(s):
  layout = Layout.from_string(s)
  assert layout.to_string() == s
  assert pickle.loads(pickle.dumps(layout)) == layout


def test_empty_spec_differs_from_single_unsharded():
  a = Layout.from_string("sharding_specs:unsharded, mesh:" + MESH)
  b = Layout.from_string("sharding_specs: mesh:" + MESH)
  assert a != b and a.rank == 1 and b.rank == 0


def test_types(mesh):
  assert Layout(["x"], mesh).type == LayoutType.STATIC
  assert Layout(["x"], mesh).to_parted().type == LayoutType.PARTED
  single = Layout.from_device(CPU % 0)
  assert single.type == LayoutType.SINGLE_DEVICE and single.is_single_device()
  assert Layout.from_single_device_mesh(Mesh.from_device(CPU % 0)) == single


def test_constructor_errors(mesh):
  with pytest.raises(ValueError) as e:
    Layout(["x"], "mesh")
  assert str(e.value) == "mesh is not a valid Mesh object."
  with pytest.raises(ValueError) as e:
    Layout(["x", "x"], mesh)
  assert str(e.value) == ("Mesh dimension x was repeated in sharding "
                          "specification ['x', 'x']. Mesh dimensions must be "
                          "unique in a layout.")
  for bad in ("z", "any", "scalar"):
    with pytest.raises(ValueError) as e:
      Layout([bad], mesh)
    assert str(e.value) == (f"{bad}: A dimension sharding must either be a "
                            "valid mesh dimension or UNSHARDED.")
  with pytest.raises(ValueError) as e:
    Layout([MATCH, MATCH], mesh)
  assert str(e.value) == ("Attempted to shard two or more tensor dimensions "
                          "over mesh dimension match")
  with pytest.raises(TypeError, match="sharding_specs must hold str"):
    Layout([1], mesh)


@pytest.mark.parametrize("s,message", [
    ("foo", "Expected 2 items but found 1foo"),
    ("a b c", "Expected 2 items but found 3a"),
    ("sharding_specs:z, mesh:" + MESH,
     "sharding spec (z) refers to mesh dimension not contained in mesh " + MESH),
    ("sharding_specs:x,x, mesh:" + MESH,
     "Attempted to shard two or more tensor dimensions over mesh dimension x"),
])
def test_from_string_dtensor_errors(s, message):
  with pytest.raises(ValueError) as e:
    Layout.from_string(s)
  assert str(e.value) == message


@pytest.mark.parametrize("s,fragment", [
    ("sharding_specs:x mesh:" + MESH, "every sharding spec must be followed by a comma"),
    ("specs:x, mesh:" + MESH, "must start with 'sharding_specs:', 'parted:'"),
    ("sharding_specs:x, msh:" + MESH, "the second part must start with 'mesh:'"),
    ("sharding_specs:x,,y, mesh:" + MESH, "has an empty sharding spec"),
    ("sharding_specs:x, mesh:|x=2", "Expected either 5, 6, 7 or 3 mesh parts"),
])
def test_from_string_clear_errors(s, fragment):
  with pytest.raises(ValueError) as e:
    Layout.from_string(s)
  assert fragment in str(e.value)


def test_constructors_and_shards(mesh):
  assert Layout.replicated(mesh, 2).sharding_specs == [UNSHARDED, UNSHARDED]
  dp = Layout.batch_sharded(mesh, "batch", 3)
  assert dp.sharding_specs == ["batch", UNSHARDED, UNSHARDED]
  assert dp.num_shards(0) == mesh.dim_size("batch") and dp.num_shards(1) == 1
  assert Layout.batch_sharded(mesh, "x", 3, axis=1).sharding_specs == [
      UNSHARDED, "x", UNSHARDED]
  assert Layout.inner_sharded(mesh, "x", 2).sharding_specs == [UNSHARDED, "x"]
  assert Layout([MATCH], mesh).num_shards(0) == -1
  assert dp.is_batch_parallel() and not dp.is_fully_replicated()
  assert Layout.replicated(mesh, 2).is_fully_replicated()
  assert dp.shape == [2, 2] and dp.rank == 3 and dp.mesh == mesh
  with pytest.raises(ValueError, match="axis=3 is out of range for rank=3"):
    Layout.batch_sharded(mesh, "x", 3, axis=3)
  with pytest.raises(ValueError, match="rank must be a non-negative int"):
    Layout.replicated(mesh, -1)


def test_shape_arithmetic(mesh):
  layout = Layout(["batch", "x", UNSHARDED], mesh)
  assert layout.global_shape_from_local_shape((1, 3, 5)) == (2, 6, 5)
  assert layout.local_shape_from_global_shape((2, 6, 5)) == (1, 3, 5)
  yx = Layout(["x", "batch"], mesh)
  assert yx.local_shape_from_global_shape([4, 6]) == (2, 3)
  with pytest.raises(ValueError, match=r"axis 0 has size 3, which does not divide"):
    yx.local_shape_from_global_shape([3, 6])
  with pytest.raises(ValueError, match="has rank 1, but the layout has rank 2"):
    yx.local_shape_from_global_shape([4])


def test_offset_to_shard(mesh):
  layout = Layout(["x", UNSHARDED, "batch"], mesh)
  assert layout.offset_to_shard() == [(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1)]
  assert layout.offset_tuple_to_global_index((1, 0, 1)) == 3


def test_delete(mesh):
  layout = Layout(["x", UNSHARDED, "batch"], mesh)
  assert layout.delete(1).sharding_specs == ["x", "batch"]
  assert layout.delete([0, 2]).sharding_specs == [UNSHARDED]


def test_equality_hash_repr(mesh):
  a, b = Layout(["x", "batch"], mesh), Layout(["x", "batch"], mesh)
  assert a == b and hash(a) == hash(b) and a != a.to_parted()
  assert repr(a) == f"Layout.from_string({a.to_string()})"
  assert "batch" in repr(Layout(["batch", UNSHARDED], mesh))


def test_device_spec_round_trip():
  for s in ["/job:worker/replica:0/task:1/device:CPU:0", "/device:GPU:3",
            "/job:a/task:2/device:TPU:*"]:
    assert DeviceSpec.from_string(s).to_string() == s
  assert DeviceSpec.from_string("CPU:1") == DeviceSpec(device_type="CPU",
                                                       device_index=1)
  assert DeviceSpec.from_string("/device:tpu:0").device_type == "TPU"
  assert DeviceSpec.from_string("/cpu:0").to_string() == "/device:CPU:0"
  with pytest.raises(ValueError, match="Unknown attribute 'foo'"):
    DeviceSpec.from_string("/foo:1")
  with pytest.raises(ValueError, match="task 'x' is not a non-negative integer"):
    DeviceSpec.from_string("/job:a/task:x")
  with pytest.raises(ValueError, match="Multiple device types"):
    DeviceSpec.from_string("/CPU:0/GPU:1")
  with pytest.raises(ValueError, match=r"job name 'wor\\x00' is not a valid job name"):
    DeviceSpec.from_string("/job:wor\x00/replica:0/task:0/device:CPU:0")
  with pytest.raises(ValueError, match="job name '' is not a valid job name"):
    DeviceSpec.from_string("/job:/task:0/device:CPU:0")
  with pytest.raises(ValueError, match="device type 'C-PU' is not a valid name"):
    DeviceSpec.from_string("/job:a/task:0/device:C-PU:0")
  assert repr(DeviceSpec.from_string("CPU:0")) == (
      "<DeviceSpec(job=None, replica=None, task=None, device_type=CPU, "
      "device_index=0)>")
  merged = DeviceSpec("w", 0, 1).make_merged_spec(DeviceSpec(device_type="CPU",
                                                             device_index=2))
  assert merged.to_string() == "/job:w/replica:0/task:1/device:CPU:2"


def test_global_ids_are_read_only(mesh):
  ids = mesh.global_device_ids()
  ids[0, 0] = 99
  np.testing.assert_array_equal(mesh.global_device_ids(), [[0, 1], [2, 3]])
