"""Misbehaving clients for the fault suite (tests/faults): `python fault_client.py SCENARIO`
(see tests/client_common.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

from tests.client_common import result, run_scenario  # noqa: E402


def scenario_die_after_rendezvous():
  """Client 1 dies right after meeting the coordinator, before JAX registers
  it (the dying client wraps the call; client 0's code is untouched)."""
  import signal
  import jdtensor
  from jdtensor.runtime import rendezvous
  if jdtensor.client_id() == 1:
    real = rendezvous.rendezvous

    def meet_then_die(*args, **kwargs):
      links = real(*args, **kwargs)
      os.kill(os.getpid(), signal.SIGKILL)
      return links
    rendezvous.rendezvous = meet_then_die
  jdtensor.initialize_accelerator_system("CPU")
  result("initialized", True)


def scenario_double_init():
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  jdtensor.initialize_accelerator_system("CPU")


def scenario_shutdown_multi():
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  jdtensor.shutdown_accelerator_system()


def scenario_barrier_wait():
  """Client 0 waits in a barrier that client 1 never reaches (it is killed)."""
  import time
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  mesh = jdtensor.create_distributed_mesh([("x", jdtensor.num_clients())])
  result("ready", os.getpid())
  if jdtensor.client_id() == 0:
    jdtensor.barrier(mesh, "never", timeout_in_ms=120_000)
  time.sleep(60)


def scenario_missing_device():
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  which = os.environ["FAULT_MESH"]
  if which == "create_mesh":
    jdtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:7"])
  else:
    mesh = jdtensor.Mesh.from_string(
        "|x=2|0,1|0|/job:worker/replica:0/task:0/device:CPU:0|"
        "/job:worker/replica:0/task:0/device:CPU:0,"
        "/job:worker/replica:0/task:5/device:CPU:0")
    mesh.jax_mesh


def scenario_corrupt_string():
  import jdtensor
  text = open(os.environ["FAULT_FILE"], encoding="utf-8", errors="replace").read()
  parse = jdtensor.Mesh.from_string if os.environ["FAULT_KIND"] == "mesh" else (
      jdtensor.Layout.from_string)
  parse(text.strip())


if __name__ == "__main__":
  run_scenario(globals())
