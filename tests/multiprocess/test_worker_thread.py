"""The heartbeat watches the thread that runs the program, not the main one.

Ray Train runs the training function on a worker thread while the main
thread serves Ray's loop; the heartbeat used to sample the main thread only,
so a stalled training function was never named and the stacks pointed into
the host's loop. 3 clients x 1 CPU device under `jdtensor launch`, the
whole client body on a thread named ``TrainingThread``
(clients/worker_thread_client.py).
"""

import json
import os
import re
import sys
import time

import pytest

from jdtensor import _trace
from jdtensor.errors import OWN_FAILURE_EXIT_CODE
from tests.helpers import REPO, launch_clients

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "worker_thread_client.py")
STALL = 4.0
FAST = {"JDTENSOR_HEARTBEAT_PERIOD": "0.5", "JDTENSOR_STALL_TIMEOUT": str(STALL),
        "JDTENSOR_STALL_LEARN": "false"}


def run(scenario, **env):
  res, out, err, ended = launch_clients([sys.executable, CLIENT], 3, 1, timeout=90,
                                        SCENARIO=scenario, CULPRIT="1", **{**FAST, **env})
  return res, out, err, ended


@pytest.mark.parametrize("scenario", ["stall", "named"])
def test_a_stall_on_the_worker_thread_is_named_with_its_stack(scenario):
  res, out, err, ended = run(scenario)
  stamps = re.findall(r"^\[client 1\] MISBEHAVING ([\d.]+)$", out, re.M)
  assert stamps, out + err
  after = ended - (time.monotonic() - (time.time() - float(stamps[0])))
  assert after < STALL + 2 * 0.5 + 5, err
  where = (r"thread 'TrainingThread' in worker_thread_client\.py:\d+ next_batch <- "
           r"worker_thread_client\.py:\d+ body <- worker_thread_client\.py:\d+ run_body")
  said = (rf"client 1 stalled: {where} for \d+ s, idle \(\d+% of a core, [\d.]+ "
          r"[KM]?i?B/s read or written\), while clients 0, 2 wait in a collective")
  assert res.returncodes[1] == OWN_FAILURE_EXIT_CODE, (res.returncodes, err)
  assert re.match(rf"jdtensor launch: client 1 exited with code 70: {said}; ",
                  res.reason), res.reason
  # The stacks under the verdict: each client's worker thread first, named.
  for c in (0, 1, 2):
    assert re.search(rf"^\[client {c}\] heartbeat: {said}", err, re.M), (c, err)


def test_a_set_up_on_a_helper_thread_hands_the_watch_back_to_the_main_thread():
  """A thread that only initialised and returned is not the program's end:
  the main thread runs the steps, and its stall is named."""
  res, out, err, _ = run("init_thread")
  where = (r"main thread in worker_thread_client\.py:\d+ next_batch <- "
           r"worker_thread_client\.py:\d+ body <- worker_thread_client\.py:\d+ <module>")
  said = (rf"client 1 stalled: {where} for \d+ s, idle \(\d+% of a core, [\d.]+ "
          r"[KM]?i?B/s read or written\), while clients 0, 2 wait in a collective")
  assert res.returncodes[1] == OWN_FAILURE_EXIT_CODE, (res.returncodes, err)
  assert re.match(rf"jdtensor launch: client 1 exited with code 70: {said}; ",
                  res.reason), res.reason


@pytest.mark.parametrize("scenario", ["clean", "linger"])
def test_a_program_on_a_worker_thread_ends_cleanly_and_is_watched(scenario, tmp_path):
  res, out, err, _ = run(scenario, JDTENSOR_TRACE_DIR=str(tmp_path))
  assert res.exit_code == 0 and res.returncodes == [0, 0, 0], (res.reason, err)
  assert out.count("DONE") == 3, out
  assert "heartbeat: client" not in err and "Traceback" not in err, err
  statuses = [json.loads(m) for m in re.findall(r"^\[client \d\] STATUS (.*)$", out, re.M)]
  assert len(statuses) == 3, out
  for status in statuses:  # status and `where` read the worker, not the host's loop.
    assert status["thread"] == "thread 'TrainingThread'", status
    assert "worker_thread_client.py" in status["where"], status
    assert "<module>" not in status["where"], status
  # Each client's track is of the worker thread, by its name, with its phases.
  parts = sorted(tmp_path.glob("client-*.json"))
  assert len(parts) == 3, parts
  for part in parts:
    events = list(_trace.read_events(str(part)))
    assert [e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"] == ["thread 'TrainingThread'"]
    assert any(e["ph"] == "B" for e in events), part
