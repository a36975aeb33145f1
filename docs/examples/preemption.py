"""Save on preemption: SIGTERM to one client, every client saves the same step.

JAX takes SIGTERM as a preemption notice. `reached_preemption_sync_point`
(what orbax's ``CheckpointManager.reached_preemption`` calls) turns true at
the same step on every client; each saves that step and exits 0. Here client
1 is evicted at step 5 (a pod eviction would send the same SIGTERM); Ctrl-C
or SIGTERM to `jdtensor launch` reach every client the same way.

Run: jdtensor launch -n 2 -- python preemption.py
Expect: [client 0] preempted: saved step
Expect: [client 1] preempted: saved step
"""
import os
import signal
import sys
import tempfile
import time

import numpy as np
from jax.experimental import multihost_utils

import jdtensor

jdtensor.initialize_accelerator_system("CPU")
state = np.zeros(4, np.float32)
checkpoints = os.environ.get("CHECKPOINTS", tempfile.gettempdir())

for step in range(10_000):
  if jdtensor.client_id() == 1 and step == 5:
    os.kill(os.getpid(), signal.SIGTERM)  # The eviction.
  state += multihost_utils.process_allgather(np.float32(step)).sum()
  time.sleep(0.01)  # The rest of a training step.
  if multihost_utils.reached_preemption_sync_point(step):
    path = os.path.join(checkpoints, f"client-{jdtensor.client_id()}-step-{step}.npy")
    np.save(path, state)  # A real job saves with orbax here.
    print(f"preempted: saved step {step} to {path}", flush=True)
    sys.exit(0)
print("finished without a preemption")
