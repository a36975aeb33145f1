"""Every client ends cleanly however its script ends, at any moment of a beat.

Python 3.12 starts no thread once the interpreter's finalisation has begun,
which is where a client's heartbeat still beats towards the run's agreed
end: a helper thread started there raised in the heartbeat (its "own code"),
every client printed the traceback, and JAX's coordination agent aborted the
clients left waiting for the one that left first (`jdtensor._threads`). CI
runs this file on Python 3.12 too.
"""

import os
import re
import sys

import pytest

from tests.helpers import REPO, launch_clients, parse_results

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "clean_end_client.py")
PERIOD = 2.0  # The default: the moments below are a third and two thirds of it.
# What a clean end never shows: a traceback, a verdict, JAX's abort.
NEVER = ("Traceback", "Error", "heartbeat:", "Terminating process", "stalled", "failed")
GLOG_FATAL = re.compile(r"^\[client \d+\] F\d{4} ", re.M)


@pytest.mark.parametrize("end_after", [0.0, PERIOD / 3, 2 * PERIOD / 3],
                         ids=["at_once", "a_third_into_a_beat", "two_thirds_into_a_beat"])
@pytest.mark.parametrize("how", ["return", "barrier", "sys_exit", "daemon"])
def test_the_simplest_program_ends_cleanly(how, end_after):
  n = 4
  res, out, err, _ = launch_clients(
      [sys.executable, CLIENT, how], n, timeout=90,
      END_AFTER=str(end_after), JDTENSOR_HEARTBEAT_PERIOD=str(PERIOD))
  text = out + err
  assert res.exit_code == 0 and res.returncodes == [0] * n, text
  assert {k: v["sum"] for k, v in parse_results(out).items()} == {
      k: 2.0 * n for k in range(n)}, text
  seen = [word for word in NEVER if word in text]
  assert not seen and not GLOG_FATAL.search(text), f"{seen} in:\n{text}"
