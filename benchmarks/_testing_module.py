"""Twenty small multi-client tests (4 clients x 2 CPU devices), the module
bench_testing.py runs under pytest fresh, warm, and in one process.

    BENCH_TESTING_MODE=clients|one  BENCH_TESTING_FAIL=<k>  pytest this file

``clients``: each test is ``@multi_client(num_clients=4,
devices_per_client=2)``; ``one``: the same bodies in this process, with 8
CPU devices (JAX_NUM_CPU_DEVICES=8 set by the benchmark). With
BENCH_TESTING_FAIL=k, test k fails on client 1 while the others wait in a
collective.
"""

import os

import numpy as np

MODE = os.environ.get("BENCH_TESTING_MODE", "clients")
FAIL = int(os.environ.get("BENCH_TESTING_FAIL", "-1"))

if MODE == "one":
  def case(fn):
    return fn
else:
  from jdtensor.testing import multi_client
  case = multi_client(num_clients=4, devices_per_client=2)


def _mesh():
  import jax
  return jax.make_mesh((jax.device_count(),), ("x",))


def _sharded(values):
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = _mesh()
  return jax.make_array_from_callback(
      values.shape, NamedSharding(mesh, P("x")), lambda index: values[index])


def _psum(k):
  import jax
  from jax.sharding import PartitionSpec as P
  if k == FAIL:
    import jdtensor
    from jax.experimental import multihost_utils
    if jdtensor.client_id() == 1:
      raise AssertionError("failing on purpose")
    multihost_utils.sync_global_devices("never")
  x = _sharded(np.arange(8, dtype=np.float32) + k)
  f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=_mesh(),
                            in_specs=P("x"), out_specs=P()))
  assert float(np.asarray(f(x).addressable_data(0))[0]) == 28.0 + 8 * k


def _dtensor_mesh():
  import jdtensor
  if jdtensor.num_clients() > 1:
    return jdtensor.create_distributed_mesh([("x", 8)], device_type="CPU")
  return jdtensor.create_mesh([("x", 8)], device_type="CPU")


def _layout_round_trip():
  import jdtensor
  mesh = _dtensor_mesh()
  layout = jdtensor.Layout(["x", jdtensor.UNSHARDED], mesh)
  assert jdtensor.Layout.from_string(layout.to_string()) == layout


def _pack_unpack():
  import jdtensor
  mesh = _dtensor_mesh()
  layout = jdtensor.Layout(["x"], mesh)
  local = [np.full((1,), d, np.float32) for d in mesh.local_device_ids()]
  x = jdtensor.pack(local, layout)
  assert [float(a[0]) for a in jdtensor.unpack(x)] == [float(a[0]) for a in local]


def _matmul():
  import jax
  x = _sharded(np.ones((8, 16), np.float32))
  w = np.full((16, 4), 0.5, np.float32)
  y = jax.jit(lambda a, b: a @ b)(x, w)
  assert float(np.asarray(y.addressable_data(0)).sum()) == 32.0


def _allgather():
  import jax
  from jax.experimental import multihost_utils
  got = multihost_utils.process_allgather(np.array([jax.process_index()]))
  assert got.ravel().tolist() == list(range(jax.process_count()))


def _shapes():
  import jax
  assert jax.device_count() == 8
  assert len(_mesh().devices.ravel()) == 8


@case
def test_01_psum(): _psum(1)
@case
def test_02_layout(): _layout_round_trip()
@case
def test_03_pack(): _pack_unpack()
@case
def test_04_matmul(): _matmul()
@case
def test_05_allgather(): _allgather()
@case
def test_06_psum(): _psum(6)
@case
def test_07_shapes(): _shapes()
@case
def test_08_layout(): _layout_round_trip()
@case
def test_09_pack(): _pack_unpack()
@case
def test_10_psum(): _psum(10)
@case
def test_11_matmul(): _matmul()
@case
def test_12_allgather(): _allgather()
@case
def test_13_psum(): _psum(13)
@case
def test_14_shapes(): _shapes()
@case
def test_15_layout(): _layout_round_trip()
@case
def test_16_pack(): _pack_unpack()
@case
def test_17_matmul(): _matmul()
@case
def test_18_allgather(): _allgather()
@case
def test_19_psum(): _psum(19)
@case
def test_20_shapes(): _shapes()
