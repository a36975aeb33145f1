"""Multi-client tests with jdtensor.testing: each body runs in N real client processes.

Run: python -m pytest -q -p no:cacheprovider test_psum.py --jdtensor-timeout=300
Expect: 5 passed
"""
import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

import jdtensor
from jdtensor.testing import multi_client, run_in_multi_client


def ones_on(mesh):
  """Module-level helpers, imports and classes are there in every client."""
  return jax.make_array_from_callback(
      mesh.devices.shape, NamedSharding(mesh, P("client", "device")),
      lambda index: np.ones((1, 1), np.float32))


@multi_client(num_clients=4, devices_per_client=2)
def test_psum_over_every_device():
  mesh = jax.make_mesh((4, 2), ("client", "device"))
  total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))(
      ones_on(mesh))
  assert float(total) == 8.0
  ids = multihost_utils.process_allgather(np.array([jdtensor.client_id()]))
  assert ids.ravel().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("size", [2, 6])        # The values reach every client.
@multi_client(num_clients=2, timeout=60)
def test_sharded_rows(size):
  mesh = jdtensor.create_distributed_mesh([("rows", 2)])
  layout = jdtensor.Layout(["rows", jdtensor.UNSHARDED], mesh)
  x = jdtensor.call_with_layout(jax.numpy.ones, layout, (size, 3))
  assert [p.shape for p in jdtensor.unpack(x)] == [(size // 2, 3)]


@pytest.mark.multi_client(2)                      # The same, as a marker.
def test_two_processes():
  assert jax.process_count() == 2


def test_each_clients_value():                    # TF DTensor's helper, ported.
  assert run_in_multi_client(jdtensor.client_id, 3) == [0, 1, 2]
