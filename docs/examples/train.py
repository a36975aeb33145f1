"""Data + model parallel on a DTensor-style mesh: the same file for every client.

Run: jdtensor launch -n 4 --devices-per-client 2 -- python train.py
Expect: [client 1] |batch=4,model=2|0,1,2,3,4,5,6,7|2,3|/job:worker/replica:0/task:1/device:CPU:0,
Expect: [client 3] y: global (8, 8), local shards [(2, 4), (2, 4)], sum 1024.0
"""
import jax
import jax.numpy as jnp

import jdtensor
from jdtensor import UNSHARDED, Layout

jdtensor.initialize_accelerator_system("CPU")  # Reads DTENSOR_*, joins the cluster.
mesh = jdtensor.create_distributed_mesh([("batch", 4), ("model", 2)])
print(mesh.to_string())  # DTensor's string: dense global and local ids.

# A weight sharded over "model", a batch sharded over "batch": each client
# gives only its own rows (pack), JAX sees one global array.
w = jdtensor.call_with_layout(jnp.ones, Layout([UNSHARDED, "model"], mesh), (16, 8))
x = jdtensor.pack([jnp.ones((2, 16))] * mesh.num_local_devices(),
                  Layout.batch_sharded(mesh, "batch", rank=2))  # Global (8, 16).
y = jax.jit(lambda a, b: a @ b)(x, w)  # Real cross-client collectives.
total = jax.jit(jnp.sum, out_shardings=Layout.replicated(mesh, 0).to_jax_sharding())(y)
print(f"y: global {y.shape}, local shards {[s.shape for s in jdtensor.unpack(y)]}, "
      f"sum {float(total)}")
jdtensor.barrier(mesh, "done", timeout_in_ms=60_000)
