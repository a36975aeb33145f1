"""A training loop for the recovery tests, run by `jdtensor launch --max-restarts`.

Its step is one jit program (``LAYERS`` unrolled layers, a cross-client sum)
that takes long enough to compile to be kept by a compilation cache. After
each step it calls `jdtensor.step_done` (not with ``STEP_DONE=0``). Client
``KILL`` SIGKILLs itself after step ``KILL_AT`` of the first attempt. Prints ``RESULT attempt=...``:
the attempt, JAX's compilation-cache hits, and the first step's seconds
(compile or load, and run).
"""

import json
import os
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jdtensor

hits = []
jax.monitoring.register_event_listener(
    lambda event, **kwargs: hits.append(event)
    if event == "/jax/compilation_cache/cache_hits" else None)

LAYERS = int(os.environ.get("LAYERS", "60"))
STEPS = int(os.environ.get("STEPS", "4"))
KILL = int(os.environ.get("KILL", "-1"))
KILL_AT = int(os.environ.get("KILL_AT", "1"))
STEP_DONE = os.environ.get("STEP_DONE", "1") == "1"

jdtensor.initialize_accelerator_system("CPU")
attempt = int(os.environ["JDTENSOR_RESTART_COUNT"])
me = jdtensor.client_id()
mesh = jax.make_mesh((jax.device_count(),), ("x",))


@jax.jit
def step(w, x):
  for i in range(LAYERS):
    x = jnp.tanh(x @ w + i / LAYERS)
  return w - 1e-3 * jnp.mean(x), jnp.sum(x)


w = jnp.eye(16, dtype=jnp.float32)
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("x")),
    np.full((4 * jax.local_device_count(), 16), me + 1.0, np.float32))
first_step = None
for k in range(STEPS):
  began = time.monotonic()
  w, loss = step(w, x)
  float(loss)
  if first_step is None:
    first_step = time.monotonic() - began
  if STEP_DONE:
    jdtensor.step_done()
  if attempt == 0 and me == KILL and k == KILL_AT:
    os.kill(os.getpid(), signal.SIGKILL)
print("RESULT attempt=" + json.dumps({"attempt": attempt, "hits": len(hits),
                                     "first_step": first_step}), flush=True)
