"""Multi-client tests whose client 2 leaves, each a way a client can leave.

Not collected by the suite itself (the name does not start with ``test_``):
`test_testing.py` runs this file in a pytest subprocess and checks that each
failure, and pytest's one line for it, begins with client 2. Every test
fails on purpose. Clients 0 and 1 wait for client 2 in a collective.
"""

import os
import signal
import time

import pytest

from jdtensor.testing import multi_client

WAYS = ["exception", "exit", "sigkill", "stall"]
# The heartbeat names a client idle in its own code while the others wait in
# a collective after 4 s (not the learnt time-out: at least 60 s).
STALL = {"JDTENSOR_STALL_TIMEOUT": "4", "JDTENSOR_STALL_LEARN": "false"}


def leave(way):
  """Client 2 leaves the test, `way`."""
  if way == "exception":
    raise ValueError("client 2 leaves on purpose")
  if way == "exit":
    os._exit(3)  # pylint: disable=protected-access
  if way == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
  if way == "stall":
    time.sleep(600)


def body(way):
  import jdtensor
  from jax.experimental import multihost_utils
  multihost_utils.sync_global_devices("every client is here")
  if jdtensor.client_id() == 2:
    leave(way)
  multihost_utils.sync_global_devices("client 2 never comes")
  time.sleep(600)


@pytest.mark.parametrize("way", WAYS)
@multi_client(num_clients=3, timeout=90, env=STALL)
def test_warm(way):
  body(way)


@pytest.mark.parametrize("way", WAYS)
@multi_client(num_clients=3, timeout=90, env=STALL, fresh=True)
def test_fresh(way):
  body(way)
