"""One client of benchmarks/bench_trace.py: STEPS steps of about 1 ms (1 ms
of the client's own Python, then a psum over every client: every client runs
the same count); prints ``SECONDS <s>``, the loop's wall time. Under
`jdtensor launch`.

    STEPS=10000 python benchmarks/_trace_client.py
"""

import os
import time

import jdtensor

jdtensor.initialize_accelerator_system("CPU")

import jax  # noqa: E402  (after the start-up, as a user's script)
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("b",))
step = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "b"), mesh=mesh,
                             in_specs=P("b"), out_specs=P()))
x = jax.make_array_from_callback((jax.device_count(),), NamedSharding(mesh, P("b")),
                                 lambda idx: np.ones(1, np.float32))
float(step(x)[0])  # Compiled, and every client here, before the clock starts.
start = time.perf_counter()
for _ in range(int(os.environ.get("STEPS", "10000"))):
  busy = time.perf_counter() + 0.001
  while time.perf_counter() < busy:  # The step's own work.
    pass
  float(step(x)[0])
print(f"SECONDS {time.perf_counter() - start:.4f}", flush=True)
