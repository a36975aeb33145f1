"""The hand-written baseline: what users write with plain jax.distributed.

    python benchmarks/_raw_jax_client.py first_collective|rss|wait_to_be_killed

Reads DTENSOR_JOBS / DTENSOR_CLIENT_ID / JAX_NUM_CPU_DEVICES like the jdtensor
client, and does the same work with JAX's defaults.
"""

import os
import sys
import time

jobs = os.environ["DTENSOR_JOBS"].split(",")
client = int(os.environ["DTENSOR_CLIENT_ID"])

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))
jax.distributed.initialize(coordinator_address=jobs[0], num_processes=len(jobs),
                           process_id=client)

import numpy as np  # noqa: E402
from jax._src import distributed  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

if sys.argv[1] == "wait_to_be_killed":
  print(f"READY {os.getpid()}", flush=True)
  time.sleep(600)
  sys.exit(0)

mesh = Mesh(np.array(jax.devices()), ("x",))
n = mesh.size
x = jax.make_array_from_callback((n,), NamedSharding(mesh, P("x")),
                                 lambda idx: np.ones(n, np.float32)[idx])
total = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "x"), mesh=mesh,
                              in_specs=P("x"), out_specs=P()))(x)
assert float(np.asarray(total.addressable_data(0))[0]) == n
print(f"FIRST_COLLECTIVE_AT {time.time():.6f}", flush=True)
if sys.argv[1] == "rss":
  time.sleep(2.0)
  from benchmarks._client import rss_mib  # noqa: E402
  print(f"RSS_MIB {rss_mib():.1f}", flush=True)
distributed.global_state.client.wait_at_barrier("bench-done", 60_000)
os._exit(0)
