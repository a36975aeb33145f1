"""Hang triage: a stall named in seconds under the learnt time-out, whatever
synchronises the loop; a rare long load left alone; learning off is the set
time-out exactly. (At the heartbeat's defaults, with the shapes that must
never be named beside them: test_no_false_kill.py.)

Real clients under `jdtensor launch` (hang_client.py): a step loop of an
idle data load and a meeting (a psum, or a coordination-service barrier).
"""

import io
import os
import re
import sys
import time

import pytest

from jdtensor import launcher
from jdtensor.errors import OWN_FAILURE_EXIT_CODE
from tests.helpers import REPO, TEST_TIMEOUTS, clean_env, launch_clients

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "hang_client.py")


def run(n, devices=1, timeout=120, **env):
  res, out, err, ended = launch_clients([sys.executable, CLIENT], n, devices,
                                        timeout=timeout, **env)
  stamps = re.findall(r"^\[client \d+\] MISBEHAVING ([\d.]+)", out, re.M)
  # From the misbehaviour to the launcher's return, on the wall clock.
  after = (time.time() - (time.monotonic() - ended) - float(stamps[0])
           if stamps else None)
  return res, out, err, after


def stalled_line(res, staller=1):
  assert res.exit_code == OWN_FAILURE_EXIT_CODE, (res.reason, res.returncodes)
  assert res.first_failure == staller, res.reason
  assert re.match(rf"jdtensor launch: client {staller} exited with code 70: "
                  rf"client {staller} stalled: main thread in "
                  r"hang_client\.py:\d+ next_batch", res.reason), res.reason
  return res.reason


@pytest.mark.parametrize("devices", [1, 2])
def test_a_stall_between_service_barriers_is_named(devices):
  # No collective at all: the loop meets only at coordination-service
  # barriers; the staller arrives last at every one before its stall.
  if sys.version_info < (3, 12):
    pytest.skip("Python 3.11 has no sys.monitoring: only device collectives say "
                "a client is past its set-up (docs/guides/heartbeat.md)")
  res, out, err, after = run(2, devices, SCENARIO="stall", SYNC="barrier",
                             MISBEHAVE_AFTER="2", JDTENSOR_HEARTBEAT_PERIOD="0.5",
                             JDTENSOR_STALL_TIMEOUT="5")
  stalled_line(res)
  assert after is not None and 5 <= after < 5 + 2 * 0.5 + 4, (after, err)


@pytest.mark.parametrize("learn", ["true", "false"])
def test_learning_off_is_the_set_time_out_exactly(learn):
  res, out, err, after = run(2, SCENARIO="stall", SYNC="psum", MISBEHAVE_AFTER="7",
                             JDTENSOR_HEARTBEAT_PERIOD="0.5", JDTENSOR_STALL_TIMEOUT="12",
                             JDTENSOR_STALL_FLOOR="3", JDTENSOR_STALL_LEARN=learn)
  reason = stalled_line(res)
  if learn == "true":  # Warm-up: 10 beats, 5 s; then the floor, 3 s.
    assert "learnt from this run" in reason, reason
    assert 3 <= after < 3 + 2 * 0.5 + 4, (after, err)
  else:
    assert "learnt" not in reason, reason
    # Its seconds in its own code count from the first beat that saw it
    # there, which in a fast loop may be a step or more before the stall.
    assert re.search(r"stalled: main thread in \S+ next_batch <- \S+ <module> for \d+ s, "
                     r"idle \(\d+% of a core, \d+ B/s read or written\), while client 0 "
                     r"waits in a collective; ", reason), reason
    assert 12 <= after < 12 + 2 * 0.5 + 4, (after, err)


def test_a_rare_long_load_below_the_floor_is_left_alone():
  # Steps of 0.2 s; once, after the warm-up, client 1 loads for 4 s (20
  # steps' worth) while the other waits: below the floor (6 s), never a stall.
  res, out, err, after = run(2, SCENARIO="load", SYNC="psum", MISBEHAVE_AFTER="7",
                             LOAD_SECONDS="4", STEPS="60",
                             JDTENSOR_HEARTBEAT_PERIOD="0.5", JDTENSOR_STALL_FLOOR="6")
  assert after is not None, out
  assert res.exit_code == 0 and res.returncodes == [0, 0], (res.reason, err)
  assert out.count("DONE") == 2 and "stalled" not in err


# -- every client's stack under the verdict ------------------------------------

FAILURE_CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "failure_client.py")
# scenario -> (extra env, what client 1's line says, what clients 0 and 2's say)
WAITING = r"failure_client\.py:\d+ <module> \((collective|in JAX)\)"
LEFT = r"its script has ended \(in jdtensor's exit handling\) \(at exit\)"
STACK_CASES = {
    "stall": ({"JDTENSOR_STALL_TIMEOUT": "3"},
              r"failure_client\.py:\d+ next_batch <- \S+ <module> \(own code\)",
              r"failure_client\.py:\d+ <module> \(collective\)"),
    "sigstop": ({"JDTENSOR_HEARTBEAT_PERIOD": "1", "JDTENSOR_STUCK_TIMEOUT": "3",
                 "STOP_SECONDS": "10"},
                r"did not answer \(stopped, or its interpreter held by C code, or no "
                r"heartbeat\)",
                r"failure_client\.py:\d+ <module> \(collective\)"),
    "exit0": ({}, LEFT, WAITING),
    # The survivors' collective may fail first (the peer is gone): they may
    # be leaving already.
    "exception": ({}, r"exited with code 1 \(no stack: it ended first\)",
                  f"{WAITING}|{LEFT}"),
    "sigkill": ({}, r"was killed by SIGKILL \(no stack: it ended first\)",
                f"{WAITING}|{LEFT}"),
}


def stack_block(err):
  """{client: its line} from the launcher's block under the verdict."""
  lines = err.splitlines()
  start = lines.index("jdtensor launch: main threads when the verdict was named:")
  out = {}
  for line in lines[start + 1:]:
    m = re.fullmatch(r"  clients? ([\d, -]+): (.*)", line)
    if m is None:
      break
    for part in m.group(1).split(", "):
      first, _, last = part.partition("-")
      for c in range(int(first), int(last or first) + 1):
        out[c] = m.group(2)
  return out


@pytest.mark.parametrize("scenario", sorted(STACK_CASES))
def test_every_clients_stack_is_under_the_verdict(scenario, tmp_path):
  env, culprit_says, others_say = STACK_CASES[scenario]
  out, err = io.StringIO(), io.StringIO()
  res = launcher.launch(launcher.LaunchSpec(
      command=(sys.executable, FAILURE_CLIENT), num_clients=3, devices_per_client=1,
      timeout=90, grace=3, log_dir=str(tmp_path)), out=out, err=err,
      env=clean_env(**{**TEST_TIMEOUTS, "JDTENSOR_HEARTBEAT_PERIOD": "0.5",
                       "SCENARIO": scenario, "CULPRIT": "1", **env}))
  err = err.getvalue()
  assert res.first_failure == 1, (res.reason, err)
  # Right under the summary line.
  summary_at = err.splitlines().index(res.reason)
  assert err.splitlines()[summary_at + 1].startswith("jdtensor launch: main threads"), err
  block = stack_block(err)
  assert sorted(block) == [0, 1, 2], err
  assert re.fullmatch(culprit_says, block[1]), (block, err)
  for c in (0, 2):
    assert re.fullmatch(others_say, block[c]), (block, err)
  # Every thread's stack, whole, in each answering client's log.
  for c in (0, 2):
    log = (tmp_path / f"client-{c}.log").read_text()
    assert "==== jdtensor launch: every thread's stack when the verdict was named" in log
    assert "Thread 'MainThread' (most recent call last):" in log
    assert "Thread 'jdtensor-heartbeat' (most recent call last):" in log
