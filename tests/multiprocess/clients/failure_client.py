"""A training-like client whose client 1 misbehaves at step 3.

    SCENARIO=exception|exit0|exit3|stall|gil|sigstop|sigkill|none [CULPRIT=1] \
      python failure_client.py

Every client runs STEPS steps of a psum over a `jax.make_mesh` mesh of every
device and checks each result. At step 3, client 1 (or CULPRIT,
or "all") raises, calls sys.exit, sleeps in its own code (a stuck data loader), holds
the GIL in C for GIL_SECONDS, stops itself for STOP_SECONDS (a helper
sends SIGCONT), or SIGKILLs itself while the others wait for it in the psum. It prints ``MISBEHAVING <unix time>`` first, so tests can
time what follows. With FORK_WORKER=fork (or setsid), the misbehaving
client first starts a data loader's worker with multiprocessing's 'fork'
start method (PyTorch's DataLoader and grain do), which sleeps (after
``os.setsid()``: out of its parent's session), and prints ``WORKER <pid>``.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import jdtensor  # noqa: E402

jdtensor.initialize_accelerator_system("CPU")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from tests.client_common import psum_over_every_device  # noqa: E402

n, k, local = jax.process_count(), jax.process_index(), jax.local_device_count()
# "all": every client misbehaves, the others LATE_SECONDS after client 0.
bad = os.environ.get("CULPRIT", "1")
bad = k if bad == "all" else int(bad)
psum, x = psum_over_every_device()


def data_loader_worker(setsid):
  if setsid:
    os.setsid()
  time.sleep(600)


if os.environ.get("FORK_WORKER") and k == bad:
  import multiprocessing  # noqa: E402
  worker = multiprocessing.get_context("fork").Process(
      target=data_loader_worker, args=(os.environ["FORK_WORKER"] == "setsid",),
      daemon=True)
  worker.start()
  print(f"WORKER {worker.pid}", flush=True)


def next_batch(step):
  """Where a stuck data loader would sit."""
  if k == bad and step == 3 and what == "stall":
    time.sleep(600)
  return step


def misbehave(what):
  if k != 0:
    time.sleep(float(os.environ.get("LATE_SECONDS", "0")))
  print(f"MISBEHAVING {time.time():.3f}", flush=True)
  if what == "exception":
    return 1 / 0
  if what == "exit0":
    sys.exit(0)
  if what == "exit3":
    sys.exit(3)
  if what == "gil":  # PyDLL keeps the GIL for the whole C call.
    ctypes.PyDLL(None).sleep(int(os.environ.get("GIL_SECONDS", "20")))
  if what == "sigkill":  # The others are blocked in the psum, reading from us.
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
  if what == "sigstop":
    subprocess.Popen(["sh", "-c", f"sleep {os.environ.get('STOP_SECONDS', '10')}; "
                      f"kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)
  return None


what = os.environ.get("SCENARIO", "none")
# Under `jdtensor launch --max-restarts`: misbehave on that attempt only.
only_on = os.environ.get("SCENARIO_ON_ATTEMPT")
if only_on is not None and os.environ.get("JDTENSOR_RESTART_COUNT") != only_on:
  what = "none"
print(f"ATTEMPT {os.environ.get('JDTENSOR_RESTART_COUNT')}", flush=True)
from jdtensor import heartbeat  # noqa: E402
if heartbeat.current() is not None:  # Misbehave in the steady state.
  heartbeat.current().ready.wait(60)
for step in range(int(os.environ.get("STEPS", "30"))):
  if k == bad and step == 3 and what != "stall":
    misbehave(what)
  if k == bad and step == 3 and what == "stall":
    print(f"MISBEHAVING {time.time():.3f}", flush=True)
  next_batch(step)
  y = psum(x)  # Held while read, as user code does (e.g. `float(loss)`).
  total = float(np.asarray(y.addressable_data(0))[0, 0])
  if total != n * local:
    raise AssertionError(f"step {step}: psum gave {total}, expected {n * local}")
  time.sleep(0.05)
print("DONE", flush=True)
