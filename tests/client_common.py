"""What every scenario client of the tests shares: `python <client>.py SCENARIO`.

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


def run_scenario(scenarios):
  """Runs ``scenario_<argv[1]>`` from `scenarios` (a module's globals)."""
  try:
    scenarios[f"scenario_{sys.argv[1]}"]()
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    sys.stdout.flush()
    os.write(1, f"\nERROR {type(e).__name__}: {e}\n".encode())
    sys.exit(1)
