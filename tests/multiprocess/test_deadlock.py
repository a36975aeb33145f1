"""A deadlock where every client waits ends the run; a long computation on
every client does not.

Both look alike from a collective's outside: every client inside JAX, for
minutes. They differ in the process's CPU: a deadlocked client waits on a
socket or the coordination service and uses none; a computing one keeps
XLA's threads busy (the heartbeat's rows carry each client's CPU share). 3
clients x 1 CPU device under `jdtensor launch` (clients/deadlock_client.py),
the deadlock time-out shortened from its 600 s default.
"""

import os
import re
import sys
import time

import pytest

from jdtensor.errors import PEER_FAILURE_EXIT_CODE
from tests.helpers import REPO, launch_clients

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "deadlock_client.py")
DEADLOCK = 5.0
PERIOD = 0.5
SETTINGS = {"JDTENSOR_HEARTBEAT_PERIOD": str(PERIOD),
            "JDTENSOR_DEADLOCK_TIMEOUT": str(DEADLOCK)}


def test_a_deadlock_ends_the_run_with_every_clients_stack():
  res, out, err, ended = launch_clients([sys.executable, CLIENT], 3, 1, timeout=90,
                                        SCENARIO="deadlock", **SETTINGS)
  stamps = [float(t) for t in re.findall(r"^\[client \d\] WAITING ([\d.]+)$", out, re.M)]
  assert len(stamps) == 3, out + err
  after = ended - (time.monotonic() - (time.time() - max(stamps)))
  assert DEADLOCK <= after < DEADLOCK + 2 * PERIOD + 6, (after, err)
  said = (r"every client has waited in a collective for \d+ s with its process idle: "
          r"a deadlock \(clients that issued different collectives, or a collective one "
          r"of them never reaches\); the run ends after JDTENSOR_DEADLOCK_TIMEOUT \(5 s; "
          r"0 only warns\)")
  assert res.exit_code == PEER_FAILURE_EXIT_CODE, (res.reason, err)
  assert res.returncodes == [PEER_FAILURE_EXIT_CODE] * 3, (res.returncodes, err)
  assert re.match(rf"jdtensor launch: {said}; stopped clients", res.reason), \
      res.reason
  for c in range(3):  # Every client says it.
    assert re.search(rf"^\[client {c}\] heartbeat: {said}; stopping this client$", err,
                     re.M), (c, err)
  # Where each client waits, under the verdict, in the launcher's summary.
  stacks = err[err.index("main threads when the verdict was named:"):]
  assert re.search(r"^  client 0: deadlock_client\.py:\d+ <module> \(collective\)$",
                   stacks, re.M), stacks
  assert re.search(r"^  clients 1, 2: deadlock_client\.py:\d+ <module> \(collective\)$",
                   stacks, re.M), stacks


def test_a_long_computation_on_every_client_is_no_deadlock():
  # One XLA call on every client, longer than the deadlock time-out (3 s here).
  res, out, err, _ = launch_clients([sys.executable, CLIENT], 3, 1, timeout=120,
                                    SCENARIO="compute", BUSY_SECONDS="5",
                                    **{**SETTINGS, "JDTENSOR_DEADLOCK_TIMEOUT": "3"})
  assert res.exit_code == 0 and res.returncodes == [0, 0, 0], (res.reason, err)
  assert out.count("DONE") == 3, out
  assert "deadlock" not in err and "heartbeat: " not in err, err
