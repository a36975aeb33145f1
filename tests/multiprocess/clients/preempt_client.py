"""A training loop that saves on preemption, as orbax's reached_preemption does.

Every client checks `multihost_utils.reached_preemption_sync_point(step)`
after each psum; at the agreed step it "saves" for SAVE_SECONDS, prints
``SAVED step <n>`` and exits 0 (``RUNNING`` after the first two steps). With SELF_TERM, client CULPRIT sends itself
SIGTERM at step 5 (a pod eviction); otherwise the launcher's own stop does.
"""
import os, sys, time, signal
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))
import jdtensor  # noqa: E402
jdtensor.initialize_accelerator_system("CPU")
import jax, numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
n, k, local = jax.process_count(), jax.process_index(), jax.local_device_count()
mesh = jax.make_mesh((n, local), ("b", "m"))
psum = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, ("b", "m")), mesh=mesh, in_specs=P("b", "m"), out_specs=P()))
x = jax.make_array_from_callback((n, local), NamedSharding(mesh, P("b", "m")), lambda idx: np.ones((1, 1), np.float32))
for step in range(int(os.environ.get("STEPS", "400"))):
  if k == int(os.environ.get("CULPRIT", "1")) and step == 5 and os.environ.get("SELF_TERM"):
    print(f"PREEMPTED {time.time():.3f}", flush=True); os.kill(os.getpid(), signal.SIGTERM)
  y = psum(x); float(np.asarray(y.addressable_data(0))[0, 0])
  if step == 1:
    print("RUNNING", flush=True)
  if multihost_utils.reached_preemption_sync_point(step):
    time.sleep(float(os.environ.get("SAVE_SECONDS", "1")))
    print(f"SAVED step {step}", flush=True)
    sys.exit(0)
  time.sleep(0.05)
print("DONE without a preemption", flush=True)
