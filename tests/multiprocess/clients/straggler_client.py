"""A training loop whose client 3 is a straggler: every step it spends
SLOW_SECONDS in its own data loader (`next_batch`) while the others wait for
it in the step's psum. STEPS steps, then a normal end.

    STEPS=40 SLOW_SECONDS=0.15 python straggler_client.py   (under jdtensor launch)
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import jdtensor  # noqa: E402

jdtensor.initialize_accelerator_system("CPU")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

n, k = jax.process_count(), jax.process_index()
mesh = jax.make_mesh((jax.device_count(),), ("b",))
step = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "b"), mesh=mesh,
                             in_specs=P("b"), out_specs=P()))


def next_batch():
  if k == 3:
    time.sleep(float(os.environ.get("SLOW_SECONDS", "0.15")))  # A slow loader.
  return jax.make_array_from_callback((jax.device_count(),),
                                      NamedSharding(mesh, P("b")),
                                      lambda idx: np.ones(1, np.float32))


print(f"READY {os.getpid()}", flush=True)
for i in range(int(os.environ.get("STEPS", "40"))):
  total = float(step(next_batch())[0])
  assert total == jax.device_count(), total
print("DONE", flush=True)
