"""The jax_single tests share this process's backend: 8 simulated CPU devices.

Set as JAX's config before the backend starts (the first test that touches
devices starts it), not in the environment, which launched clients inherit.
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)
