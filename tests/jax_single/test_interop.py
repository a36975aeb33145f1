"""Mesh/Layout <-> jax.sharding on 8 simulated CPU devices, in this process."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jdtensor
from jdtensor.runtime.interop import single_device_sharding
from jdtensor import UNSHARDED, Layout, Mesh


@pytest.fixture(scope="module")
def devices():
  devs = jax.devices("cpu")
  assert len(devs) == 8, "conftest must configure 8 CPU devices"
  return devs


@pytest.fixture
def mesh(devices):
  return jdtensor.create_mesh([("batch", 4), ("model", 2)], device_type="CPU")


def test_jax_mesh_in_global_id_order(mesh, devices):
  jm = mesh.jax_mesh
  assert isinstance(jm, jax.sharding.Mesh)
  assert jm.axis_names == ("batch", "model")
  assert tuple(jm.axis_types) == (AxisType.Auto, AxisType.Auto)
  for g in range(8):
    assert jm.devices[np.unravel_index(g, (4, 2))] == devices[g]
  assert mesh.jax_mesh is jm  # Cached.


def test_explicit_axis_types(mesh):
  jm = mesh.to_jax_mesh(axis_types=(AxisType.Explicit, AxisType.Explicit))
  assert tuple(jm.axis_types) == (AxisType.Explicit, AxisType.Explicit)


def test_mesh_with_offset_ids_and_subset(devices):
  m = jdtensor.create_mesh([("x", 2)], devices=["CPU:5", "CPU:3"])
  assert list(m.jax_mesh.devices) == [devices[5], devices[3]]
  assert m.local_devices() == ["/job:localhost/replica:0/task:0/device:CPU:5",
                               "/job:localhost/replica:0/task:0/device:CPU:3"]


def test_from_jax_mesh_round_trip(mesh, devices):
  back = Mesh.from_jax_mesh(mesh.jax_mesh)
  assert back == mesh
  shuffled = jax.sharding.Mesh(np.array(devices[::-1]).reshape(2, 4), ("a", "b"))
  m = Mesh.from_jax_mesh(shuffled, mesh_name="rev")
  assert m.name == "rev" and m.shape() == [2, 4]
  assert m.local_devices()[0] == "/job:localhost/replica:0/task:0/device:CPU:7"
  assert (m.jax_mesh.devices == shuffled.devices).all()


def test_layout_to_named_sharding_and_back(mesh):
  layout = Layout(["batch", UNSHARDED, "model"], mesh)
  sharding = layout.to_jax_sharding()
  assert isinstance(sharding, NamedSharding)
  assert sharding.spec == P("batch", None, "model")
  assert sharding.mesh == mesh.jax_mesh
  assert Layout.from_jax_sharding(sharding) == layout
  assert Layout.from_jax_sharding(sharding, mesh=mesh) == layout


def test_from_jax_sharding_pads_and_rejects(mesh):
  short = NamedSharding(mesh.jax_mesh, P("model"))
  assert Layout.from_jax_sharding(short, rank=3).sharding_specs == [
      "model", UNSHARDED, UNSHARDED]
  assert Layout.from_jax_sharding(NamedSharding(mesh.jax_mesh, P(("batch",)))
                                  ).sharding_specs == ["batch"]
  with pytest.raises(ValueError, match="sharded over several mesh axes"):
    Layout.from_jax_sharding(NamedSharding(mesh.jax_mesh, P(("batch", "model"))))
  with pytest.raises(ValueError, match="more than rank=0"):
    Layout.from_jax_sharding(short, rank=0)
  with pytest.raises(TypeError, match="must be a jax.sharding.NamedSharding"):
    Layout.from_jax_sharding(single_device_sharding("/job:localhost/replica:0/task:0/device:CPU:0"))


def test_match_has_no_jax_equivalent(mesh):
  with pytest.raises(ValueError, match="'match' has no jax.sharding equivalent"):
    Layout([jdtensor.MATCH, UNSHARDED], mesh).to_jax_sharding()


def test_single_device_layout(devices):
  sharding = Layout.from_device(
      "/job:localhost/replica:0/task:0/device:CPU:2").to_jax_sharding()
  assert sharding.device_set == {devices[2]}


def test_jitted_sharded_computation(mesh):
  x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
  w = np.arange(6 * 4, dtype=np.float32).reshape(6, 4) / 10
  x_layout = Layout.batch_sharded(mesh, "batch", 2)
  w_layout = Layout.inner_sharded(mesh, "model", 2)
  xs = jax.device_put(x, x_layout.to_jax_sharding())
  ws = jax.device_put(w, w_layout.to_jax_sharding())
  out_layout = Layout(["batch", "model"], mesh)
  f = jax.jit(lambda a, b: jnp.tanh(a @ b),
              out_shardings=out_layout.to_jax_sharding())
  y = f(xs, ws)
  np.testing.assert_allclose(np.asarray(y), np.tanh(x @ w), rtol=1e-6)
  assert y.sharding == out_layout.to_jax_sharding()
  assert Layout.from_jax_sharding(y.sharding, mesh=mesh) == out_layout
  # Each device holds its (2, 2) shard: batch split 4 ways, model 2 ways.
  assert {s.data.shape for s in y.addressable_shards} == {(2, 2)}
  assert out_layout.local_shape_from_global_shape(y.shape) == (2, 2)
  # A reduction over the whole mesh.
  total = jax.jit(jnp.sum)(xs)
  assert float(total) == float(x.sum())


def test_create_mesh_defaults_and_errors(devices):
  m = jdtensor.create_mesh()
  assert m.dim_names == ["x"] and m.size == 8 and m.num_local_devices() == 8
  assert jdtensor.create_mesh({"x": 8, "y": 1}, device_type="CPU").dim_names == [
      "x", "y"]
  dims = [("x", -1)]
  assert jdtensor.create_mesh(dims).shape() == [8] and dims == [("x", -1)]
  named = jdtensor.create_mesh([("x", 2)], "named", devices=["CPU:0", "CPU:1"])
  assert named.to_string().startswith("named|x=2|0,1|0,1|/job:localhost/replica:0/")
  with pytest.raises(ValueError) as e:
    jdtensor.create_mesh([("x", 3)])
  assert str(e.value) == ("length of devices (8) must be equal to total size of "
                          "the mesh of shape [3]")
  with pytest.raises(ValueError) as e:
    jdtensor.create_mesh([("x", 2)], devices=["CPU:9", "CPU:1"])
  assert str(e.value).startswith(
      "Device '/job:localhost/replica:0/task:0/device:CPU:9' does not exist: "
      "client 0 has 8 CPU device(s) (CPU:0..CPU:7).")
  with pytest.raises(ValueError, match="Conflicting devices"):
    jdtensor.create_mesh([("x", 1)], devices=["CPU:0"], device_type="GPU")
  with pytest.raises(ValueError, match="XLA SPMD is not currently not supported for"):
    jdtensor.create_mesh([("x", 8)], use_xla_spmd=True)
  with pytest.raises(ValueError, match="Devices containing multiple device_types"):
    jdtensor.create_mesh([("x", 2)], devices=["CPU:0", "GPU:0"])
  with pytest.raises(TypeError, match="mesh_dims must be a list of"):
    jdtensor.create_mesh("x")
  with pytest.raises(TypeError, match=r"entries must be \(str, int\) pairs"):
    jdtensor.create_mesh([("x", "8")])
  with pytest.raises(ValueError, match="dimension 'x' has size 0"):
    jdtensor.create_mesh([("x", 0)])
  with pytest.raises(ValueError, match="Device type XPU is not CPU, GPU, or TPU."):
    jdtensor.create_mesh(device_type="XPU")


def test_create_mesh_fewer_devices_repeatable(devices):
  for _ in range(2):
    m = jdtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
    assert m.num_local_devices() == 2 and m.size == 2


def test_gpu_mesh_on_cpu_only_machine_is_clear(devices):
  with pytest.raises(ValueError, match="client 0 has 0 GPU device"):
    jdtensor.create_mesh([("x", 1)], devices=["GPU:0"])


def test_everything_works_again_after_the_caches_of_jax_objects_are_dropped(mesh):
  """What a clean exit drops is rebuilt on the next call."""
  from jdtensor import accelerator, api, runtime  # pylint: disable=g-import-not-at-top
  from jdtensor.runtime import interop  # pylint: disable=g-import-not-at-top
  layout = Layout(["batch", UNSHARDED], mesh)
  before = jdtensor.call_with_layout(jnp.ones, layout, (4, 2))
  device_names = runtime.client_devices("CPU", 0)
  assert interop.known_mesh(mesh.jax_mesh) is not None and api._CALLS  # pylint: disable=protected-access
  accelerator._forget_jax_objects()  # pylint: disable=protected-access
  assert interop.known_mesh(mesh.jax_mesh) is None and not api._CALLS  # pylint: disable=protected-access
  assert runtime.state()._device_table == {}  # pylint: disable=protected-access
  assert runtime.client_devices("CPU", 0) == device_names
  after = jdtensor.call_with_layout(jnp.ones, layout, (4, 2))
  assert jdtensor.fetch_layout(after) == jdtensor.fetch_layout(before) == layout
  np.testing.assert_array_equal(np.asarray(after), np.asarray(before))
