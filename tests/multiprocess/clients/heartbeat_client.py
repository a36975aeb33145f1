"""Heartbeat scenarios for test_heartbeat.py, the fault suite and the multi-host test: `python heartbeat_client.py SCENARIO`
(see tests/client_common.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

from tests.client_common import result, run_scenario  # noqa: E402


def _user_psum_setup():
  """Jitted psums over (a) every device, (b) a host axis, (c) one device per
  client, on a (client, device) mesh: the groups a user program can form."""
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P

  import jdtensor
  from jdtensor import Layout
  n, local = jdtensor.num_clients(), jdtensor.num_local_devices("CPU")
  mesh = jdtensor.create_distributed_mesh([("host", n), ("dev", local)])
  jm = mesh.jax_mesh

  def make(width):
    return jax.make_array_from_callback(
        (n, local * width), Layout(["host", "dev"], mesh).to_jax_sharding(),
        lambda idx: np.arange(n * local * width, dtype=np.float32).reshape(
            n, local * width)[idx])
  fns = {axes: jax.jit(jax.shard_map(lambda b, a=axes: jax.lax.psum(b, a), mesh=jm,
                                     in_specs=P("host", "dev"),
                                     out_specs=P("host", "dev")))
         for axes in (("host", "dev"), "host", "dev")}
  return n, local, make, fns


def scenario_heartbeat_victim():
  """Everyone works; the test SIGKILLs one client; the others must notice."""
  import time
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  n, local, make, fns = _user_psum_setup()
  x = make(1)
  fns["dev"](x).block_until_ready()  # Steady state: programs built and run.
  from jdtensor import heartbeat
  if heartbeat.current() is not None:
    heartbeat.current().ready.wait(60)  # ...and the heartbeat's first exchange.
  result("ready", os.getpid())
  deadline = time.monotonic() + 60
  try:
    while time.monotonic() < deadline:
      fns["dev"](x).block_until_ready()  # Local work: no peer needed.
      jdtensor.create_mesh([("x", 1)], devices=["CPU:0"])  # A jdtensor call.
      time.sleep(0.01)
  except jdtensor.PeerFailureError as e:
    result("peer_failure", [str(e), list(e.client_ids)])
    os._exit(0)  # Skip JAX's shutdown barrier with a dead peer.
  result("survived", True)


def scenario_heartbeat_token():
  """Client 1's token goes out of sync (what a restarted client would send)."""
  import time
  import jdtensor
  from jdtensor import heartbeat
  jdtensor.initialize_accelerator_system("CPU")
  hb = heartbeat.current()
  hb.ready.wait(30)
  time.sleep(0.5)
  if jdtensor.client_id() == 1:
    hb.token ^= 0x5A5A
  deadline = time.monotonic() + 20
  while time.monotonic() < deadline and hb.failure is None:
    time.sleep(0.05)
  result("failure", [str(hb.failure), list(hb.failure.client_ids)
                     if hb.failure else None])
  os._exit(0)


if __name__ == "__main__":
  run_scenario(globals())
