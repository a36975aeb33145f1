"""A training-like client for the shapes users run: SCENARIO picks what client
CULPRIT does, READ how every client reads its result.

    SCENARIO=stall|exit0|late_start|late_first|late_end|busy|exitfalse|daemon|fork|
         atexit_raise|none
    READ=kept|temporary  CULPRIT=1  STEPS=20  LATE=<seconds>  BUSY_SECONDS=<seconds>
    GUARD=1 (jax.thread_guard)

Every client runs STEPS steps of a psum over a `jax.make_mesh` mesh of every
device (one or more per client) and checks each result. At step 3, client CULPRIT
misbehaves and prints ``MISBEHAVING <unix time>`` first:

* stall: sleeps in its own code (a stuck data loader), alive;
* exit0 / exitfalse: ``sys.exit(0)`` / ``sys.exit(False)`` mid-run (exitfalse
  with CULPRIT absent: every client ends with ``sys.exit(False)``, as
  ``absltest.main()`` does);
* late_start: starts LATE s after the others (before it imports anything:
  started by hand, or on a node that boots late);
* late_first: sleeps LATE s before its first collective (a slow set-up);
* late_end: works LATE s after its last step (a long final save);
* busy: a long computation on its own devices (JAX, not a collective), one
  XLA call of at least BUSY_SECONDS s;
* daemon: every client leaves a daemon thread issuing psums at its end
  (PYTHON_MS: milliseconds of Python-only work before each);
* fork: forks a child that ends with ``sys.exit(0)``;
* atexit_raise: every client registers an exit handler (it prints
  ``HANDLER RAN``), and client CULPRIT raises.
"""

import atexit
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

if (os.environ.get("SCENARIO") == "late_start"
    and os.environ.get("CULPRIT") == os.environ.get("DTENSOR_CLIENT_ID")):
  time.sleep(float(os.environ.get("LATE", "10")))

import jdtensor  # noqa: E402

jdtensor.initialize_accelerator_system("CPU")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks._busy import one_long_call  # noqa: E402
from tests.client_common import psum_over_every_device  # noqa: E402

n, k, local = jax.process_count(), jax.process_index(), jax.local_device_count()
scen, bad = os.environ.get("SCENARIO", "none"), int(os.environ.get("CULPRIT", "-1"))
read = os.environ.get("READ", "kept")
late = float(os.environ.get("LATE", "10"))
psum, x = psum_over_every_device()
if os.environ.get("GUARD"):
  jax.thread_guard(True).__enter__()  # For the rest of the script.
if scen == "atexit_raise":
  atexit.register(lambda: print("HANDLER RAN", flush=True))


def announce():
  print(f"MISBEHAVING {time.time():.3f}", flush=True)


def next_batch(step):
  """Where a stuck data loader sits."""
  if k == bad and step == 3 and scen == "stall":
    announce()
    time.sleep(600)
  return step


def one_step():
  if read == "kept":  # The result kept in a variable while read.
    y = psum(x)
    return float(np.asarray(y.addressable_data(0))[0, 0])
  # A shard of a temporary: the usual way to read a replicated value.
  return float(np.asarray(psum(x).addressable_data(0))[0, 0])


if scen == "late_first" and k == bad:
  announce()
  time.sleep(late)
for step in range(int(os.environ.get("STEPS", "20"))):
  if k == bad and step == 3:
    if scen in ("exit0", "exitfalse"):
      announce()
      sys.exit(0 if scen == "exit0" else False)
    if scen == "busy":
      announce()
      # One XLA call of at least BUSY_SECONDS, whatever the machine's speed
      # or load. BUSY is the longest.
      longest = one_long_call(jnp.full((256, 256), 0.01, jnp.float32),
                              float(os.environ.get("BUSY_SECONDS", "2")), iters=300)
      print(f"BUSY {longest:.1f}", flush=True)
    if scen == "fork":
      announce()
      pid = os.fork()
      if pid == 0:
        sys.exit(0)
      os.waitpid(pid, 0)
    if scen == "atexit_raise":
      announce()
      raise ZeroDivisionError("division by zero")
  next_batch(step)
  total = one_step()
  if total != n * local:
    raise AssertionError(f"step {step}: psum gave {total}, expected {n * local}")
  time.sleep(0.05)
if scen == "late_end" and k == bad:
  announce()
  time.sleep(late)  # A long final save.
if scen == "daemon":
  python_ms = float(os.environ.get("PYTHON_MS", "0"))

  def forever():
    while True:
      until = time.perf_counter() + python_ms / 1e3
      while time.perf_counter() < until:
        pass  # Python-only work between steps (metrics, logging).
      one_step()
  threading.Thread(target=forever, daemon=True).start()
  time.sleep(0.3)
print("DONE", flush=True)
if scen == "exitfalse":
  sys.exit(False)
