"""Client CULPRIT falls silent in its start-up, after it met every client and
before its JAX coordination service comes up (as seen once under load:
nothing from client 0 for minutes, then client 1's StartupTimeoutError).

    SCENARIO=silent_service CULPRIT=0 STALL_SECONDS=600 python silent_service_client.py

The culprit's ``jax.distributed.initialize`` (what jdtensor's start-up calls
once the clients have met, and where client 0 starts the service) first
prints ``STALLING <unix time>`` and sleeps STALL_SECONDS; every other client
starts as usual and waits for the service within the init timeout. A client
that starts prints ``STARTED``.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import jax  # noqa: E402
import jax.distributed  # noqa: E402

import jdtensor  # noqa: E402
from tests.client_common import run_scenario  # noqa: E402


def stall_before_the_service(*args, **kwargs):
  print(f"STALLING {time.time():.3f}", flush=True)
  time.sleep(float(os.environ.get("STALL_SECONDS", "600")))
  return initialize(*args, **kwargs)


initialize = jax.distributed.initialize


def scenario_silent_service():
  if os.environ["DTENSOR_CLIENT_ID"] == os.environ.get("CULPRIT", "0"):
    jax.distributed.initialize = stall_before_the_service
  jdtensor.initialize_accelerator_system("CPU")
  print("STARTED", flush=True)


if __name__ == "__main__":
  run_scenario(globals())
