"""A client that uses standard JAX beside jdtensor: `python jax_user_client.py MODE`.

Modes:
  view     print what standard JAX shows (devices, meshes, pmap, multihost_utils)
  stress   ITERS iterations of standard multihost collectives, counting wrong
           results, then report the heartbeat's beat count
  absl     initialise, then import absl.logging at once (a fresh import)
  orbax    optax steps saved with orbax's CheckpointManager
           (single_host_load_and_broadcast=True) into CKPT_DIR, then restored
  backend_freed
           use every jdtensor cache of JAX objects (device table, meshes,
           layouts, call_with_layout, barrier), end the script, and say
           whether JAX's CPU client was freed once JAX's exit handler ran

Started by `jdtensor launch` (DTENSOR_* set). With RAW_JAX=1 it initialises
with plain ``jax.distributed.initialize`` instead of jdtensor, as the baseline.
Prints ``RESULT key=json`` lines.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))


def result(key, value):
  # One write() on a fresh line: gloo's C++ threads print to the same stdout.
  sys.stdout.flush()
  os.write(1, f"\nRESULT {key}={json.dumps(value)}\n".encode())


def init():
  if os.environ.get("RAW_JAX") == "1":
    import jax
    jobs = os.environ["DTENSOR_JOBS"].split(",")
    jax.distributed.initialize(jobs[0], len(jobs),
                               int(os.environ["DTENSOR_CLIENT_ID"]))
    return
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")


def view():
  init()
  import jax
  import numpy as np
  from jax.experimental import mesh_utils, multihost_utils
  n, k = jax.process_count(), jax.process_index()
  local = jax.local_device_count()
  out = {
      "device_count": jax.device_count(),
      "local_device_count": local,
      "devices": [repr(d) for d in jax.devices()],
      "local_devices": [repr(d) for d in jax.local_devices()],
      "cpu_devices": [repr(d) for d in jax.devices("cpu")],
      "process_indices": [d.process_index for d in jax.devices()],
      "make_mesh": [[d.id for d in row] for row in
                    jax.make_mesh((n, local), ("b", "m")).devices],
      "create_device_mesh": [[d.id for d in row] for row in
                             mesh_utils.create_device_mesh((n, local))],
  }
  pmapped = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(
      np.full((local,), k + 1, np.int32))
  out["pmap_psum"] = np.asarray(pmapped).tolist()
  out["allgather"] = np.asarray(multihost_utils.process_allgather(
      np.array([k], np.int32))).tolist()
  out["broadcast"] = np.asarray(multihost_utils.broadcast_one_to_all(
      np.array([k + 10], np.int32))).tolist()
  multihost_utils.sync_global_devices("view-done")
  result("view", out)


def stress():
  """Standard JAX collectives beside the heartbeat, every result checked."""
  import time
  init()
  import jax
  import numpy as np
  from jax.experimental import multihost_utils
  from jax.sharding import NamedSharding, PartitionSpec as P
  n, k = jax.process_count(), jax.process_index()
  local = jax.local_device_count()
  mesh = jax.make_mesh((n, local), ("host", "dev"),
                       axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  # One device per client: the group the old hidden-device heartbeat used.
  firsts = np.array([min((d for d in jax.devices() if d.process_index == p),
                         key=lambda d: d.id) for p in range(n)])
  per_client = jax.sharding.Mesh(firsts, ("c",))

  def smap(f, m, spec, out):
    return jax.jit(jax.shard_map(f, mesh=m, in_specs=spec, out_specs=out))
  psum_all = smap(lambda a: jax.lax.psum(a, ("host", "dev")), mesh,
                  P("host", "dev"), P())
  psum_host = smap(lambda a: jax.lax.psum(a, "host"), mesh, P("host", "dev"),
                   P(None, "dev"))
  psum_clients = smap(lambda a: jax.lax.psum(a, "c"), per_client, P("c"), P())
  sharding = NamedSharding(mesh, P("host", "dev"))
  client_sharding = NamedSharding(per_client, P("c"))
  iters = int(os.environ.get("ITERS", "1000"))
  wrong = {"broadcast": 0, "allgather": 0, "psum_all": 0, "psum_host": 0,
           "psum_clients": 0}
  start = time.monotonic()
  for i in range(iters):
    data = np.arange(n * local, dtype=np.int32).reshape(n, local) + i
    x = jax.make_array_from_callback((n, local), sharding, lambda idx: data[idx])
    got = np.asarray(psum_all(x).addressable_data(0))
    wrong["psum_all"] += int(not np.array_equal(got, data.sum(keepdims=True)))
    for s in psum_host(x).addressable_shards:
      expected = data.sum(0, keepdims=True)[s.index]
      wrong["psum_host"] += int(not np.array_equal(np.asarray(s.data), expected))
    row = np.arange(n, dtype=np.int32) * 3 + i
    y = jax.make_array_from_callback((n,), client_sharding, lambda idx: row[idx])
    got = np.asarray(psum_clients(y).addressable_data(0))
    wrong["psum_clients"] += int(not np.array_equal(got, [row.sum()]))
    b = multihost_utils.broadcast_one_to_all(np.array([i, k, 7 * i], np.int32))
    wrong["broadcast"] += int(not np.array_equal(np.asarray(b), [i, 0, 7 * i]))
    g = multihost_utils.process_allgather(np.array([i, k], np.int32))
    wrong["allgather"] += int(not np.array_equal(
        np.asarray(g), [[i, p] for p in range(n)]))
  seconds = time.monotonic() - start
  multihost_utils.sync_global_devices("stress-done")
  from jdtensor import heartbeat
  hb = heartbeat.current()
  hb.event.set()
  stopped = hb.stopped.wait(30)
  result("stress", {"iters": iters, "wrong": wrong, "stopped": stopped,
                    "failure": str(hb.failure), "closed": hb.closed_cleanly})
  result("beats", hb.beats)
  result("seconds", round(seconds, 1))


def absl_import():
  init()
  import absl.logging  # noqa: F401  (the point: a fresh import)
  from jdtensor import heartbeat
  hb = heartbeat.current()
  hb.ready.wait(30)
  result("absl", {"failure": str(hb.failure), "ready": hb.ready.is_set()})


def orbax_checkpoint():
  """What a JAX user does with orbax and optax; orbax broadcasts from host 0."""
  init()
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  import orbax.checkpoint as ocp
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = jax.make_mesh((jax.process_count(), jax.local_device_count()), ("b", "m"))
  x = jax.make_array_from_callback(
      (8, 8), NamedSharding(mesh, P("b", "m")),
      lambda idx: np.arange(64, dtype=np.float32).reshape(8, 8)[idx])
  params = {"w": x}
  opt = optax.adam(1e-2)
  state = opt.init(params)
  options = ocp.CheckpointManagerOptions(max_to_keep=2,
                                         single_host_load_and_broadcast=True)
  with ocp.CheckpointManager(os.environ["CKPT_DIR"], options=options) as manager:
    for step in range(3):
      grads = jax.tree.map(jnp.ones_like, params)
      updates, state = opt.update(grads, state, params)
      params = optax.apply_updates(params, updates)
      manager.save(step, args=ocp.args.StandardSave(params))
    manager.wait_until_finished()
    restored = manager.restore(manager.latest_step(),
                               args=ocp.args.StandardRestore(params))
  same = all(np.array_equal(np.asarray(a.data), np.asarray(b.data)) for a, b in
             zip(restored["w"].addressable_shards, params["w"].addressable_shards))
  from jdtensor import heartbeat
  result("orbax", {"restored": same, "failure": str(heartbeat.current().failure)})


def backend_freed():
  """Registered before ``import jax``, the check runs after JAX's exit
  handler (exit handlers run last-registered first), which clears JAX's
  backends: what still holds the CPU client then is someone else's."""
  import atexit
  import gc
  import weakref
  client = []

  def check():
    gc.collect()
    result("backend_freed", client[0]() is None)
  atexit.register(check)
  init()
  import jax
  import numpy as np

  def work():
    n = jax.device_count()
    if os.environ.get("RAW_JAX") == "1":
      mesh = jax.make_mesh((n,), ("x",))
      x = jax.device_put(np.ones(n, np.float32),
                         jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
      return float(jax.jit(lambda a: a.sum())(x))
    import jdtensor
    mesh = jdtensor.create_distributed_mesh([("x", n)])
    layout = jdtensor.Layout(["x"], mesh)
    x = jdtensor.call_with_layout(np.ones, layout, (n,), np.float32)
    jdtensor.barrier(mesh, "backend_freed")
    jdtensor.fetch_layout(x)
    return float(jax.jit(lambda a: a.sum())(x))
  assert work() == jax.device_count()
  client.append(weakref.ref(jax.devices()[0].client))


if __name__ == "__main__":
  {"view": view, "stress": stress, "absl": absl_import,
   "orbax": orbax_checkpoint, "backend_freed": backend_freed}[sys.argv[1]]()
