"""One DTensor client for the multi-process tests: `python client.py SCENARIO`.

Runs under `jdtensor launch` (or the tests' own process starter) with the
DTENSOR_* variables set, and prints ``RESULT key=value`` lines that the tests
assert on. Any exception exits non-zero with ``ERROR <type>: <message>``.
"""

import ipaddress
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def result(key, value):
  # One write() (atomic on a pipe), starting a fresh line: gloo's C++ threads
  # print fragments of their connection notice to the same stdout.
  sys.stdout.flush()
  os.write(1, f"\nRESULT {key}={json.dumps(value)}\n".encode())


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


def _user_psum_setup():
  """Jitted psums over (a) every device, (b) a host axis, (c) one device per
  client, on a (client, device) mesh: the groups a user program can form."""
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P

  import jdtensor
  from jdtensor import Layout
  n, local = jdtensor.num_clients(), jdtensor.num_local_devices("CPU")
  mesh = jdtensor.create_distributed_mesh([("host", n), ("dev", local)])
  jm = mesh.jax_mesh

  def make(width):
    return jax.make_array_from_callback(
        (n, local * width), Layout(["host", "dev"], mesh).to_jax_sharding(),
        lambda idx: np.arange(n * local * width, dtype=np.float32).reshape(
            n, local * width)[idx])
  fns = {axes: jax.jit(jax.shard_map(lambda b, a=axes: jax.lax.psum(b, a), mesh=jm,
                                     in_specs=P("host", "dev"),
                                     out_specs=P("host", "dev")))
         for axes in (("host", "dev"), "host", "dev")}
  return n, local, make, fns


def scenario_heartbeat_victim():
  """Everyone works; the test SIGKILLs one client; the others must notice."""
  import time
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  n, local, make, fns = _user_psum_setup()
  x = make(1)
  fns["dev"](x).block_until_ready()  # Steady state: programs built and run.
  from jdtensor import heartbeat
  if heartbeat.current() is not None:
    heartbeat.current().ready.wait(60)  # ...and the heartbeat's first exchange.
  result("ready", os.getpid())
  deadline = time.monotonic() + 60
  try:
    while time.monotonic() < deadline:
      fns["dev"](x).block_until_ready()  # Local work: no peer needed.
      jdtensor.create_mesh([("x", 1)], devices=["CPU:0"])  # A jdtensor call.
      time.sleep(0.01)
  except jdtensor.PeerFailureError as e:
    result("peer_failure", [str(e), list(e.client_ids)])
    os._exit(0)  # Skip JAX's shutdown barrier with a dead peer.
  result("survived", True)


def scenario_heartbeat_token():
  """Client 1's token goes out of sync (what a restarted client would send)."""
  import time
  import jdtensor
  from jdtensor import heartbeat
  jdtensor.initialize_accelerator_system("CPU")
  hb = heartbeat.current()
  hb.ready.wait(30)
  time.sleep(0.5)
  if jdtensor.client_id() == 1:
    hb.token ^= 0x5A5A
  deadline = time.monotonic() + 20
  while time.monotonic() < deadline and hb.failure is None:
    time.sleep(0.05)
  result("failure", [str(hb.failure), list(hb.failure.client_ids)
                     if hb.failure else None])
  os._exit(0)


def scenario_die_after_rendezvous():
  """Client 1 dies right after meeting the coordinator, before JAX registers
  it (the dying client wraps the call; client 0's code is untouched)."""
  import signal
  import jdtensor
  from jdtensor import _rendezvous
  if jdtensor.client_id() == 1:
    real = _rendezvous.rendezvous

    def meet_then_die(*args, **kwargs):
      links = real(*args, **kwargs)
      os.kill(os.getpid(), signal.SIGKILL)
      return links
    _rendezvous.rendezvous = meet_then_die
  jdtensor.initialize_accelerator_system("CPU")
  result("initialized", True)


def scenario_double_init():
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  jdtensor.initialize_accelerator_system("CPU")


def scenario_shutdown_multi():
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  jdtensor.shutdown_accelerator_system()


def scenario_barrier_wait():
  """Client 0 waits in a barrier that client 1 never reaches (it is killed)."""
  import time
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  mesh = jdtensor.create_distributed_mesh([("x", jdtensor.num_clients())])
  result("ready", os.getpid())
  if jdtensor.client_id() == 0:
    jdtensor.barrier(mesh, "never", timeout_in_ms=120_000)
  time.sleep(60)


def scenario_missing_device():
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  which = os.environ["FAULT_MESH"]
  if which == "create_mesh":
    jdtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:7"])
  else:
    mesh = jdtensor.Mesh.from_string(
        "|x=2|0,1|0|/job:worker/replica:0/task:0/device:CPU:0|"
        "/job:worker/replica:0/task:0/device:CPU:0,"
        "/job:worker/replica:0/task:5/device:CPU:0")
    mesh.jax_mesh


def scenario_corrupt_string():
  import jdtensor
  text = open(os.environ["FAULT_FILE"], encoding="utf-8", errors="replace").read()
  parse = jdtensor.Mesh.from_string if os.environ["FAULT_KIND"] == "mesh" else (
      jdtensor.Layout.from_string)
  parse(text.strip())


def scenario_init_only():
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  result("initialized", True)


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
  try:
    globals()[f"scenario_{sys.argv[1]}"]()
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    sys.stdout.flush()
    os.write(1, f"\nERROR {type(e).__name__}: {e}\n".encode())
    sys.exit(1)
