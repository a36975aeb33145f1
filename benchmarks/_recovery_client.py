"""The training loop of benchmarks/bench_recovery.py and
tests/multiprocess/test_recovery.py (one client).

A step is one jit program of ``LAYERS`` unrolled layers with a cross-client
sum (``LAYERS=150``: about 5 s to compile on 2 cores); with ``CKPT``, every
``EVERY`` steps each client saves its weights (numpy,
``CKPT/step-<n>-client-<k>.npy``; with ``CKPT_KIND=orbax``, an orbax
``CheckpointManager`` in ``CKPT``), and after a restart every client resumes
from the last step all of them saved. After each step it calls
`jdtensor.step_done` (not with ``STEP_DONE=0``). Client ``KILL`` SIGKILLs
itself after step ``KILL_AT`` of the first attempt. Each phase's end is
printed as ``MARK <name> <time.time()>``: ``started`` (before any import),
``imported``, ``initialized``, ``restored``, ``first_step`` (compiled and
run), ``done``; at the end, ``RESULT attempt=...``: the attempt and the
programs JAX loaded from its compilation cache up to the end of the
attempt's first step (``hits``, by name: the step is ``jit_step``).
"""

import time

STARTED = time.time()

import glob  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jdtensor  # noqa: E402


def mark(name: str, at: float | None = None) -> None:
  print(f"MARK {name} {time.time() if at is None else at:.6f}", flush=True)


hits: list[str] = []


class _CacheHits(logging.Handler):
  """The programs JAX loads from its persistent cache (its debug line
  ``Persistent compilation cache hit for '<name>'``), by name."""

  def emit(self, record: logging.LogRecord) -> None:
    if record.msg.startswith("Persistent compilation cache hit for") and record.args:
      hits.append(str(record.args[0]))


_compiler_log = logging.getLogger("jax._src.compiler")
_compiler_log.setLevel(logging.DEBUG)
_compiler_log.propagate = False  # Only the hits, none of JAX's other debug lines.
_compiler_log.addHandler(_CacheHits())
mark("started", STARTED)
mark("imported")
LAYERS = int(os.environ.get("LAYERS", "150"))
STEPS = int(os.environ.get("STEPS", "40"))
EVERY = int(os.environ.get("EVERY", "10"))
KILL = int(os.environ.get("KILL", "2"))
KILL_AT = int(os.environ.get("KILL_AT", "25"))
CKPT = os.environ.get("CKPT")
ORBAX = os.environ.get("CKPT_KIND") == "orbax"  # Else numpy files.
STEP_DONE = os.environ.get("STEP_DONE", "1") == "1"

jdtensor.initialize_accelerator_system(os.environ.get("DEVICE", "CPU"))
me, n = jdtensor.client_id(), jdtensor.num_clients()
attempt = int(os.environ.get("JDTENSOR_RESTART_COUNT", "0"))
mark("initialized")


def saved_by_all() -> int:
  """The last step every client saved (0: none)."""
  if not CKPT:
    return 0
  steps = set()
  for path in glob.glob(os.path.join(CKPT, "step-*-client-0.npy")):
    step = int(os.path.basename(path).split("-")[1])
    if all(os.path.exists(os.path.join(CKPT, f"step-{step}-client-{k}.npy"))
           for k in range(n)):
      steps.add(step)
  return max(steps, default=0)


@jax.jit
def step(w, x):
  for i in range(LAYERS):
    x = jnp.tanh(x @ w + i / LAYERS)
  return w - 1e-3 * jnp.mean(x), jnp.sum(x)


mesh = jax.make_mesh((jax.device_count(),), ("x",))
# Replicated on every device of every client: what orbax restores it to.
w = jax.device_put(jnp.eye(32, dtype=jnp.float32), NamedSharding(mesh, P()))
manager = None
if CKPT and ORBAX:
  import orbax.checkpoint as ocp  # noqa: E402  (an optional extra)
  manager = ocp.CheckpointManager(CKPT, options=ocp.CheckpointManagerOptions(max_to_keep=2))
  start = manager.latest_step() or 0
  if start:
    w = manager.restore(start, args=ocp.args.StandardRestore(
        {"w": ocp.utils.to_shape_dtype_struct(w)}))["w"]
else:
  start = saved_by_all()
  if start:
    # Placed as attempt 0 placed it: an array placed otherwise is another
    # program for JAX (compiled again, never loaded from the cache).
    w = jax.device_put(np.load(os.path.join(CKPT, f"step-{start}-client-{me}.npy")),
                       NamedSharding(mesh, P()))
mark("restored")
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("x")),
    np.full((4 * jax.local_device_count(), 32), me + 1.0, np.float32))
first_step_hits: list[str] = []
for k in range(start, STEPS):
  w, loss = step(w, x)
  float(loss)
  if k == start:
    mark("first_step")
    first_step_hits = sorted(set(hits))
  if STEP_DONE:
    jdtensor.step_done()
  if CKPT and (k + 1) % EVERY == 0:
    if manager is not None:
      manager.save(k + 1, args=ocp.args.StandardSave({"w": w}))
    else:
      np.save(os.path.join(CKPT, f"step-{k + 1}-client-{me}.npy"), np.asarray(w))
  if attempt == 0 and me == KILL and k + 1 == KILL_AT:
    mark("killed")
    os.kill(os.getpid(), signal.SIGKILL)
if manager is not None:
  manager.wait_until_finished()
  manager.close()
mark("done")
print("RESULT attempt=" + json.dumps({"attempt": attempt, "hits": first_step_hits}),
      flush=True)
