"""A client that holds FILES open files (a data loader's shards) before it
joins the run, so that its sockets get descriptors past 1024; then every
client runs psums, and client CULPRIT (if any) is SIGKILLed at step 3 while the
others wait in the psum."""

import os
import resource
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

files = int(os.environ.get("FILES", "1100"))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < files + 256:  # What a data loader's user does first.
  resource.setrlimit(resource.RLIMIT_NOFILE, (min(files + 256, hard), hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(files)]

import jdtensor  # noqa: E402

jdtensor.initialize_accelerator_system("CPU")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

n, k = jax.process_count(), jax.process_index()
bad = int(os.environ.get("CULPRIT", "-1"))
mesh = jax.make_mesh((n,), ("b",))
psum = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "b"), mesh=mesh,
                             in_specs=P("b"), out_specs=P()))
x = jax.make_array_from_callback((n,), NamedSharding(mesh, P("b")),
                                 lambda idx: np.ones((1,), np.float32))
print(f"FDS {held[-1]}", flush=True)
for step in range(8):
  if k == bad and step == 3:
    os.kill(os.getpid(), signal.SIGKILL)
  total = float(np.asarray(psum(x).addressable_data(0))[0])
  assert total == n, total
print("DONE", flush=True)
