"""One process with 8 simulated CPU devices: DTensor's meshes and layouts as JAX objects.

Run: python single_process.py
Expect: |x=2,y=4|0,1,2,3,4,5,6,7|0,1,2,3,4,5,6,7|/job:localhost/replica:0/task:0/device:CPU:0,
Expect: sharding: NamedSharding(mesh=Mesh('x': 2, 'y': 4
Expect: layout: sharding_specs:x,y, mesh:|x=2,y=4|
Expect: relayout: sharding_specs:unsharded,y, mesh:|x=2,y=4|
"""
import jax
import jax.numpy as jnp

import jdtensor

# Before anything starts JAX's backend: fixes the simulated device count
# (as JAX_NUM_CPU_DEVICES=8 or XLA_FLAGS=--xla_force_host_platform_device_count=8 would).
jdtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=8)

mesh = jdtensor.create_mesh([("x", 2), ("y", 4)])
print(mesh.to_string())
layout = jdtensor.Layout(["x", "y"], mesh)
print("sharding:", layout.to_jax_sharding())  # A plain jax.sharding.NamedSharding.

a = jax.device_put(jnp.arange(32.0).reshape(4, 8), layout.to_jax_sharding())
print("layout:", jdtensor.fetch_layout(a).to_string()[:40])
b = jdtensor.relayout(a, jdtensor.Layout([jdtensor.UNSHARDED, "y"], mesh))
print("relayout:", jdtensor.fetch_layout(b).to_string()[:50])
assert float(b.sum()) == float(jnp.arange(32.0).sum())
