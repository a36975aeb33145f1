"""The whole client body on a worker thread, as Ray Train runs a training
function (on its ``TrainingThread``, while the main thread serves the
host's own loop).

    SCENARIO=clean|stall|linger|named|init_thread  CULPRIT=1  STEPS=12

The main thread starts a thread named ``TrainingThread`` and then waits in
a loop of short sleeps (a host's loop: never a collective). The worker
initialises jdtensor, builds a psum over every device and runs STEPS steps,
checking each result:

* clean: every client ends its steps; the main thread then ends;
* stall: client CULPRIT sleeps in its own code at step 3 (`next_batch`: a
  stuck data loader), printing ``MISBEHAVING <unix time>`` first;
* linger: as clean, but the main thread goes on 3 s after the worker ends
  (a Ray actor lives on after its training function);
* named: the main thread initialises, then starts the worker and names it
  with ``jdtensor.watch_thread`` (the worker's body skips initialising);
  client CULPRIT stalls as in stall;
* init_thread: the other way round: a short-lived thread initialises, the
  main thread runs the steps (no worker), and client CULPRIT stalls.

After step 1 the main thread prints ``STATUS <json>``, the heartbeat's
status as it reads it then; the worker prints ``DONE`` at the end.
"""

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import jdtensor  # noqa: E402

from tests.client_common import psum_over_every_device, scenario_name  # noqa: E402

SCENARIO = scenario_name()
CULPRIT = int(os.environ.get("CULPRIT", "1"))


def next_batch(me, step):
  """Where a stuck data loader would sit."""
  if SCENARIO in ("stall", "named", "init_thread") and me == CULPRIT and step == 3:
    print(f"MISBEHAVING {time.time():.3f}", flush=True)
    time.sleep(600)
  return step


def body():
  if SCENARIO not in ("named", "init_thread"):
    jdtensor.initialize_accelerator_system("CPU")
  import jax  # pylint: disable=g-import-not-at-top
  me, total = jax.process_index(), jax.device_count()
  psum, x = psum_over_every_device()
  for step in range(int(os.environ.get("STEPS", "12"))):
    next_batch(me, step)
    got = float(psum(x).addressable_data(0).ravel()[0])
    assert got == total, (step, got, total)
    if step == 1:
      stepped.set()
      time.sleep(0.5)  # The host's loop reads the status meanwhile.
  print("DONE", flush=True)


def run_body():
  """As Ray Train's TrainingThread runs the training function: its exception
  is kept for the host to report, not left to the thread's excepthook."""
  try:
    body()
  except Exception as e:  # pylint: disable=broad-except
    print(f"BODY RAISED {type(e).__name__}", flush=True)


stepped = threading.Event()
if SCENARIO == "init_thread":
  setup = threading.Thread(target=jdtensor.initialize_accelerator_system, args=("CPU",))
  setup.start()
  setup.join(120)
  body()
  sys.exit(0)
if SCENARIO == "named":
  jdtensor.initialize_accelerator_system("CPU")
worker = threading.Thread(target=run_body, name="TrainingThread")
worker.start()
if SCENARIO == "named":
  jdtensor.watch_thread(worker)
while worker.is_alive():  # The host's own loop.
  if stepped.wait(0.05):
    stepped.clear()
    from jdtensor import heartbeat  # pylint: disable=g-import-not-at-top
    status = heartbeat.current().status()  # As `jdtensor status` reads it.
    print("STATUS " + json.dumps({"thread": status["thread"], "where": status["where"]}),
          flush=True)
if SCENARIO == "linger":
  time.sleep(3)
