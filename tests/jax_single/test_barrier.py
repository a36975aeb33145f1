"""`jdtensor.barrier` in one process: what it takes as its mesh (a jdtensor
Mesh or a JAX one) and the TypeError that says what to pass otherwise. The
same across clients: tests/multiprocess/test_multi_client.py."""

import jax
import pytest

import jdtensor


def test_barrier_takes_a_jax_mesh_and_a_jdtensor_mesh():
  assert len(jax.devices("cpu")) == 8, "conftest must configure 8 CPU devices"
  jdtensor.barrier(jax.make_mesh((4, 2), ("x", "y")), "a JAX mesh")
  jdtensor.barrier(jdtensor.create_mesh([("x", 4), ("y", 2)], device_type="CPU"),
                   "a jdtensor mesh")


@pytest.mark.parametrize("given,shown", [
    ("batch", "str"),
    (None, "NoneType"),
    (lambda: jax.make_mesh((8,), ("x",)).abstract_mesh, None),  # No devices.
], ids=["a-string", "none", "an-abstract-mesh"])
def test_barrier_says_what_to_pass_for_anything_else(given, shown):
  given = given() if callable(given) else given
  shown = shown or f"{type(given).__module__}.{type(given).__qualname__}"
  with pytest.raises(TypeError) as e:
    jdtensor.barrier(given, "wrong")
  assert str(e.value) == (
      "barrier's mesh must be a jdtensor Mesh (jdtensor.create_distributed_mesh) or a "
      f"JAX jax.sharding.Mesh with devices (jax.make_mesh), got {shown}")
