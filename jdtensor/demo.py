"""`jdtensor demo`: data + model parallel MLP training on a DTensor mesh.

Trains a small MLP with the batch sharded over mesh dimension ``batch`` and
the hidden layer sharded over ``model`` (Layout -> NamedSharding), then checks
that the loss curve equals an unsharded single-device run of the same model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

__all__ = ["DemoResult", "run_demo_client", "train", "report"]

_IN, _HIDDEN, _OUT, _BATCH = 16, 32, 4, 32
_LEARNING_RATE = 0.1
_TOLERANCE = 1e-5


@dataclass
class DemoResult:
  """What one client saw.

  Attributes:
    mesh: The mesh string.
    losses: Loss per step, sharded run.
    reference_losses: Loss per step, unsharded single-device run.
    init_seconds: Time spent in initialize_accelerator_system.
    step_seconds: Median wall time of a training step (after compilation).
  """
  mesh: str
  losses: list[float]
  reference_losses: list[float]
  init_seconds: float
  step_seconds: float

  @property
  def max_loss_difference(self) -> float:
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


def train(mesh, steps: int) -> tuple[list[float], list[float], float]:
  """Trains on `mesh` (dims batch, model) and on one local device.

  Returns:
    (sharded losses, reference losses, median step seconds).
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jdtensor.layout import UNSHARDED, Layout  # pylint: disable=g-import-not-at-top

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
  step = jax.jit(_train_step(), out_shardings=(shardings, None))
  sharded = {k: put(v, layouts[k]) for k, v in params.items()}
  xs, ys = put(x, data_layout), put(y, data_layout)
  losses, times = [], []
  for _ in range(steps):
    start = time.perf_counter()
    sharded, loss = step(sharded, xs, ys)
    # The loss is replicated on every device; read this client's copy.
    losses.append(float(np.asarray(loss.addressable_data(0))))
    times.append(time.perf_counter() - start)

  device = jax.local_devices()[0]
  reference_step = jax.jit(_train_step())
  ref = jax.device_put(params, device)
  rx, ry = jax.device_put(x, device), jax.device_put(y, device)
  reference = []
  for _ in range(steps):
    ref, loss = reference_step(ref, rx, ry)
    reference.append(float(loss))
  return losses, reference, float(np.median(times[1:] or times))


def run_demo_client(steps: int = 30) -> DemoResult:
  """One client of `jdtensor demo` (started by the launcher with DTENSOR_*)."""
  import jdtensor  # pylint: disable=g-import-not-at-top
  from jdtensor import runtime  # pylint: disable=g-import-not-at-top

  jdtensor.initialize_accelerator_system("CPU")
  mesh = jdtensor.create_distributed_mesh([("batch", 4), ("model", 2)])
  losses, reference, step_seconds = train(mesh, steps)
  jdtensor.barrier(mesh, "demo-end", timeout_in_ms=60_000)
  return DemoResult(mesh.to_string(), losses, reference,
                    runtime.state().init_seconds, step_seconds)


def report(result: DemoResult, prefix: str = "") -> bool:
  """Prints a short summary; returns whether the run matched the reference."""
  ok = result.max_loss_difference <= _TOLERANCE
  print(f"{prefix}mesh: {result.mesh}")
  print(f"{prefix}init: {result.init_seconds * 1e3:.0f} ms, step: "
        f"{result.step_seconds * 1e3:.2f} ms, loss {result.losses[0]:.4f} -> "
        f"{result.losses[-1]:.4f} over {len(result.losses)} steps")
  print(f"{prefix}max |loss - single-device loss| = "
        f"{result.max_loss_difference:.2e} (tolerance {_TOLERANCE:.0e}): "
        f"{'OK' if ok else 'MISMATCH'}")
  return ok
