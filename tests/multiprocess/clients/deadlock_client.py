"""Every client waits, for ever or for a long computation.

    SCENARIO=deadlock|compute  BUSY_SECONDS=<seconds>

Every client runs a psum over every device (the device group forms), then:

* deadlock: client 0 starts a second psum, which waits for the others;
  every other client waits on the coordination service for a key client 0
  sets only after that psum (a collective one of them never reaches: a
  circular wait, idle everywhere). Each prints ``WAITING <unix time>``
  first;
* compute: every client runs one long XLA call on its own devices, no
  collective (at least BUSY_SECONDS), then a psum, and prints ``DONE``.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import jdtensor  # noqa: E402

jdtensor.initialize_accelerator_system("CPU")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks._busy import one_long_call  # noqa: E402
from jdtensor.runtime import jax_private  # noqa: E402
from tests.client_common import psum_over_every_device, scenario_name  # noqa: E402

me = jax.process_index()
psum, x = psum_over_every_device()
jax.block_until_ready(psum(x))
if scenario_name() == "deadlock":
  print(f"WAITING {time.time():.3f}", flush=True)
  service = jax_private.coordination_client()
  if me == 0:
    jax.block_until_ready(psum(x))
    service.key_value_set("deadlock/go", "1")
  else:
    service.blocking_key_value_get("deadlock/go", 3_600_000)
else:
  one_long_call(jnp.full((256, 256), 0.01, jnp.float32),
                float(os.environ.get("BUSY_SECONDS", "8")), iters=300)
  jax.block_until_ready(psum(x))
  print("DONE", flush=True)
