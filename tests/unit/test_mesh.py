"""Mesh: DTensor's 13 constructor checks, API, and exact string formats."""

import copy
import pickle

import numpy as np
import pytest

from jdtensor import DeviceSpec, Mesh, MeshDimension

CPU = "/job:localhost/replica:0/task:0/device:CPU:%d"
TPU = "/job:localhost/replica:0/task:0/device:TPU:%d"
MESH_2D_TPU = "|batch=2,x=2|0,1,2,3|0,1,2,3|" + ",".join(TPU % i for i in range(4))


def cpu(n):
  return [CPU % i for i in range(n)]


def ids(*shape):
  return np.arange(int(np.prod(shape))).reshape(shape)


# -- the 13 checks, in DTensor's order ----------------------------------------------

@pytest.mark.parametrize("args,kwargs,message", [
    ((["x"], [0, 1], [0, 1], cpu(2)), {},
     "Variable global_device_ids must be an ndarray."),
    ((["x"], np.array([], np.int64), [], cpu(1)), {},
     "Variable global_device_ids must be non-empty."),
    ((["x"], np.array([1, 0]), [0, 1], cpu(2)), {},
     "global_device_ids must sequentially increase: [1 0]"),
    ((["x"], np.array([0, 2]), [0, 1], cpu(2)), {},
     "global_device_ids must sequentially increase: [0 2]"),
    ((["x", "y"], ids(2), [0, 1], cpu(2)), {},
     "Number of mesh dimensions does not match number of dimension names."),
    ((["x"], ids(2), (0, 1), cpu(2)), {},
     "Variable local_device_ids must be a list of integers."),
    ((["x"], ids(2), [0, 1], tuple(cpu(2))), {},
     "Variable local_devices must be a list of DeviceSpecs."),
    ((["x"], ids(2), [], []), {"global_devices": tuple(cpu(2))},
     "Variable global_devices must be a list of DeviceSpecs."),
    ((["x"], ids(2), [], []), {}, "Empty list of devices not allowed."),
    ((["x"], ids(4), [0, 1, 2, 3], cpu(2) * 2), {},
     "Duplicate devices found in mesh specification "
     f"{[CPU % 0, CPU % 1, CPU % 0, CPU % 1]}."),
    ((["x"], ids(2), [0], cpu(2)), {},
     "Variable local_device_ids does not have same size as local_devices."),
    ((["x"], ids(2), [0, 1, 2], cpu(3)), {},
     "Cannot have more local than gobal device IDs."),
    ((["x"], ids(2), [0, 1], ["/job:a/task:0", "/job:a/task:1"]), {},
     "device_type is required"),
    ((["x"], ids(2), [0, 1], [CPU % 0, TPU % 0]), {},
     "Devices containing multiple device_types : {'CPU', 'TPU'}"),
    ((["x"], ids(2), [0, 1], cpu(2)), {"use_xla_spmd": True},
     "XLA SPMD is not currently not supported for CPU mesh."),
    ((["x"], ids(2), [0, 1], [s.replace("CPU", "GPU") for s in cpu(2)]),
     {"use_xla_spmd": True},
     "XLA SPMD is not currently not supported for GPU mesh."),
], ids=["not-ndarray", "empty", "flipped", "gap", "ndim", "ids-tuple",
        "devices-tuple", "global-tuple", "no-devices", "duplicates", "size",
        "more-local", "no-type", "mixed-types", "spmd-cpu", "spmd-gpu"])
def test_constructor_checks(args, kwargs, message):
  with pytest.raises(ValueError) as e:
    Mesh(*args, **kwargs)
  assert str(e.value) == message


def test_check_order_first_failure_wins():
  # Both "not ndarray" and "empty devices" are wrong: check 1 fires first.
  with pytest.raises(ValueError, match="must be an ndarray"):
    Mesh(["x"], [0], [], [])
  # Dim-count (4) is checked before local ids type (5).
  with pytest.raises(ValueError, match="Number of mesh dimensions"):
    Mesh(["x", "y"], ids(2), (0,), [])


def test_repeated_single_host_cpu_is_allowed():
  mesh = Mesh(["x"], ids(2), [0, 1], [CPU % 0, CPU % 0])
  assert mesh.local_devices() == [CPU % 0, CPU % 0]


def test_nonzero_start_allowed():
  mesh = Mesh(["x"], np.array([4, 5]), [4, 5], cpu(2), mesh_name="off")
  assert mesh.to_string() == "off|x=2|4,5|4,5|" + ",".join(cpu(2))
  assert mesh.min_global_device_id() == 4


def test_beyond_dtensor_local_ids_must_be_global_ids():
  with pytest.raises(ValueError, match=r"contains 5, which is not a global device id"):
    Mesh(["x"], ids(2), [0, 5], cpu(2))
  with pytest.raises(TypeError, match="local_device_ids must hold ints"):
    Mesh(["x"], ids(2), [0, "1"], cpu(2))
  with pytest.raises(TypeError, match="local_devices must hold DeviceSpec"):
    Mesh(["x"], ids(1), [0], [3])


# -- API ---------------------------------------------------------------------------------

@pytest.fixture
def mesh_2d():
  return Mesh.from_string(MESH_2D_TPU)


def test_api(mesh_2d):
  m = mesh_2d
  assert m.dim_names == ["batch", "x"]
  assert m.name == ""
  assert m.size == 4
  assert m.shape() == [2, 2]
  assert m.dim_size("x") == 2
  assert m["batch"] == MeshDimension("batch", 2) and m["x"] == ("x", 2)
  assert m.contains_dim("batch") and "x" in m and "y" not in m
  assert m.device_type() == "TPU"
  assert m.local_device_ids() == [0, 1, 2, 3]
  np.testing.assert_array_equal(m.global_device_ids(), [[0, 1], [2, 3]])
  assert m.global_device_ids().dtype == np.int64
  assert m.local_devices() == [TPU % i for i in range(4)]
  assert m.global_devices() == []
  assert m.num_local_devices() == 4
  assert m.min_global_device_id() == 0
  assert not m.is_remote()
  assert not m.use_xla_spmd()
  assert not m.is_single_device()
  assert m.unravel_index() == {0: {"batch": 0, "x": 0}, 1: {"batch": 0, "x": 1},
                               2: {"batch": 1, "x": 0}, 3: {"batch": 1, "x": 1}}
  assert m.local_device_locations()[3] == {"batch": 1, "x": 1}
  assert m.device_location(3) == [1, 1]


def test_dim_size_error_message(mesh_2d):
  with pytest.raises(ValueError) as e:
    mesh_2d.dim_size("q")
  assert str(e.value) == ("Dimension q does not exist in mesh.Available "
                          "dimensions: batch,x")
  with pytest.raises(ValueError, match="Dimension q does not exist"):
    mesh_2d["q"]  # pylint: disable=pointless-statement


def test_device_location_error():
  m = Mesh(["x"], ids(2), [0, 1], cpu(2))
  with pytest.raises(ValueError) as e:
    m.device_location(5)
  assert str(e.value) == ("Mesh offset cannot be negative or exceed Mesh's "
                          "size. Offset size:5 and Mesh size:2")


@pytest.mark.parametrize("shape,strides", [((8,), [1]), ((2, 4, 2), [8, 2, 1]),
                                           ((8, 16, 2, 4), [128, 8, 4, 1])])
def test_strides(shape, strides):
  n = int(np.prod(shape))
  m = Mesh([f"d{i}" for i in range(len(shape))], ids(*shape), list(range(n)),
           cpu(n))
  assert m.strides == strides


def test_coords_wrap():
  m = Mesh(["a", "b", "c"], ids(2, 4, 2), list(range(16)), cpu(16))
  for idx in range(48):
    np.testing.assert_array_equal(m.coords(idx),
                                  np.unravel_index(idx % 16, (2, 4, 2)))


def test_is_remote():
  m = Mesh(["x"], ids(2), [], [], global_devices=cpu(2))
  assert m.is_remote()
  assert m.to_string() == "|x=2|0,1|||" + ",".join(cpu(2))


def test_host_mesh_drops_name():
  gpu = [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(8)]
  m = Mesh(["batch", "x"], ids(4, 2), list(range(8)), gpu,
           mesh_name="name_not_preserved")
  assert m.host_mesh() == Mesh(["batch", "x"], ids(4, 2), list(range(8)), cpu(8))


def test_equality_counts_name_and_hash():
  a = Mesh(["x"], ids(2), [0, 1], cpu(2))
  b = Mesh(["x"], ids(2), [0, 1], cpu(2), mesh_name="n")
  assert a == Mesh(["x"], ids(2), [0, 1], cpu(2))
  assert hash(a) == hash(Mesh(["x"], ids(2), [0, 1], cpu(2)))
  assert a != b and hash(a) != hash(b)
  assert a != "not a mesh"


def test_pickle_and_copy(mesh_2d):
  assert pickle.loads(pickle.dumps(mesh_2d)) == mesh_2d
  c = copy.copy(mesh_2d)
  assert c == mesh_2d


def test_repr():
  m = Mesh(["batch", "x"], ids(4, 2), list(range(8)), cpu(8))
  assert repr(m) == f"Mesh.from_string({m.to_string()})"
  assert "batch=4,x=2" in repr(m) and "CPU:0" in repr(m) and "CPU:7" in repr(m)


def test_device_spec_objects_accepted():
  specs = [DeviceSpec("localhost", 0, 0, "CPU", i) for i in range(2)]
  assert Mesh(["x"], ids(2), [0, 1], specs).local_devices() == cpu(2)


# -- strings written by TF 2.21 (literal, from the reference) --------------------

TF_STRINGS = [
    "|x=2,y=2|0,1,2,3|0,1,2,3|" + ",".join(cpu(4)),
    "named|b=4|0,1,2,3|0,1,2,3|" + ",".join(cpu(4)),
    "|x=2|0,1|0,1|" + TPU % 0 + "," + TPU % 1 + "|use_xla_spmd",
    "gm|x=2,y=4|0,1,2,3,4,5,6,7|4,5,6,7|" + ",".join(
        f"/job:localhost/replica:0/task:1/device:GPU:{i}" for i in range(4)),
    "off|x=2|4,5|4,5|" + ",".join(cpu(2)),
    "|batch=4|0,1,2,3|2,3|/job:worker/replica:0/task:1/device:CPU:0,"
    "/job:worker/replica:0/task:1/device:CPU:1",
    "|batch=4,model=2|0,1,2,3,4,5,6,7|2,3|/job:worker/replica:0/task:1/device:"
    "CPU:0,/job:worker/replica:0/task:1/device:CPU:1",
    "|x=2,y=1|0,1|1|/job:worker/replica:0/task:1/device:CPU:0",
    "|x=2|0,1|||" + ",".join(cpu(2)),
    MESH_2D_TPU,
    "|batch=2|0,1|0|" + TPU % 0 + "|" + TPU % 0 + "," + TPU % 1 + "|use_xla_spmd",
    "empty_mesh",
    CPU % 0,
]


@pytest.mark.parametrize("s", TF_STRINGS)
def test_tf_strings_round_trip(s):
  assert Mesh.from_string(s).to_string() == s
  assert pickle.loads(pickle.dumps(Mesh.from_string(s))).to_string() == s


def test_constructed_equals_parsed():
  m = Mesh(["batch", "x"], ids(2, 2), [0, 1, 2, 3], [TPU % i for i in range(4)])
  assert Mesh.from_string(MESH_2D_TPU) == m
  assert m.to_string() == MESH_2D_TPU


def test_use_xla_spmd_strings():
  m = Mesh.from_string("|batch=2|0,1|0,1|" + TPU % 0 + "," + TPU % 1 +
                       "|use_xla_spmd")
  assert m.use_xla_spmd()
  m7 = Mesh.from_string(TF_STRINGS[10])
  assert m7.use_xla_spmd() and m7.local_device_ids() == [0]
  assert m7.global_devices() == [TPU % 0, TPU % 1]


def test_three_part_test_form():
  m = Mesh.from_string("|x=2,y=2|*TPU")
  assert m.local_devices() == [f"/job:localhost/task:0/device:TPU:{i}"
                               for i in range(4)]
  assert m.to_string() == ("|x=2,y=2|0,1,2,3|0,1,2,3|" + ",".join(
      f"/job:localhost/task:0/device:TPU:{i}" for i in range(4)))


def test_single_device_and_empty():
  m = Mesh.from_string(CPU % 0)
  assert m.is_single_device() and m.single_device == CPU % 0
  assert m.size == 0 and m.device_type() == "CPU"
  assert Mesh.from_device("job:localhost/replica:0/task:0/TPU:0").to_string() == (
      TPU % 0)
  e = Mesh.from_string("empty_mesh")
  assert e.to_string() == "empty_mesh" and e.size == 0 and e.device_type() == ""


@pytest.mark.parametrize("s,message", [
    ("a|b", "Expected either 5, 6, 7 or 3 mesh parts but found2"),
    ("a|b|c|d|e|f|g|h", "Expected either 5, 6, 7 or 3 mesh parts but found8"),
    ("|x=2,x=2|0,1,2,3|0,1,2,3|" + ",".join(cpu(4)), "repeated mesh dimension"),
    ("|unsharded=2|0,1|0,1|" + ",".join(cpu(2)),
     "mesh dimension name unsharded is reserved"),
    ("|match=2|0,1|0,1|" + ",".join(cpu(2)), "mesh dimension name match is reserved"),
    ("|any=2|0,1|0,1|" + ",".join(cpu(2)), "mesh dimension name any is reserved"),
    ("|x=2|0,1|0,1|" + CPU % 0,
     "number of global_device_ids 2 local_devices ids 2 and local devices 1not "
     "meeting requirements"),
    ("|x=4|0,1,2,3|0,1,2|" + ",".join(cpu(3)),
     "Uneven local clusters with global_ids 4 and local_devices ids 3"),
    ("|x=3|0,1|0,1|" + ",".join(cpu(2)), "mesh size doesn't match number of devices"),
    ("|x=2|0,1|0,1|CPU:0,CPU:1", "Failed to either identify host or device type"),
    ("|x=2|0,1|0,1|" + CPU % 0 + "," + TPU % 1,
     "More than one device type per mesh not supported. Found 2"),
    ("|x=2|0,1|0,1|" + ",".join(cpu(2)) + "||foo",
     "Expected string use_xla_spmdas the 7th argument but got: foo"),
    ("|x=2|TPU", "Expected a * in mesh_gen_instructions but found TPU"),
])
def test_from_string_dtensor_errors(s, message):
  with pytest.raises(ValueError) as e:
    Mesh.from_string(s)
  assert str(e.value) == message


@pytest.mark.parametrize("s,fragment", [
    ("|x=2|0,a|0,1|" + ",".join(cpu(2)), "global device ids contains 'a'"),
    ("|x=2|0,1|0,b|" + ",".join(cpu(2)), "local device ids contains 'b'"),
    ("|x|0|0|" + CPU % 0, "dimension 'x' is not of the form name=size"),
    ("|x=two|0|0|" + CPU % 0, "dimension 'x=two' is not of the form name=size"),
    ("|x=2|0,2|0,2|" + ",".join(cpu(2)), "global device ids must be consecutive"),
    ("|x=2|0,1|0,7|" + ",".join(cpu(2)), "contains 7, which is not a global device id"),
])
def test_from_string_where_tf_would_crash(s, fragment):
  with pytest.raises(ValueError, match=None) as e:
    Mesh.from_string(s)
  assert fragment in str(e.value)


def test_from_string_type_error():
  with pytest.raises(TypeError, match="mesh_str must be a str"):
    Mesh.from_string(None)
