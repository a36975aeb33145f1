"""Start-up scenarios for test_multi_client.py, test_tpu_pods.py, test_launcher.py,
the fault suite and the multi-host test: `python startup_client.py SCENARIO`
(see tests/client_common.py)."""

import ipaddress
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

from tests.client_common import psum_over_every_device, result, run_scenario  # noqa: E402


def listening_address(port):
  """The local address of the socket listening on `port` (from /proc)."""
  for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
    try:
      lines = open(path).read().splitlines()[1:]
    except OSError:
      continue
    for line in lines:
      fields = line.split()
      addr, hex_port = fields[1].split(":")
      if int(hex_port, 16) == port and fields[3] == "0A":  # LISTEN
        raw = bytes.fromhex(addr)
        if not v6:
          return ".".join(str(b) for b in raw[::-1])
        # /proc stores each 32-bit word in host (little-endian) order.
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1]
                                            for i in range(0, 16, 4)))
        return str(ip.ipv4_mapped or ip)
  return None


def scenario_basic():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import PartitionSpec as P

  import jdtensor
  from jdtensor import UNSHARDED, Layout

  assert jdtensor.initialize_accelerator_system("cpu") == "CPU"
  cid, n = jdtensor.client_id(), jdtensor.num_clients()
  local = jdtensor.num_local_devices("CPU")
  result("client", [cid, n, local])
  if cid == 0:
    port = int(jdtensor.jobs()[0].rsplit(":", 1)[1])
    result("coordinator_listen", listening_address(port))

  mesh = jdtensor.create_distributed_mesh([("batch", n * local // 2), ("model", 2)]
                                          if n * local % 2 == 0 and n * local > 2
                                          else [("batch", n * local)])
  result("mesh", mesh.to_string())
  result("local_ids", mesh.local_device_ids())
  jm = mesh.jax_mesh
  result("jax_mesh_process_order",
         [d.process_index for d in jm.devices.flat])

  # A cross-client psum over every device.
  flat = jdtensor.create_distributed_mesh([("all", n * local)], mesh_name="flat")
  fm = flat.jax_mesh
  x = jax.make_array_from_callback(
      (n * local,), Layout(["all"], flat).to_jax_sharding(),
      lambda idx: np.arange(1, n * local + 1, dtype=np.float32)[idx])
  total = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "all"), mesh=fm,
                                in_specs=P("all"), out_specs=P()))(x)
  result("psum", float(np.asarray(total.addressable_data(0))[0]))

  # A sharded matmul: batch over clients, weights over model.
  size = mesh.size
  a = np.arange(size * 4 * 6, dtype=np.float32).reshape(size * 4, 6) / 100
  w = np.arange(6 * 8, dtype=np.float32).reshape(6, 8) / 10
  a_layout = Layout.batch_sharded(mesh, mesh.dim_names[0], 2)
  w_layout = (Layout.inner_sharded(mesh, "model", 2) if "model" in mesh
              else Layout.replicated(mesh, 2))
  put = lambda v, l: jax.make_array_from_callback(v.shape, l.to_jax_sharding(),
                                                  lambda i: v[i])
  out_layout = Layout([mesh.dim_names[0], w_layout.sharding_specs[1]], mesh)
  y = jax.jit(lambda p, q: p @ q, out_shardings=out_layout.to_jax_sharding())(
      put(a, a_layout), put(w, w_layout))
  expected = a @ w
  ok = all(np.allclose(np.asarray(s.data), expected[s.index], rtol=1e-5)
           for s in y.addressable_shards)
  result("matmul_ok", bool(ok))

  # pack / unpack round trip, fetch_layout, relayout, call_with_layout.
  layout = Layout([mesh.dim_names[0], UNSHARDED], mesh)
  comps = [np.full((2, 3), 100 * cid + i, np.float32)
           for i in range(mesh.num_local_devices())]
  packed = jdtensor.pack(comps, layout)
  result("packed_shape", list(packed.shape))
  back = jdtensor.unpack(packed)
  result("unpack_ok", all(np.array_equal(np.asarray(b), c)
                          for b, c in zip(back, comps)))
  result("fetch_layout_ok", jdtensor.fetch_layout(packed) == layout)
  replicated = jdtensor.relayout(packed, Layout.replicated(mesh, 2))
  full = np.asarray(replicated.addressable_data(0))
  result("relayout_rows", [float(r[0]) for r in full[::2]])
  ones = jdtensor.call_with_layout(jnp.ones, layout, (mesh.size * 2, 3))
  result("call_with_layout", [list(ones.shape),
                              jdtensor.fetch_layout(ones) == layout])

  jdtensor.barrier(mesh, "b1", timeout_in_ms=30_000)
  jdtensor.barrier(mesh, "b1", timeout_in_ms=30_000)
  jdtensor.barrier(mesh)
  from jdtensor import mesh_util
  result("barrier_counts", mesh_util._barrier_counts)  # pylint: disable=protected-access

  # The seed's legacy keyword form, for this client and for another one.
  legacy = jdtensor.create_distributed_mesh([("x", n * local)], num_clients=n,
                                            client_id=cid)
  result("legacy_mesh_ok", legacy.local_device_ids() ==
         list(range(cid * local, (cid + 1) * local)))
  try:
    jdtensor.create_distributed_mesh([("x", n * local + 1)], num_clients=n)
  except ValueError as e:
    result("legacy_error", str(e))
  try:
    jdtensor.shutdown_accelerator_system()
  except ValueError as e:
    result("shutdown_error", str(e))
  result("still_initialized", jdtensor.is_initialized())


def scenario_legacy_init():
  import jdtensor
  jdtensor.dtensor_initialize_multi_client()
  mesh = jdtensor.create_distributed_mesh([("x", jdtensor.num_clients())])
  jdtensor.barrier(mesh, timeout_in_ms=30_000)
  result("legacy_init", [jdtensor.is_initialized(), mesh.to_string()])


def scenario_tpu():
  """A simulated TPU pod: merged core table, ring-ordered mesh, collectives."""
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P

  import jdtensor
  from jdtensor import Layout, runtime

  assert jdtensor.initialize_accelerator_system() == "TPU"  # preferred type
  topo = runtime.state().tpu_topology
  result("core_ids", list(topo.core_ids))
  result("topology_shape", list(topo.mesh_shape))
  n = jdtensor.num_global_devices("TPU")
  mesh = jdtensor.create_tpu_mesh(["batch", "model"], [2, n // 2], "two_host1")
  result("mesh", mesh.to_string())
  result("device_ids", jdtensor.get_device_ids(mesh))
  result("locations", jdtensor.get_device_locations(mesh))
  # Where each global id lives: (client, local ordinal) of its JAX device.
  owners = [d.process_index for d in mesh.jax_mesh.devices.flat]
  result("owners", owners)
  # A cross-client psum over the ring-ordered mesh.
  ring_mesh = jdtensor.create_tpu_mesh(["all"], [n], "ring1d", ring_dims=1)
  jm = ring_mesh.jax_mesh
  y = jax.make_array_from_callback(
      (n,), Layout(["all"], ring_mesh).to_jax_sharding(),
      lambda idx: np.arange(1, n + 1, dtype=np.float32)[idx])
  s = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "all"), mesh=jm,
                            in_specs=P("all"), out_specs=P()))(y)
  result("psum", float(np.asarray(s.addressable_data(0))[0]))
  # pack/unpack on the ring-ordered mesh: global id g holds value g.
  layout = Layout(["all"], ring_mesh)
  comps = [np.array([float(g)], np.float32) for g in ring_mesh.local_device_ids()]
  packed = jdtensor.pack(comps, layout)
  full = jdtensor.relayout(packed, Layout.replicated(ring_mesh, 1))
  result("ring_values", np.asarray(full.addressable_data(0)).tolist())
  jdtensor.barrier(ring_mesh, "tpu-end", timeout_in_ms=30_000)


def scenario_detected():
  """DTENSOR_* unset; the cluster comes from the (fake) SLURM environment."""
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  mesh = jdtensor.create_distributed_mesh([("x", jdtensor.num_clients())])
  jdtensor.barrier(mesh, timeout_in_ms=30_000)
  result("detected", [jdtensor.client_id(), jdtensor.jobs(), mesh.to_string()])
  # Detection does not write the environment behind the user's back.
  result("environ_untouched", not any(k.startswith("DTENSOR_") for k in os.environ))


def scenario_explicit_cluster():
  """No DTENSOR_*: the cluster is given as arguments (the seed's API)."""
  import jdtensor
  jobs = os.environ["CLUSTER_JOBS"].split(",")
  me = int(os.environ["CLUSTER_ME"])
  jdtensor.initialize_multi_client_cluster(
      job_name="trainer", dtensor_jobs=jobs, client_id=me,
      collective_leader="trainer/replica:0/task:0")
  mesh = jdtensor.create_distributed_mesh([("x", len(jobs))])
  jdtensor.barrier(mesh, timeout_in_ms=30_000)
  result("who", [jdtensor.client_id(), jdtensor.num_clients(), jdtensor.job_name(),
                 jdtensor.jobs(), jdtensor.full_job_name(), mesh.local_devices(),
                 [str(d) for d in jdtensor.local_devices("CPU")],
                 jdtensor.device_name()])


def scenario_seed_tpu_init():
  """The seed's dtensor_initialize_tpu_system on a simulated TPU slice."""
  import jdtensor
  from jdtensor import runtime
  jdtensor.dtensor_initialize_tpu_system()
  topo = runtime.state().tpu_topology
  result("seed_tpu", [runtime.state().device_type, list(topo.core_ids),
                      jdtensor.num_global_devices("TPU")])


def scenario_jax_harness_timeouts():
  """As JAX's own multi-process harness starts (jax/_src/test_multiprocess.py:
  heartbeat_timeout_seconds=5, shutdown 30 s, initialisation 60 s), with no
  jdtensor setting of its own: the heartbeat's follow from JAX's."""
  import logging
  logging.basicConfig(level=logging.INFO)
  import jax
  import jax.numpy as jnp
  import numpy as np
  import jdtensor
  from jdtensor import heartbeat, runtime
  jdtensor.initialize_accelerator_system(
      "CPU", coordination_timeout=5, shutdown_timeout=30, init_timeout=60)
  hb = heartbeat.current()
  result("heartbeat", [hb.ready.wait(30), hb.settings.stuck_timeout, hb.settings.period])
  result("coordination", runtime.state().timeouts.coordination)
  mesh = jax.make_mesh((jax.device_count(),), ("x",))
  x = jax.make_array_from_process_local_data(
      jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")),
      np.full((jax.local_device_count(),), jax.process_index() + 1.0, np.float32))
  result("psum", float(jax.jit(jnp.sum)(x)))


def scenario_one_collective():
  import numpy as np
  from jax.experimental import multihost_utils

  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  result("gathered", multihost_utils.process_allgather(
      np.array([jdtensor.client_id()])).ravel().tolist())


def scenario_init_only():
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  result("initialized", True)


def scenario_loaded_modules():
  """Which jdtensor modules a CPU client's start-up (and a mesh) loads, and
  which of the jaxlib patterns it compiled."""
  import jdtensor
  from jdtensor import _jaxlib_texts, heartbeat
  jdtensor.initialize_accelerator_system("CPU")
  jdtensor.create_distributed_mesh([("x", jdtensor.num_global_devices("CPU"))])
  # The heartbeat's start (its threads, the first exchange) included.
  hb = heartbeat.current()
  result("heartbeat_ready", hb is not None and hb.ready.wait(30))
  result("modules", sorted(m for m in sys.modules if m.startswith("jdtensor")))
  result("idna_modules", sorted(
      m for m in ("encodings.idna", "stringprep", "unicodedata") if m in sys.modules))
  result("compiled_patterns", sorted(
      name for name in _jaxlib_texts._PATTERNS if name in vars(_jaxlib_texts)))  # pylint: disable=protected-access


def scenario_mixed_software():
  """CULPRIT runs something else: another JAX where DIFFERS=jax (it says so:
  the one seam, jax's version attribute, set before the start-up reads it;
  a host with another image), or whatever its environment sets (e.g.
  JAX_ENABLE_X64=1). Every client would otherwise meet and take a psum."""
  import time
  import jax
  import jdtensor
  result("jax", jax.__version__)
  culprit = os.environ["DTENSOR_CLIENT_ID"] == os.environ["CULPRIT"]
  if culprit and os.environ.get("DIFFERS") == "jax":
    jax.__version__ = "0.0.0+culprit"
  try:
    jdtensor.initialize_accelerator_system("CPU")
  except jdtensor.StartupError:
    result("refused_at", time.time())
    raise
  import numpy as np
  psum, x = psum_over_every_device()
  result("psum", float(np.asarray(psum(x).addressable_data(0))[0, 0]))


def scenario_init_then_sleep():
  import time
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  result("initialized", True)
  time.sleep(float(os.environ.get("SLEEP_SECONDS", "5")))


def scenario_exit_code():
  """Client 1 exits 3 at once; the others would sleep for a minute."""
  import time
  import jdtensor
  print(f"pid {os.getpid()}", flush=True)
  if jdtensor.client_id() == 1:
    sys.exit(3)
  time.sleep(60)


def scenario_sleep():
  import time
  result("ready", os.getpid())
  time.sleep(60)


if __name__ == "__main__":
  run_scenario(globals())
