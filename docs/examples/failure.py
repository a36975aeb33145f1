"""Client 1 raises in its third step: every client, and the launcher, name it.

Run: jdtensor launch -n 3 --grace 5 -- python failure.py
Exit: 1
Expect: [client 0] heartbeat: client 1 failed: ZeroDivisionError: float division by zero (failure.py:20 in step); stopping this client
Expect: jdtensor launch: client 1 exited with code 1: ZeroDivisionError: float division by zero (failure.py:20 in step); stopped clients none
"""
import numpy as np
from jax.experimental import multihost_utils

import jdtensor

jdtensor.initialize_accelerator_system("CPU")


def step(i: int) -> float:
  """One step: every client joins a cross-client sum, except a failing one."""
  mine = float(jdtensor.client_id() + i)
  if jdtensor.client_id() == 1 and i == 3:
    mine = mine / 0  # The bug.
  return float(multihost_utils.process_allgather(np.float32(mine)).sum())


for i in range(10):
  print(f"step {i}: {step(i)}", flush=True)
