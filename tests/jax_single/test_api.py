"""DTensor's data API on 8 simulated CPU devices, against TF 2.21's behaviour.

Expected messages and strings were observed with tensorflow-cpu 2.21.0.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdtensor
from jdtensor import UNSHARDED, Layout, Mesh, api

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "unit" / "fixtures"


@pytest.fixture(scope="module")
def mesh():
  assert len(jax.devices("cpu")) == 8, "conftest must configure 8 CPU devices"
  return jdtensor.create_mesh([("x", 4), ("y", 2)], device_type="CPU")


def test_fetch_layout_gives_back_the_mesh_it_was_packed_on():
  """Two meshes that differ only in name give equal JAX meshes."""
  mesh_1 = jdtensor.create_mesh([("x", 4), ("y", 2)], mesh_name="mesh_1")
  mesh_2 = jdtensor.create_mesh([("x", 4), ("y", 2)], mesh_name="mesh_2")
  assert mesh_1.jax_mesh == mesh_2.jax_mesh
  for m in (mesh_1, mesh_2, mesh_1):
    layout = Layout(["x", UNSHARDED], m)
    packed = jdtensor.pack([np.ones((1, 3))] * 8, layout)
    assert jdtensor.fetch_layout(packed) == layout
    assert jdtensor.fetch_layout(tensor=packed).mesh.name == m.name
    # An array made by plain JAX with the layout's sharding: also exact.
    made = jax.jit(lambda a: a + 1, out_shardings=layout.to_jax_sharding())(packed)
    assert jdtensor.fetch_layout(made).mesh.name == m.name


def test_parted_layouts_survive_relayout_and_fetch(mesh):
  layout = Layout(["x", UNSHARDED], mesh)
  x = jdtensor.pack([np.full((1, 2), i, np.float32) for i in range(8)], layout)
  parted = jdtensor.relayout(x, layout.to_parted())
  fetched = jdtensor.fetch_layout(parted)
  assert fetched.type == jdtensor.LayoutType.PARTED
  assert fetched.to_string().startswith("parted:x,unsharded, mesh:")
  assert jdtensor.fetch_layout(jdtensor.relayout(parted, layout)) == layout


def test_fetch_layout_of_things_that_are_not_dtensors():
  assert jdtensor.fetch_layout(-1024) is None  # As TF.
  with pytest.raises(ValueError) as e:
    jdtensor.fetch_layout(jnp.ones(3))
  assert str(e.value).startswith(
      "FetchLayout expects a tensor placed on the layout device. (jdtensor: ")
  assert not jdtensor.is_dtensor(jnp.ones(3))
  assert not jdtensor.is_dtensor(5)


def test_unpack_and_pack_errors_carry_tfs_words(mesh):
  with pytest.raises(TypeError) as e:
    jdtensor.unpack(5)
  assert str(e.value) == "Expecting a Tensor, got <class 'int'>"
  with pytest.raises(ValueError) as e:
    jdtensor.pack([np.float32(1)] * 8, Layout(["x"], mesh))
  assert str(e.value) == (
      "Packed layout should have the same rank as the rank for each component. "
      "The rank of each component is: 0, while layout has rank: 1 (component "
      "shape (); pass per-device components of the layout's rank).")


def test_unpack_with_tfs_keyword(mesh):
  layout = Layout(["x", "y"], mesh)
  comps = [np.full((1, 1), i, np.float32) for i in range(8)]
  parts = jdtensor.unpack(tensor=jdtensor.pack(tensors=comps, layout=layout))
  assert [float(p[0, 0]) for p in parts] == list(range(8))


def test_pack_places_device_arrays_by_position_not_by_their_device(mesh):
  """Component i goes to local device i, wherever it was (TF's pack copies);
  components already in place are used as they are."""
  layout = Layout(["x", "y"], mesh)
  devices = jax.devices("cpu")
  on_device_0 = [jax.device_put(jnp.full((1, 1), i, jnp.float32), devices[0])
                 for i in range(8)]
  reversed_places = [jax.device_put(jnp.full((1, 1), i, jnp.float32), devices[7 - i])
                     for i in range(8)]
  for comps in (on_device_0, reversed_places):
    packed = jdtensor.pack(comps, layout)
    parts = jdtensor.unpack(packed)
    assert [float(p[0, 0]) for p in parts] == list(range(8))
    assert [next(iter(p.devices())) for p in parts] == devices
  in_place = [jax.device_put(jnp.full((1, 1), i, jnp.float32), devices[i])
              for i in range(8)]
  parts = jdtensor.unpack(jdtensor.pack(in_place, layout))
  assert all(p.unsafe_buffer_pointer() == c.unsafe_buffer_pointer()
             for p, c in zip(parts, in_place))


def test_check_layout_and_is_dtensor(mesh):
  good = Layout.replicated(mesh, 2)
  d = jdtensor.copy_to_mesh(np.ones((4, 2)), good)
  assert jdtensor.is_dtensor(d)
  assert jdtensor.check_layout(d, good) is None
  other = Layout(["x", UNSHARDED], mesh)
  with pytest.raises(ValueError) as e:
    jdtensor.check_layout(d, other)
  assert str(e.value) == (f"Layout of tensor: Layout.from_string({good.to_string()}), "
                          "did not match expected layout: "
                          f"Layout.from_string({other.to_string()})")


def test_copy_to_mesh_shards_host_data(mesh):
  value = np.arange(16, dtype=np.float32).reshape(8, 2)
  layout = Layout(["x", "y"], mesh)
  d = jdtensor.copy_to_mesh(value, layout)
  assert jdtensor.fetch_layout(d) == layout
  np.testing.assert_array_equal(np.asarray(d), value)
  again = jdtensor.copy_to_mesh(d, Layout.replicated(mesh, 2), source_layout=layout)
  np.testing.assert_array_equal(np.asarray(again), value)
  with pytest.raises(ValueError, match="did not match expected layout"):
    jdtensor.copy_to_mesh(d, layout, source_layout=Layout.replicated(mesh, 2))


def test_relayout_like_and_its_gradient(mesh):
  """The cotangent goes back to the input's layout (DTensor's RelayoutLike
  and Relayout gradients), whatever the layout of `layout_tensor`."""
  x_layout = Layout(["x", "y"], mesh)
  like_layout = Layout.replicated(mesh, 2)
  x = jdtensor.copy_to_mesh(np.arange(16, dtype=np.float32).reshape(8, 2), x_layout)
  like = jdtensor.copy_to_mesh(np.zeros((1, 1), np.float32), like_layout)
  y = jdtensor.relayout_like(x, like)
  assert jdtensor.fetch_layout(y) == like_layout
  grad = jax.grad(lambda a: jnp.sum(jdtensor.relayout_like(a, like) ** 2))(x)
  np.testing.assert_allclose(np.asarray(grad), 2 * np.asarray(x))
  assert grad.sharding.is_equivalent_to(x_layout.to_jax_sharding(), 2)
  grad = jax.grad(lambda a: jnp.sum(jdtensor.relayout(a, like_layout)))(x)
  assert grad.sharding.is_equivalent_to(x_layout.to_jax_sharding(), 2)


def test_relayout_and_call_with_layout_reuse_their_programs(mesh):
  layout = Layout(["x", UNSHARDED], mesh)
  before = len(api._CALLS)
  for _ in range(3):
    ones = jdtensor.call_with_layout(jnp.ones, layout, (8, 4))
  assert len(api._CALLS) == before + 1
  assert jdtensor.fetch_layout(ones) == layout
  x = jdtensor.call_with_layout(jnp.add, layout, ones, ones)
  np.testing.assert_array_equal(np.asarray(x), 2)
  assert jdtensor.call_with_layout(lambda: 7, None) == 7  # No layout: a call.
  with jax.log_compiles(True):
    import logging
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("jax").addHandler(handler)
    try:
      for _ in range(3):
        jdtensor.relayout(ones, Layout.replicated(mesh, 2))
        jdtensor.call_with_layout(jnp.ones, layout, (8, 4))
    finally:
      logging.getLogger("jax").removeHandler(handler)
  compiled = [r for r in records if "Compiling" in r.getMessage()]
  assert len(compiled) <= 1, [r.getMessage() for r in compiled]  # The relayout's.


def test_default_mesh_scopes(mesh):
  assert jdtensor.get_default_mesh() is None
  with jdtensor.default_mesh(mesh):
    assert jdtensor.get_default_mesh() is mesh
    assert jax.sharding.get_abstract_mesh().axis_names == ("x", "y")
    other = jdtensor.create_mesh([("z", 8)])
    with jdtensor.run_on(other):
      assert jdtensor.get_default_mesh() is other
    assert jdtensor.get_default_mesh() is mesh
  assert jdtensor.get_default_mesh() is None
  with pytest.raises(ValueError) as e:
    with jdtensor.default_mesh("mesh"):
      pass
  assert str(e.value) == "Expect `mesh` to be `Mesh`, got <class 'str'>"


def test_device_name_is_tfs():
  assert jdtensor.device_name() == "/job:localhost/replica:0/task:0/device:CUSTOM:0"


def test_host_mesh_drops_name_and_global_devices_as_tf():
  remote = Mesh(["x"], np.arange(2), [], [], global_devices=[
      "/job:localhost/replica:0/task:1/device:CPU:0",
      "/job:localhost/replica:0/task:1/device:CPU:1"])
  assert remote.to_string() == ("|x=2|0,1|||/job:localhost/replica:0/task:1/device:"
                                "CPU:0,/job:localhost/replica:0/task:1/device:CPU:1")
  assert remote.host_mesh().to_string() == "|x=2|0,1||"  # TF 2.21's string.
  gpu = Mesh.from_string("named|x=2|0,1|0,1|/job:localhost/replica:0/task:0/device:"
                         "GPU:0,/job:localhost/replica:0/task:0/device:GPU:1")
  assert gpu.host_mesh().to_string() == (
      "|x=2|0,1|0,1|/job:localhost/replica:0/task:0/device:CPU:0,"
      "/job:localhost/replica:0/task:0/device:CPU:1")


def test_unravel_arranges_shards_by_position(mesh):
  layout = Layout(["x", UNSHARDED], mesh)
  grid = layout.unravel([f"s{i}" for i in range(8)])
  assert grid.shape == (4, 1)
  assert grid[:, 0].tolist() == ["s1", "s3", "s5", "s7"]  # The last of each x.
  with pytest.raises(ValueError, match="got 3 tensors, but the mesh has 8 devices"):
    layout.unravel([1, 2, 3])


def test_protos_are_tfs_bytes():
  """Bytes written by TF 2.21's as_proto().SerializeToString()."""
  data = json.loads((FIXTURES / "tf221_protos.json").read_text())
  for key, (text, hex_bytes) in data.items():
    cls = Mesh if key.startswith("mesh:") else Layout
    obj = cls.from_string(text)
    assert obj.as_proto().SerializeToString().hex() == hex_bytes, key
    assert cls.from_proto(bytes.fromhex(hex_bytes)) == obj, key
    assert cls.from_proto(obj.as_proto()) == obj, key
