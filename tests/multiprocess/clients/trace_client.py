"""A run worth a picture: a set-up, a straggler, then a stall.

Every client sets up for SETUP_SECONDS before its first collective; then
STEPS steps of a psum, client 3 spending SLOW_SECONDS in its own data loader
each step (a straggler); then client STALLER stops taking part (its own
code, idle) while the others wait in the next psum, until the heartbeat
names it (with a short JDTENSOR_STALL_TIMEOUT). FAIL_FIRST_ATTEMPT=1: client 1
raises after its set-up on the first attempt (for --max-restarts).
LATE_BARRIER=S: every client meets at a barrier of the coordination service
(`jdtensor.barrier`) after its set-up, client 1 S seconds late.

    SETUP_SECONDS=1 STEPS=25 SLOW_SECONDS=0.15 STALLER=2 \\
        jdtensor launch -n 4 --trace run.json -- python trace_client.py
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

k = jax.process_index()
mesh = jax.make_mesh((jax.device_count(),), ("b",))
step = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "b"), mesh=mesh,
                             in_specs=P("b"), out_specs=P()))


def load_model():
  time.sleep(float(os.environ.get("SETUP_SECONDS", "1")))  # Reading a checkpoint.


def next_batch():
  if k == 3:
    time.sleep(float(os.environ.get("SLOW_SECONDS", "0.15")))  # A slow loader.
  return jax.make_array_from_callback((jax.device_count(),),
                                      NamedSharding(mesh, P("b")),
                                      lambda idx: np.ones(1, np.float32))


def stuck_upload():
  print(f"STALLING {time.time():.3f}", flush=True)
  time.sleep(3600)  # Never comes back: the others wait in the next psum.


load_model()
if os.environ.get("LATE_BARRIER"):  # Client 1 reaches the start barrier late.
  if k == 1:
    time.sleep(float(os.environ["LATE_BARRIER"]))
  jdtensor.barrier(jdtensor.create_distributed_mesh([("x", jax.device_count())]), "start")
if (k == 1 and os.environ.get("FAIL_FIRST_ATTEMPT")
    and os.environ.get("JDTENSOR_RESTART_COUNT") == "0"):
  raise ValueError("client 1 fails on the first attempt")
staller = int(os.environ.get("STALLER", "-1"))
for i in range(int(os.environ.get("STEPS", "25"))):
  total = float(step(next_batch())[0])
  assert total == jax.device_count(), total
if k == staller:
  stuck_upload()
float(step(next_batch())[0])
print("DONE", flush=True)
