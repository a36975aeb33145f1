"""A step loop for hang triage, synchronised by a collective or by the
coordination service alone.

    SCENARIO=stall|lock|load|setup|upload|write|none SYNC=psum|barrier [CULPRIT=1] \
      python hang_client.py

Every step, each client loads its next batch (STEP_SECONDS of idle own code,
a data loader), then meets the others: SYNC=psum, a psum over every device
of a `jax.make_mesh` mesh; SYNC=barrier, a coordination-service barrier
(``client.wait_at_barrier``, as checkpointing and data pipelines do). From
the first step after MISBEHAVE_AFTER seconds of the loop, client CULPRIT:

* SCENARIO=stall: hangs in its data loader (a 600 s sleep);
* SCENARIO=lock: hangs on a lock that is never released;
* SCENARIO=load: loads one batch for LOAD_SECONDS (a rare long idle load,
  then the loop goes on);
* SCENARIO=upload: uploads for LOAD_SECONDS to the server at UPLOAD_PORT,
  which takes the bytes slowly (a trickle), then goes on;
* SCENARIO=write: writes a file in small pieces for LOAD_SECONDS (a slow
  file system), then goes on.

SCENARIO=setup: every client meets the others once
(``multihost_utils.sync_global_devices``), then client CULPRIT spends
LOAD_SECONDS idle before its first step (loading a checkpoint from remote
storage) while the others wait in the first step's collective.

It prints ``MISBEHAVING <unix time>`` first. STEPS steps, then ``DONE``.
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


load_seconds = float(os.environ.get("LOAD_SECONDS", "5"))


def upload() -> None:
  """Sends for `load_seconds` to a server that reads slowly (send() blocks
  on its full socket buffer most of the time)."""
  import socket  # pylint: disable=g-import-not-at-top
  end = time.monotonic() + load_seconds
  with socket.create_connection(("127.0.0.1", int(os.environ["UPLOAD_PORT"]))) as sock:
    sock.settimeout(1.0)
    while time.monotonic() < end:
      try:
        sock.send(b"u" * 16384)
      except TimeoutError:
        pass


def write_slowly() -> None:
  """Writes 4 KiB every 50 ms for `load_seconds`."""
  import tempfile  # pylint: disable=g-import-not-at-top
  end = time.monotonic() + load_seconds
  with tempfile.TemporaryFile() as f:
    while time.monotonic() < end:
      f.write(b"w" * 4096)
      f.flush()
      time.sleep(0.05)


def next_batch(late: bool) -> None:
  """Where a data loader sits: idle, in the program's own code."""
  if late and what == "stall":
    time.sleep(600)
  elif late and what == "lock":
    import threading  # pylint: disable=g-import-not-at-top
    never = threading.Lock()
    never.acquire()
    never.acquire()
  elif late and what == "load":
    time.sleep(load_seconds)
  elif late and what == "upload":
    upload()
  elif late and what == "write":
    write_slowly()
  else:
    time.sleep(step_seconds)


from jdtensor import heartbeat  # noqa: E402
if heartbeat.current() is not None:
  heartbeat.current().ready.wait(60)
if what == "setup":
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  multihost_utils.sync_global_devices("start")
  if k == culprit:
    print(f"MISBEHAVING {time.time():.3f} set-up", flush=True)
    time.sleep(load_seconds)  # Loading a checkpoint from remote storage.
started, misbehaved = time.monotonic(), what == "setup"
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
