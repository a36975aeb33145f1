"""A step loop for hang triage, synchronised by a collective or by the
coordination service alone.

    SCENARIO=stall|load|none SYNC=psum|barrier [CULPRIT=1] python hang_client.py

Every step, each client loads its next batch (STEP_SECONDS of idle own code,
a data loader), then meets the others: SYNC=psum, a psum over every device
of a `jax.make_mesh` mesh; SYNC=barrier, a coordination-service barrier
(``client.wait_at_barrier``, as checkpointing and data pipelines do). From
the first step after MISBEHAVE_AFTER seconds of the loop, client CULPRIT
stalls in its data loader (SCENARIO=stall, 600 s) or loads one batch for
LOAD_SECONDS (SCENARIO=load: a rare long idle load, then the loop goes on).
It prints ``MISBEHAVING <unix time>`` first. STEPS steps, then ``DONE``.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import jdtensor  # noqa: E402

jdtensor.initialize_accelerator_system("CPU")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from tests.client_common import psum_over_every_device, scenario_name  # noqa: E402

n, k, local = jax.process_count(), jax.process_index(), jax.local_device_count()
what = scenario_name()
culprit = int(os.environ.get("CULPRIT", "1"))
sync = os.environ.get("SYNC", "psum")
step_seconds = float(os.environ.get("STEP_SECONDS", "0.2"))
misbehave_after = float(os.environ.get("MISBEHAVE_AFTER", "0"))
psum, x = psum_over_every_device()
if sync == "barrier":
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  client = distributed.global_state.client


def next_batch(late: bool) -> None:
  """Where a data loader sits: idle, in the program's own code."""
  if late and what == "stall":
    time.sleep(600)
  elif late and what == "load":
    time.sleep(float(os.environ.get("LOAD_SECONDS", "5")))
  else:
    time.sleep(step_seconds)


from jdtensor import heartbeat  # noqa: E402
if heartbeat.current() is not None:
  heartbeat.current().ready.wait(60)
started, misbehaved = time.monotonic(), False
for step in range(int(os.environ.get("STEPS", "100000"))):
  late = (k == culprit and not misbehaved and what != "none"
          and time.monotonic() - started >= misbehave_after)
  if late:
    misbehaved = True
    print(f"MISBEHAVING {time.time():.3f} step {step}", flush=True)
  next_batch(late)
  if sync == "barrier":
    client.wait_at_barrier(f"step-{step}", 900_000)
  else:
    total = float(np.asarray(psum(x).addressable_data(0))[0, 0])
    assert total == n * local, (step, total)
print("DONE", flush=True)
