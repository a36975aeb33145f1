"""Resume after a failure or a preemption: orbax checkpoints, jdtensor restarts.

Every 5 steps orbax saves the state (each client its own shards, in one
checkpoint); a new attempt (`--max-restarts`) or a new launch restores the
latest one and goes on from the step after it. A preemption notice
(SIGTERM to any client, or to `jdtensor launch`) saves the agreed step at
once and ends the run with exit 0; the same command then resumes there.
`jdtensor.step_done()` gives the launcher each restart's time to recovery.

Here client 1 is SIGKILLed after step 12 of the first attempt
(``DEMO_KILL_AT``); ``DEMO_PREEMPT_AT`` sends client 1 a SIGTERM instead.

Run: DEMO_KILL_AT=12 jdtensor launch -n 2 --max-restarts 1 -- python restart_orbax.py
Needs: orbax.checkpoint
Expect: [client 0] resumed after step 10
Expect: [client 1] resumed after step 10
Expect: [client 0] done: step 99
Expect: jdtensor launch: time to recovery: restart 1 after client 1's failure:
"""
import os
import signal
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec as P

import jdtensor

jdtensor.initialize_accelerator_system("CPU")
me, attempt = jdtensor.client_id(), int(os.environ.get("JDTENSOR_RESTART_COUNT", "0"))
folder = os.path.join(os.environ.get("CHECKPOINTS", tempfile.gettempdir()), "orbax-run")
manager = ocp.CheckpointManager(folder, options=ocp.CheckpointManagerOptions(
    max_to_keep=2, save_interval_steps=5))

mesh = jax.make_mesh((jax.device_count(),), ("data",))
state = {"w": jax.device_put(jnp.zeros((8, 4)), NamedSharding(mesh, P()))}
first = last = 0
if manager.latest_step() is not None:  # A restart, or a launch after a preemption.
  saved = manager.latest_step()
  state = manager.restore(saved, args=ocp.args.StandardRestore(
      jax.tree.map(ocp.utils.to_shape_dtype_struct, state)))
  first = saved + 1
  print(f"resumed after step {saved}", flush=True)


@jax.jit
def train_step(w, x):
  loss = jnp.mean((x @ w - 1.0) ** 2)
  return w - 0.1 * jax.grad(lambda v: jnp.mean((x @ v - 1.0) ** 2))(w), loss


batch = NamedSharding(mesh, P("data"))
for step in range(first, 100):
  x = jax.make_array_from_callback((2 * jax.device_count(), 8), batch,
                                   lambda idx: np.full((2, 8), 0.1, np.float32))
  w, loss = train_step(state["w"], x)
  state, last = {"w": w}, step
  print(f"step {step}: loss {float(loss):.4f}", flush=True)
  jdtensor.step_done()
  time.sleep(0.03)  # The rest of a training step: a notice reaches every client.
  if manager.reached_preemption(step):  # Every client at the same step.
    manager.save(step, args=ocp.args.StandardSave(state), force=True)
    manager.wait_until_finished()
    print(f"preempted: saved step {step}", flush=True)
    sys.exit(0)
  manager.save(step, args=ocp.args.StandardSave(state))
  if attempt == 0 and me == 1:
    if step == int(os.environ.get("DEMO_KILL_AT", "-1")):
      manager.wait_until_finished()
      os.kill(os.getpid(), signal.SIGKILL)  # A crash: the group restarts.
    if step == int(os.environ.get("DEMO_PREEMPT_AT", "-1")):
      os.kill(os.getpid(), signal.SIGTERM)  # An eviction: a preemption notice.
manager.wait_until_finished()
manager.close()
print(f"done: step {last}", flush=True)
