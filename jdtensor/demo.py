"""`jdtensor demo`: data + model parallel MLP training on a DTensor mesh.

Trains a small MLP with the batch sharded over mesh dimension ``batch`` and
the hidden layer sharded over ``model`` (Layout -> NamedSharding), then checks
that the loss curve equals an unsharded single-device run of the same model.

With a checkpoint directory, every client writes its own shards of the
parameters after each step (NumPy, ``client-<k>-step-<s>.npz``, the last two
kept); a restarted run (``jdtensor demo --max-restarts``) resumes from the
last step every client saved, and checks the remaining losses against the
same steps of the single-device run.
"""

from __future__ import annotations

import glob
import os
import re
import time
from dataclasses import dataclass

import numpy as np

__all__ = ["DemoResult", "run_demo_client", "train", "report"]

_IN, _HIDDEN, _OUT, _BATCH = 16, 32, 4, 32
_LEARNING_RATE = 0.1
# Seconds the straggler's data loader takes each step (`jdtensor demo --straggler`).
STRAGGLER_SECONDS = 0.2
_TOLERANCE = 1e-5


@dataclass
class DemoResult:
  """What one client saw.

  Attributes:
    mesh: The mesh string.
    losses: Loss per step, sharded run.
    reference_losses: Loss per step, unsharded single-device run.
    init_seconds: Time spent in initialize_accelerator_system.
    step_seconds: Median wall time of a training step, after an untimed
      warm-up step (0 when nothing was left to train).
    start_step: The step it resumed from (0: a fresh start); `losses` and
      `reference_losses` cover the steps from there.
  """
  mesh: str
  losses: list[float]
  reference_losses: list[float]
  init_seconds: float
  step_seconds: float
  start_step: int = 0

  @property
  def max_loss_difference(self) -> float:
    """The largest |loss - single-device loss| (0 when nothing was trained)."""
    if not self.losses:
      return 0.0
    return float(np.max(np.abs(np.subtract(self.losses, self.reference_losses))))


def _problem() -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  params = {
      "w1": rng.normal(0, 0.3, (_IN, _HIDDEN)).astype(np.float32),
      "b1": np.zeros((_HIDDEN,), np.float32),
      "w2": rng.normal(0, 0.3, (_HIDDEN, _OUT)).astype(np.float32),
      "b2": np.zeros((_OUT,), np.float32),
  }
  x = rng.normal(0, 1, (_BATCH, _IN)).astype(np.float32)
  y = np.tanh(x @ rng.normal(0, 0.5, (_IN, _OUT))).astype(np.float32)
  return params, x, y


def _train_step():
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def loss_fn(params, x, y):
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)

  def step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - _LEARNING_RATE * g, params, grads), loss
  return step


def _shards(array) -> list[np.ndarray]:
  """This client's shards of `array`, in device order."""
  return [np.asarray(s.data) for s in sorted(array.addressable_shards,
                                               key=lambda s: s.device.id)]


def _from_shards(shape, sharding, shards: list[np.ndarray]):
  import jax  # pylint: disable=g-import-not-at-top
  devices = sorted(sharding.addressable_devices, key=lambda d: d.id)
  return jax.make_array_from_single_device_arrays(
      shape, sharding, [jax.device_put(s, d) for s, d in zip(shards, devices)])


class _Checkpoints:
  """One client's checkpoints: its shards after a step, the last two kept."""

  def __init__(self, directory: str, client: int):
    self.directory, self.client = directory, client
    os.makedirs(directory, exist_ok=True)

  def steps(self) -> list[int]:
    pattern = re.compile(rf"client-{self.client}-step-(\d+)\.npz$")
    found = [pattern.search(p) for p in glob.glob(
        os.path.join(self.directory, f"client-{self.client}-step-*.npz"))]
    return sorted(int(m.group(1)) for m in found if m)

  def save(self, step: int, params) -> None:
    path = os.path.join(self.directory, f"client-{self.client}-step-{step}.npz")
    with open(path + ".tmp", "wb") as f:
      np.savez(f, **{f"{k}:{i}": shard for k, v in params.items()
                     for i, shard in enumerate(_shards(v))})
    os.replace(path + ".tmp", path)  # A kill never leaves half a checkpoint.
    for old in self.steps()[:-2]:
      os.remove(os.path.join(self.directory, f"client-{self.client}-step-{old}.npz"))

  def load(self, step: int, like) -> dict:
    data = np.load(os.path.join(self.directory,
                                f"client-{self.client}-step-{step}.npz"))
    return {k: _from_shards(v.shape, v.sharding,
                            [data[f"{k}:{i}"] for i in range(len(_shards(v)))])
            for k, v in like.items()}


def _resume_step(checkpoints: _Checkpoints) -> int:
  """The last step every client saved (0 if one has none): an all-gather."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  mine = np.zeros([2], np.int64) - 1
  have = checkpoints.steps()[-2:]
  mine[:len(have)] = have
  everyone = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 2)
  common = set(everyone[0].tolist())
  for row in everyone[1:]:
    common &= set(row.tolist())
  common.discard(-1)
  return max(common) if common else 0


def train(mesh, steps: int, checkpoint_dir: str | None = None,
          step_delay: float = 0.0, straggler: int | None = None
          ) -> tuple[list[float], list[float], float, int]:
  """Trains on `mesh` (dims batch, model) and on one local device.

  Returns:
    (sharded losses, reference losses, median step seconds, the step it
    started from), the losses from that step on.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jdtensor.layout import UNSHARDED, Layout  # pylint: disable=g-import-not-at-top
  from jdtensor.steps import step_done  # pylint: disable=g-import-not-at-top

  params, x, y = _problem()
  layouts = {
      "w1": Layout([UNSHARDED, "model"], mesh),
      "b1": Layout(["model"], mesh),
      "w2": Layout(["model", UNSHARDED], mesh),
      "b2": Layout.replicated(mesh, 1),
  }
  data_layout = Layout.batch_sharded(mesh, "batch", 2)

  def put(value: np.ndarray, layout: Layout):
    return jax.make_array_from_callback(value.shape, layout.to_jax_sharding(),
                                        lambda index: value[index])

  shardings = {k: v.to_jax_sharding() for k, v in layouts.items()}
  sharded = {k: put(v, layouts[k]) for k, v in params.items()}
  xs, ys = put(x, data_layout), put(y, data_layout)
  start_step, checkpoints = 0, None
  if checkpoint_dir:
    checkpoints = _Checkpoints(checkpoint_dir, jax.process_index())
    start_step = _resume_step(checkpoints)
    if start_step:
      sharded = checkpoints.load(start_step, sharded)
      print(f"resumed from step {start_step}", flush=True)
  losses, times = [], []
  if start_step < steps:
    # One untimed step first, its result dropped (the step is a pure
    # function): it compiles, and its collectives connect the clients, so
    # that every timed step is a steady one, even with --steps 1.
    step = jax.jit(_train_step(), out_shardings=(shardings, None))
    jax.block_until_ready(step(sharded, xs, ys))
  for number in range(start_step, steps):
    if straggler == jax.process_index():
      time.sleep(STRAGGLER_SECONDS)  # A slow data loader: the others wait for it.
    start = time.perf_counter()
    sharded, loss = step(sharded, xs, ys)
    # The loss is replicated on every device; read this client's copy.
    losses.append(float(np.asarray(loss.addressable_data(0))))
    times.append(time.perf_counter() - start)
    step_done()  # The launcher's time to recovery, after a restart.
    if checkpoints is not None:
      checkpoints.save(number + 1, sharded)
      print(f"checkpoint step {number + 1}", flush=True)
    if step_delay:
      time.sleep(step_delay)

  device = jax.local_devices()[0]
  reference_step = jax.jit(_train_step())
  ref = jax.device_put(params, device)
  rx, ry = jax.device_put(x, device), jax.device_put(y, device)
  reference = []
  for _ in range(steps):
    ref, loss = reference_step(ref, rx, ry)
    reference.append(float(loss))
  return (losses, reference[start_step:],
          float(np.median(times)) if times else 0.0, start_step)


def run_demo_client(steps: int = 30, checkpoint_dir: str | None = None,
                    step_delay: float = 0.0, straggler: int | None = None) -> DemoResult:
  """One client of `jdtensor demo` (started by the launcher with DTENSOR_*).

  Args:
    steps: Training steps in all.
    checkpoint_dir: Where to save (and resume from) checkpoints.
    step_delay: Seconds to sleep after each step (to watch it, or kill it).
    straggler: The client whose every step first spends `STRAGGLER_SECONDS`
      in its own code (a slow data loader), or None.
  """
  import jdtensor  # pylint: disable=g-import-not-at-top
  from jdtensor import runtime  # pylint: disable=g-import-not-at-top

  jdtensor.initialize_accelerator_system("CPU")
  mesh = jdtensor.create_distributed_mesh([("batch", 4), ("model", 2)])
  print(f"pid {os.getpid()}", flush=True)
  losses, reference, step_seconds, start = train(mesh, steps, checkpoint_dir,
                                                 step_delay, straggler)
  jdtensor.barrier(mesh, "demo-end", timeout_in_ms=60_000)
  return DemoResult(mesh.to_string(), losses, reference,
                    runtime.state().init_seconds, step_seconds, start)


def report(result: DemoResult, prefix: str = "") -> bool:
  """Prints a short summary; returns whether the run matched the reference."""
  print(f"{prefix}mesh: {result.mesh}")
  if not result.losses:
    print(f"{prefix}nothing left to train (resumed at step {result.start_step})")
    return True
  ok = result.max_loss_difference <= _TOLERANCE
  resumed = f" (resumed at step {result.start_step})" if result.start_step else ""
  print(f"{prefix}init: {result.init_seconds * 1e3:.0f} ms, step: "
        f"{result.step_seconds * 1e3:.2f} ms, loss {result.losses[0]:.4f} -> "
        f"{result.losses[-1]:.4f} over {len(result.losses)} steps{resumed}")
  print(f"{prefix}max |loss - single-device loss| = "
        f"{result.max_loss_difference:.2e} (tolerance {_TOLERANCE:.0e}): "
        f"{'OK' if ok else 'MISMATCH'}")
  return ok
