"""Multi-client tests written as a user writes them.

Not collected by the suite itself (the name does not start with ``test_``):
`test_testing.py` runs this file in a pytest subprocess and checks each
outcome and message. Some tests here fail on purpose. Module level imports no
JAX: the last test checks that the pytest process never did.
"""

import os
import sys
import time

import numpy as np
import pytest

from jdtensor.testing import multi_client, run_in_multi_client


def expected_total(clients, devices):
  """A module-level helper the bodies use."""
  return float(clients * devices)


@multi_client(num_clients=4, devices_per_client=2)
def test_psum_4x2():
  import jax
  from jax.experimental import multihost_utils
  from jax.sharding import NamedSharding, PartitionSpec as P

  import jdtensor
  assert jax.process_count() == 4 and jax.device_count() == 8
  assert jax.local_device_count() == 2 and jdtensor.num_clients() == 4
  mesh = jax.make_mesh((4, 2), ("client", "device"))
  ones = jax.make_array_from_callback(
      (4, 2), NamedSharding(mesh, P("client", "device")),
      lambda index: np.ones((1, 1), np.float32))
  psum = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, ("client", "device")),
                               mesh=mesh, in_specs=P("client", "device"),
                               out_specs=P()))
  total = psum(ones)
  assert float(np.asarray(total.addressable_data(0))[0, 0]) == expected_total(4, 2)
  ids = multihost_utils.process_allgather(np.array([jdtensor.client_id()]))
  assert ids.ravel().tolist() == [0, 1, 2, 3]


@multi_client(num_clients=4)
def test_only_client_2_fails():
  import jax
  import jdtensor
  k = jdtensor.client_id()
  print(f"FAILING-TEST-PID {os.getpid()}", flush=True)
  from jax.experimental import multihost_utils
  # Every client has printed its pid before client 2 fails: start-up ends
  # on each client at its own time, and a client still on its way here when
  # client 2 fails is stopped before it prints.
  multihost_utils.sync_global_devices("every pid printed")
  assert k != 2, f"wrong on purpose in client {k}"
  # The others wait for client 2 in a collective until jdtensor stops them.
  multihost_utils.sync_global_devices("never reached by client 2")
  time.sleep(60)
  assert jax.process_count() == 4


@multi_client(num_clients=2, timeout=8)
def test_client_1_hangs():
  import jdtensor
  print(f"HANGING-TEST-PID {os.getpid()}", flush=True)
  if jdtensor.client_id() == 1:
    time.sleep(600)


@pytest.mark.parametrize("scale,expected", [(1, 1), (3, 3)])
@multi_client(num_clients=2)
def test_parameters_reach_every_client(scale, expected):
  import jdtensor
  assert scale == expected
  print(f"PARAM client={jdtensor.client_id()} scale={scale}", flush=True)


@pytest.mark.multi_client(2, devices_per_client=2)
def test_marker_form():
  import jax
  assert jax.device_count() == 4 and jax.process_count() == 2


@pytest.mark.multi_client(2, timeout=600)
def test_marker_with_a_fixture(tmp_path):
  assert tmp_path


class TestInAClass:
  factor = 5

  @multi_client(num_clients=2)
  def test_method_sees_its_instance(self):
    import jdtensor
    assert self.factor * (jdtensor.client_id() + 1) in (5, 10)


def test_run_in_multi_client_returns_each_clients_value():
  offset = 100

  def body(scale):
    import jax.numpy as jnp
    import jdtensor
    k = jdtensor.client_id()
    return k * scale + offset, jnp.full((2,), k)  # A jax.Array comes back as NumPy.

  values = run_in_multi_client(body, 3, kwargs={"scale": 10})
  assert [v[0] for v in values] == [100, 110, 120]
  assert all(type(v[1]) is np.ndarray for v in values)  # pylint: disable=unidiomatic-typecheck
  assert [v[1].tolist() for v in values] == [[0, 0], [1, 1], [2, 2]]
  assert run_in_multi_client(lambda: os.environ["EXTRA"], 2,
                             env={"EXTRA": "yes"}) == ["yes", "yes"]


def test_the_pytest_process_never_imported_jax():
  assert "jax" not in sys.modules, "the pytest process imported jax"
