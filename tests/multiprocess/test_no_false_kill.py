"""No false kill at the heartbeat's defaults, and every hang still named:
the shapes real training programs have.

Each shape is a real `jdtensor launch -n 3` of hang_client.py, as a user
runs it, at the heartbeat's defaults (period 2 s, floor 60 s,
JDTENSOR_STALL_TIMEOUT 300 s). The shapes run at once (one module-scoped
start: they are idle loops, so they share 2 cores without changing what
they show), then each case checks its own:

* a slow set-up after a barrier (75 s idle before the first step, longer
  than the floor): the run has shown no rhythm, the ceiling judges it: not
  named, exit 0;
* a one-off upload to a server that trickles 64 KiB/s, and a file written
  in small pieces, each 75 s after a steady loop: bytes move, so the client
  is not idle: not named, exit 0;
* a hang (a sleep, a lock never released) after a steady loop of 0.5 s
  steps with a 0.4 s data load each: named within 90 s;
* the same hang in a loop synchronised only by coordination-service
  barriers: named within 90 s on Python 3.12+ (3.11 has no
  ``sys.monitoring`` to see a client come out of a service wait:
  docs/guides/limits.md).
"""

import os
import re
import subprocess
import sys
import time

import pytest

from jdtensor.errors import OWN_FAILURE_EXIT_CODE
from jdtensor.launcher.processes import stop_process_groups
from tests.helpers import REPO, TrickleServer, clean_env

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "hang_client.py")
DEFAULTS = {"JDTENSOR_HEARTBEAT_PERIOD": "2", "JDTENSOR_STUCK_TIMEOUT": "60",
            "JDTENSOR_COORDINATION_TIMEOUT": "100"}
PAUSE = "75"  # Longer than the floor (60 s): an idle pause this long is named.
NAMED_WITHIN = 90.0
FLOOR = 60.0
# The steady loop: 0.5 s steps, 0.4 s of them a data load; the misbehaviour
# begins 30 s into it (the rhythm is shown in about 20 s).
STEADY = {"STEP_SECONDS": "0.4", "MISBEHAVE_AFTER": "30"}
SHAPES = {
    "set-up after a barrier": ({"SCENARIO": "setup", "LOAD_SECONDS": PAUSE,
                                "STEPS": "10"}, False),
    "slow upload": ({"SCENARIO": "upload", "LOAD_SECONDS": PAUSE, "STEPS": "90",
                     **STEADY}, False),
    "slow file write": ({"SCENARIO": "write", "LOAD_SECONDS": PAUSE, "STEPS": "90",
                         **STEADY}, False),
    "hang in a sleep": ({"SCENARIO": "stall", **STEADY}, True),
    "hang on a lock": ({"SCENARIO": "lock", **STEADY}, True),
    "hang between service barriers": ({"SCENARIO": "stall", "SYNC": "barrier",
                                       **STEADY}, True),
}
NEEDS_MONITORING = {"hang between service barriers"}


def _launch(env, log):
  return subprocess.Popen(
      [sys.executable, "-m", "jdtensor", "launch", "-n", "3", "--timeout", "400", "--",
       sys.executable, CLIENT], env=env, stdout=log, stderr=subprocess.STDOUT,
      cwd=REPO, start_new_session=True)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
  """{shape: (exit code, output, seconds from the misbehaviour to the end)}."""
  wanted = [s for s in SHAPES if sys.version_info >= (3, 12) or s not in NEEDS_MONITORING]
  server = TrickleServer()
  folder = tmp_path_factory.mktemp("shapes")
  runs = {}
  try:
    for shape in wanted:
      env = clean_env(**DEFAULTS, **SHAPES[shape][0], UPLOAD_PORT=str(server.port))
      log = open(folder / f"{len(runs)}.log", "w")
      runs[shape] = (_launch(env, log), log)
    ended = {}
    deadline = time.monotonic() + 420
    while len(ended) < len(runs) and time.monotonic() < deadline:
      for shape, (proc, _) in runs.items():
        if shape not in ended and proc.poll() is not None:
          ended[shape] = time.time()
      time.sleep(0.2)
  finally:
    stop_process_groups([proc for proc, _ in runs.values()], grace=3)
    server.close()
  out = {}
  for shape, (proc, log) in runs.items():
    log.close()
    text = (folder / os.path.basename(log.name)).read_text()
    stamps = re.findall(r"^\[client \d+\] MISBEHAVING ([\d.]+)", text, re.M)
    after = ended[shape] - float(stamps[0]) if stamps and shape in ended else None
    out[shape] = (proc.returncode, text, after)
  out["uploaded"] = server.received
  return out


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_no_false_kill_and_every_hang_named_at_the_defaults(shape, shapes):
  if shape in NEEDS_MONITORING and sys.version_info < (3, 12):
    pytest.skip("Python 3.11 has no sys.monitoring: a loop that meets only at "
                "coordination-service barriers never counts as past its set-up "
                "(docs/guides/limits.md)")
  code, text, after = shapes[shape]
  hang = SHAPES[shape][1]
  assert after is not None, text[-3000:]
  if not hang:
    assert code == 0, text[-3000:]
    assert "stalled" not in text, text[-3000:]
    assert text.count("DONE") == 3, text[-3000:]
    if shape == "slow upload":
      # The server took the bytes at its pace: the client moved them slowly.
      assert 2 * 2**20 < shapes["uploaded"] < 8 * 2**20, shapes["uploaded"]
    return
  assert code == OWN_FAILURE_EXIT_CODE, text[-3000:]
  summary = re.search(r"^jdtensor launch: client 1 exited with code 70: client 1 "
                      r"stalled: main thread in hang_client\.py:\d+ next_batch .* for "
                      r"\d+ s, idle \(\d+% of a core, [\d.]+ [KM]?i?B/s read or "
                      r"written\), while clients 0, 2 wait in a collective \(stall "
                      r"time-out 60 s, learnt from this run: 5 x its longest idle "
                      r"pause, [\d.]+ s, at least 60 s; ", text, re.M)
  assert summary, text[-3000:]
  # At the floor (60 s), the verdict at a beat (2 s periods) and the clients'
  # exit, with 18 processes on 2 cores.
  assert FLOOR <= after < FLOOR + 2 * 2 + 8, (after, text[-3000:])
  assert after < NAMED_WITHIN


def test_the_shapes_leave_nothing_behind(shapes):
  # Every launcher ended by itself, and took its clients with it.
  del shapes
  leftover = subprocess.run(["pgrep", "-f", CLIENT], capture_output=True, text=True,
                            timeout=10)
  assert leftover.stdout.strip() == "", leftover.stdout
