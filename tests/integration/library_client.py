"""The real libraries on jdtensor: one client script, one mode per library.

``python library_client.py MODE``, under ``jdtensor launch -n 4
--devices-per-client 2`` (4 clients x 2 CPU devices) or alone with 8 CPU
devices (the one-process reference): the same code either way, since
``initialize_accelerator_system`` is local mode without ``DTENSOR_JOBS``.
Each mode prints ``RESULT <key>=<json>`` lines for the test to compare.

Modes: flax (flax + optax training on a (data=4, model=2) mesh), orbax
(the same training with an orbax CheckpointManager: resumes from the latest
step, saves on preemption), keras-dp / keras-mp (Keras 3 DataParallel /
ModelParallel fit), grain (ShardByJaxProcess), loops (multihost_utils and
jax.make_mesh collectives, every common way of reading a result).
"""
import json
import os
import signal
import sys
import time

import jdtensor

jdtensor.initialize_accelerator_system("CPU")

import jax  # noqa: E402  (after jdtensor, as users write it)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

N, K, LOCAL = jax.process_count(), jax.process_index(), jax.local_device_count()
STEPS = int(os.environ.get("STEPS", "12"))
BATCH, FEATURES = 32, 16


def result(key, value):
  print(f"RESULT {key}={json.dumps(value)}", flush=True)


def data():
  """The same global data set on every client (a regression problem)."""
  rng = np.random.RandomState(0)
  x = rng.normal(size=(STEPS * BATCH, FEATURES)).astype(np.float32)
  w = rng.normal(size=(FEATURES, 1)).astype(np.float32)
  return x, np.tanh(x @ w) + 0.1 * rng.normal(size=(len(x), 1)).astype(np.float32)


def local(a):
  return np.asarray(a.addressable_data(0))


# -- flax + optax (and orbax) ------------------------------------------------------

def flax_training(manager=None):
  import flax.linen as nn
  import optax

  mesh = jax.make_mesh((jax.device_count() // 2, 2), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  part = nn.with_partitioning

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      init = nn.initializers.lecun_normal()
      x = nn.relu(nn.Dense(32, kernel_init=part(init, (None, "model")))(x))
      return nn.Dense(1, kernel_init=part(init, ("model", None)))(x)

  model, tx = MLP(), optax.adam(1e-2)
  sample = jnp.ones((BATCH, FEATURES))
  specs = nn.get_partition_spec(jax.eval_shape(model.init, jax.random.key(0), sample))
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)

  @jax.jit
  def init(key):
    params = jax.lax.with_sharding_constraint(nn.unbox(model.init(key, sample)),
                                              shardings)
    return {"params": params, "opt": tx.init(params)}

  @jax.jit
  def step(state, x, y):
    def loss_fn(p):
      return jnp.mean((model.apply(p, x) - y) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt = tx.update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

  checksum = jax.jit(lambda s: sum(jnp.sum(jnp.abs(l)) for l in jax.tree.leaves(s)),
                     out_shardings=NamedSharding(mesh, P()))
  state, first = init(jax.random.key(0)), 0
  if manager is not None and manager.latest_step() is not None:
    import orbax.checkpoint as ocp
    latest = manager.latest_step()
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    state = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
    first = latest + 1
    result("resumed_from", latest)
  x_all, y_all = data()
  batch = NamedSharding(mesh, P("data"))
  losses = []
  for i in range(first, STEPS):
    rows = slice(i * BATCH, (i + 1) * BATCH)
    x = jax.make_array_from_callback((BATCH, FEATURES), batch, lambda idx: x_all[rows][idx])
    y = jax.make_array_from_callback((BATCH, 1), batch, lambda idx: y_all[rows][idx])
    state, loss = step(state, x, y)
    losses.append(float(loss))  # A replicated scalar, read as users do.
    if manager is not None:
      import orbax.checkpoint as ocp
      if K == int(os.environ.get("CULPRIT", "-1")) and i == int(os.environ.get("PREEMPT_AT", "-1")):
        os.kill(os.getpid(), signal.SIGTERM)  # A pod eviction: a preemption notice.
        time.sleep(0.5)
      if manager.reached_preemption(i):
        manager.save(i, args=ocp.args.StandardSave(state), force=True)
        manager.wait_until_finished()
        result("saved_on_preemption", i)
        manager.close()
        sys.exit(0)
      time.sleep(float(os.environ.get("STEP_SECONDS", "0")))
  result("losses", losses)
  result("checksum", float(local(checksum(state))))
  result("param_shardings", sorted({str(l.sharding.spec) for l in
                                    jax.tree.leaves(state["params"])}))
  if manager is not None:
    manager.close()


def orbax_training():
  import orbax.checkpoint as ocp
  manager = ocp.CheckpointManager(
      os.environ["CKPT_DIR"], options=ocp.CheckpointManagerOptions(max_to_keep=2))
  flax_training(manager)


# -- Keras 3 -----------------------------------------------------------------------

def keras_fit(model_parallel):
  import keras
  # Every client must build the same weights: Keras' own multi-process set-up
  # (keras.distribution.initialize) agrees on a seed, but it also calls
  # jax.distributed.initialize, which jdtensor has done; so set one seed.
  keras.utils.set_random_seed(0)
  devices = jax.devices()
  if model_parallel:
    mesh = keras.distribution.DeviceMesh((len(devices) // 2, 2), ["batch", "model"],
                                         devices=devices)
    layouts = keras.distribution.LayoutMap(mesh)
    layouts[".*hidden/kernel"] = (None, "model")
    layouts[".*out/kernel"] = ("model", None)
    dist = keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch",
                                            auto_shard_dataset=False)
    groups = len(devices) // 2  # Batch shards; client k holds shard k.
  else:
    dist = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
    groups = N
  keras.distribution.set_distribution(dist)
  model = keras.Sequential([keras.Input((FEATURES,)),
                            keras.layers.Dense(32, activation="relu", name="hidden"),
                            keras.layers.Dense(1, name="out")])
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  x_all, y_all = data()
  # Each client feeds its own part of every global batch (auto_shard off).
  per = BATCH // N if N > 1 else BATCH
  rows = np.concatenate([np.arange(i * BATCH + K * per, i * BATCH + (K + 1) * per)
                         for i in range(STEPS)])
  history = model.fit(x_all[rows], y_all[rows], batch_size=per, epochs=2,
                      shuffle=False, verbose=0)
  result("losses", [float(v) for v in history.history["loss"]])
  kernel = model.get_layer("hidden").kernel
  result("kernel_sharding", str(kernel.value.sharding.spec))
  result("groups", groups)


# -- grain -------------------------------------------------------------------------

def grain_sharding():
  import grain.python as grain
  source = grain.RangeDataSource(0, 41, 1)
  sampler = grain.IndexSampler(
      num_records=len(source), shuffle=False, num_epochs=1, seed=0,
      shard_options=grain.ShardByJaxProcess(drop_remainder=True))
  loader = grain.DataLoader(data_source=source, sampler=sampler, worker_count=0)
  result("grain", [int(v) for v in loader])


# -- multihost_utils and jax.make_mesh loops ---------------------------------------

def loops():
  from jax.experimental import multihost_utils as mh
  iters = int(os.environ.get("ITERS", "100"))
  mesh = jax.make_mesh((N, LOCAL), ("host", "dev"))
  sharding = NamedSharding(mesh, P("host", "dev"))
  total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))
  wrong = {"allgather": 0, "broadcast": 0, "psum_float": 0, "psum_item": 0,
           "psum_numpy": 0, "psum_local": 0}
  for i in range(iters):
    got = mh.process_allgather(np.array([K + i]))
    wrong["allgather"] += got.reshape(-1).tolist() != [k + i for k in range(N)]
    got = mh.broadcast_one_to_all(np.array([i * 10 + K]))
    wrong["broadcast"] += got.tolist() != [i * 10]
    x = jax.make_array_from_callback((N, LOCAL), sharding,
                                     lambda idx: np.full((1, 1), i, np.float32))
    expected = float(i * N * LOCAL)
    s = total(x)
    wrong["psum_float"] += float(s) != expected
    wrong["psum_item"] += s.item() != expected
    wrong["psum_numpy"] += float(np.asarray(total(x).addressable_data(0))) != expected
    wrong["psum_local"] += float(local(total(x))) != expected
    if i % 25 == 0:
      mh.sync_global_devices(f"loop {i}")
  result("loops", {"iters": iters, "wrong": wrong})


if __name__ == "__main__":
  {"flax": flax_training, "orbax": orbax_training,
   "keras-dp": lambda: keras_fit(False), "keras-mp": lambda: keras_fit(True),
   "grain": grain_sharding, "loops": loops}[sys.argv[1]]()
