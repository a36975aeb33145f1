"""What every scenario client of the tests shares.

One convention: a client script's scenario is named SCENARIO, and the
client that misbehaves in it CULPRIT. SCENARIO comes as the first argument
(`python <client>.py SCENARIO`, for clients started one by one) or as the
variable (``SCENARIO=stall``, where a launcher or an engine starts every
client with the same command); CULPRIT is always the variable.

A client runs under `jdtensor launch` (or the tests' own process starter)
with the DTENSOR_* variables set, and prints ``RESULT key=value`` lines that
the tests assert on. Any exception exits non-zero with ``ERROR <type>:
<message>``.
"""

import json
import os
import sys
import traceback


def result(key, value):
  # One write() (atomic on a pipe), starting a fresh line: gloo's C++ threads
  # print fragments of their connection notice to the same stdout.
  sys.stdout.flush()
  os.write(1, f"\nRESULT {key}={json.dumps(value)}\n".encode())


def scenario_name():
  """The scenario: the first argument, else the SCENARIO variable."""
  return sys.argv[1] if len(sys.argv) > 1 else os.environ["SCENARIO"]


def run_scenario(scenarios):
  """Runs ``scenario_<SCENARIO>`` from `scenarios` (a module's globals)."""
  try:
    scenarios[f"scenario_{scenario_name()}"]()
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    sys.stdout.flush()
    os.write(1, f"\nERROR {type(e).__name__}: {e}\n".encode())
    sys.exit(1)


def psum_over_every_device():
  """(psum, x): a jitted psum over a `jax.make_mesh` mesh of every device
  (processes x local devices), and an array of ones sharded over it;
  ``psum(x)`` holds processes x local devices."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  n, local = jax.process_count(), jax.local_device_count()
  mesh = jax.make_mesh((n, local), ("b", "m"))
  psum = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, ("b", "m")), mesh=mesh,
                               in_specs=P("b", "m"), out_specs=P()))
  x = jax.make_array_from_callback((n, local), NamedSharding(mesh, P("b", "m")),
                                   lambda idx: np.ones((1, 1), np.float32))
  return psum, x
