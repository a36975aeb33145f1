"""Every way a client can stop taking part ends the run quickly, named the
same everywhere; a slow but healthy client is left alone.

3 clients x 2 CPU devices under `jdtensor launch`, a psum loop over a
`jax.make_mesh` mesh; client 1 misbehaves at step 3 (failure_client.py).
Each test checks the exit codes, the time from the misbehaviour to the end,
the launcher's summary line and what every client says.
"""

import os
import re
import sys

import pytest

from jdtensor.heartbeat.leaving import HOST_EXIT_WAIT, ROLL_CALL_GRACE
from tests.helpers import REPO, launch_clients
from jdtensor.errors import OWN_FAILURE_EXIT_CODE, PEER_FAILURE_EXIT_CODE

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "failure_client.py")
FAST = {"JDTENSOR_HEARTBEAT_PERIOD": "0.5"}


def run(misbehave, timeout=90, client=1, **env):
  res, out, err, ended = launch_clients([sys.executable, CLIENT], 3, 2,
                                        timeout=timeout, SCENARIO=misbehave,
                                        CULPRIT=str(client),
                                        **{**FAST, **env})
  first = 0 if client == "all" else client
  stamps = re.findall(rf"^\[client {first}\] MISBEHAVING ([\d.]+)$", out, re.M)
  return res, out, err, ended, stamps


def seconds_after_misbehaving(stamps, launcher_returned):
  """From client 1's misbehaviour to the launcher's return."""
  import time
  assert stamps, "client 1 never misbehaved"
  return launcher_returned - (time.monotonic() - (time.time() - float(stamps[0])))


def survivors_ended_after(res, stamps, survivors=(0, 2)):
  """Seconds from client 1's misbehaviour to each survivor's end."""
  return {c: res.ended_at[c] - float(stamps[0]) for c in survivors}


def lines(err, client):
  return [line.split("] ", 1)[1] for line in err.splitlines()
          if line.startswith(f"[client {client}] ")]


def test_an_exception_stops_everyone_within_5s_naming_it():
  res, out, err, ended, stamps = run("exception")
  assert seconds_after_misbehaving(stamps, ended) < 5, err
  assert res.exit_code == 1 and res.first_failure == 1, res.reason
  # The root cause with its reason (what client 1 told the others).
  assert re.match(r"jdtensor launch: client 1 exited with code 1: ZeroDivisionError: "
                  r"division by zero \(failure_client\.py:\d+ in misbehave\); ",
                  res.reason), res.reason
  assert res.returncodes[1] == 1
  assert "ZeroDivisionError: division by zero" in "\n".join(lines(err, 1))  # Traceback kept.
  why = re.escape("client 1 failed: ZeroDivisionError: division by zero "
                  "(failure_client.py:") + r"\d+" + re.escape(" in misbehave)")
  for c in (0, 2):
    assert res.returncodes[c] in (PEER_FAILURE_EXIT_CODE, -15), res.returncodes
    assert any(re.fullmatch(rf"heartbeat: {why}( \(reported by client \d\))?; "
                            "stopping this client", line) for line in lines(err, c)), err
  assert "Shutdown barrier" not in err and "F1" not in err  # No C++ abort.


@pytest.mark.parametrize("policy", ["terminate", "raise"])
def test_a_sigkill_mid_collective_is_the_root_cause_not_the_peers_gloo_error(policy):
  """Client 1 dies while the others wait for it in a psum: their psum raises
  gloo's "Connection closed by peer" at once, racing the heartbeat. The root
  cause is client 1 everywhere; the others leave as its consequence (75)."""
  res, out, err, ended, stamps = run("sigkill", JDTENSOR_HEARTBEAT_POLICY=policy)
  assert seconds_after_misbehaving(stamps, ended) < 5, err
  assert res.first_failure == 1 and res.exit_code == 137, res.reason
  assert res.reason.startswith("jdtensor launch: client 1 was killed by SIGKILL; "), (
      res.reason)
  hit = 0
  for c in (0, 2):
    said = "\n".join(lines(err, c))
    assert re.search(r"heartbeat: client 1 (missed beat \d+|is gone)", said), err
    assert "the other clients have been told" not in said, err
    if "Gloo all-reduce failed" in said:  # It left as client 1's consequence.
      hit += 1
      assert res.returncodes[c] in (PEER_FAILURE_EXIT_CODE, -15), (res.returncodes, err)
    elif policy == "terminate":
      assert res.returncodes[c] in (PEER_FAILURE_EXIT_CODE, -15), (res.returncodes, err)
    # Under "raise", a client still blocked in the psum (gloo reported nothing
    # to it) is stopped by the launcher: docs/guides/limits.md.
  if policy == "raise":
    assert hit, err  # The race this test is about did happen.


def test_client_0_failing_lets_the_others_leave_with_their_own_reason():
  """Client 0 hosts the coordination service: it leaves last, so the others
  end with the heartbeat's verdict, not a C++ abort."""
  res, out, err, ended, stamps = run("exception", client=0)
  assert seconds_after_misbehaving(stamps, ended) < 5, err
  assert res.exit_code == 1 and res.first_failure == 0, res.reason
  assert res.returncodes[0] == 1
  assert "F1" not in err and "Check failure" not in err, err  # No C++ abort.
  for c in (1, 2):
    assert res.returncodes[c] == PEER_FAILURE_EXIT_CODE, res.returncodes
    assert any(line.startswith("heartbeat: client 0 failed: ZeroDivisionError")
               for line in lines(err, c)), err


def test_client_0_failing_without_a_heartbeat_waits_for_the_others():
  """Without a heartbeat nobody stops the others; when they fail too, a
  second later, each still ends with its own error, not a C++ abort."""
  res, out, err, ended, stamps = run("exception", client="all", LATE_SECONDS="1",
                                     DTENSOR_ENABLE_HEARTBEAT="false")
  assert res.returncodes == [1, 1, 1], err
  assert res.first_failure == 0, res.reason
  assert re.match(r"jdtensor launch: client 0 exited with code 1: ZeroDivisionError: "
                  r"division by zero \(failure_client\.py:\d+ in misbehave\); "
                  r"stopped clients none", res.reason), res.reason
  assert "F1" not in err and "Check failure" not in err, err  # No C++ abort.
  for c in (0, 1, 2):
    assert any(line.startswith(f"jdtensor: client {c} failed: ZeroDivisionError")
               for line in lines(err, c)), err
  assert seconds_after_misbehaving(stamps, ended) < HOST_EXIT_WAIT, err


def test_client_0_failing_without_a_heartbeat_still_ends_the_run():
  """When the others do not leave, client 0's wait is bounded; then JAX's
  coordination service ends them."""
  res, out, err, ended, stamps = run("exception", client=0,
                                     DTENSOR_ENABLE_HEARTBEAT="false")
  assert seconds_after_misbehaving(stamps, ended) < HOST_EXIT_WAIT + 5, err
  assert res.exit_code == 1 and res.first_failure == 0, res.reason


@pytest.mark.parametrize("code", [3, 0])
def test_an_early_exit_stops_everyone_within_5s_naming_it(code):
  res, out, err, ended, stamps = run(f"exit{code}")
  assert seconds_after_misbehaving(stamps, ended) < 5, err
  assert res.first_failure == 1, res.reason
  assert res.returncodes[1] == code
  if code:
    assert res.reason.startswith("jdtensor launch: client 1 exited with code 3; ")
    assert res.exit_code == 3
    said = "client 1 exited (code 3) while the others were still running"
  else:
    said = ("client 1 exited (code 0) while the others were still running "
            "(clients 0, 2 wait in a collective)")
    assert res.reason.startswith(f"jdtensor launch: {said} (named by clients "), res.reason
    assert res.exit_code == 1  # The run failed, though client 1 said 0.
  for c in (0, 2):
    assert res.returncodes[c] in (PEER_FAILURE_EXIT_CODE, -15), res.returncodes
    assert any(line.startswith(f"heartbeat: {said}") for line in lines(err, c)), err
  assert "Shutdown barrier" not in err and "F1" not in err


def test_a_stall_is_named_on_every_client_with_its_stack():
  res, out, err, ended, stamps = run("stall", JDTENSOR_STALL_TIMEOUT="3")
  assert seconds_after_misbehaving(stamps, ended) < 3 + 2 * 0.5 + 4, err
  where = r"failure_client\.py:\d+ next_batch <- failure_client\.py:\d+ <module>"
  said = (rf"client 1 stalled: main thread in {where} for \d+ s, idle \(\d+% of a "
          r"core, [\d.]+ [KM]?i?B/s read or written\), while clients 0, 2 wait in a "
          r"collective")
  assert res.returncodes[1] == OWN_FAILURE_EXIT_CODE, res.returncodes
  assert res.exit_code == OWN_FAILURE_EXIT_CODE
  assert re.match(rf"jdtensor launch: client 1 exited with code 70: {said}; ",
                  res.reason), res.reason
  for c in (0, 1, 2):  # The same line everywhere, the staller included.
    assert any(re.fullmatch(rf"heartbeat: {said}( \(reported by client \d\))?; "
                            "stopping this client", line)
               for line in lines(err, c)), (c, err)


def test_a_20s_gil_hold_is_left_alone():
  # JAX's own heartbeat runs in C++ through a GIL hold; jdtensor's stuck
  # time-out (60 s, below the coordination time-out) leaves it alone.
  res, out, err, ended, stamps = run("gil", timeout=120, GIL_SECONDS="20",
                                     JDTENSOR_COORDINATION_TIMEOUT="100",
                                     JDTENSOR_STUCK_TIMEOUT="60")
  assert stamps and res.exit_code == 0, (res.reason, err)
  assert res.returncodes == [0, 0, 0]
  assert out.count("DONE") == 3
  assert "heartbeat: client" not in err  # Nobody was named.
  # The holder notices it did not run, and says it is within the time-out.
  assert re.search(r"heartbeat: this client \(1\) did not run for 1\d\.\d s \(within "
                   r"the stuck time-out, 60 s\)", err), err


def test_a_stopped_client_is_the_root_cause_everywhere():
  res, out, err, ended, stamps = run("sigstop", timeout=120,
                                     JDTENSOR_HEARTBEAT_PERIOD="1",
                                     JDTENSOR_STUCK_TIMEOUT="3", STOP_SECONDS="10")
  assert res.first_failure == 1, res.reason
  ended = survivors_ended_after(res, stamps)  # A beat, the stuck time-out
  assert all(t < 1 + 3 + 1 + ROLL_CALL_GRACE + 1.5  # (checked each
             for t in ended.values()), ended           # second), the roll call.
  # Named by the others while it is stopped; or, if it wakes before the
  # launcher's SIGKILL, by itself.
  assert (re.match(r"jdtensor launch: client 1 missed beat \d+ \(last seen [\d.]+ "
                   r"s ago\) \(named by clients 0, 2\); ", res.reason) or
          re.match(r"jdtensor launch: client 1 exited with code 70: client 1 did "
                   r"not run for [\d.]+ s \(stopped, swapped out, or its GIL held "
                   r"by C code\), longer than the stuck time-out \(3 s\); ",
                   res.reason)), res.reason
  for c in (0, 2):
    said = [line for line in lines(err, c) if line.startswith("heartbeat: ")]
    assert said and all("client 1 " in line for line in said), said
  # No message anywhere blames another client.
  assert not re.search(r"heartbeat: clients? [02]\b", err), err


def test_a_period_mismatch_is_a_startup_error_naming_both_values():
  command = ["sh", "-c", 'if [ "$DTENSOR_CLIENT_ID" = 1 ]; then '
             'export JDTENSOR_HEARTBEAT_PERIOD=4; fi; exec "$0" "$1"',
             sys.executable, CLIENT]
  res, out, err, _ = launch_clients(command, 3, 2, timeout=60,
                                    JDTENSOR_HEARTBEAT_PERIOD="0.5")
  assert res.exit_code != 0
  message = ("Client 1 has JDTENSOR_HEARTBEAT_PERIOD=4.0 but client 0 has 0.5; "
             "set JDTENSOR_HEARTBEAT_PERIOD the same on every client.")
  assert f"StartupError: {message}" in err, err
  assert (f"StartupError: Client 1: start-up refused by client 0: {message}" in err
          or "client 1 exited with code" in res.reason), err


def test_sigusr1_to_the_launcher_prints_every_clients_stacks():
  import signal
  import time

  from tests.helpers import sigterm_launcher, start_launcher
  proc, pids = start_launcher("heartbeat_victim", JDTENSOR_HEARTBEAT_PERIOD="1")
  try:
    assert len(pids) == 2, pids
    time.sleep(0.5)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(1.5)
  finally:
    returncode, err, _ = sigterm_launcher(proc, pids)
  assert returncode == 128 + signal.SIGTERM
  for c in (0, 1):  # faulthandler's dump of every thread, tagged by client.
    mine = "\n".join(lines(err, c))
    assert re.search(r"(Current thread|Thread) 0x[0-9a-f]+ \(most recent call "
                     r"first\):", mine), err
    assert re.search(r'File ".*client\.py", line \d+ in scenario_heartbeat_victim',
                     mine), err


def test_dump_stacks_shows_the_main_thread_first():
  import io
  import threading

  from jdtensor import heartbeat as hb_module
  started = threading.Event()
  stop = threading.Event()

  def helper():
    started.set()
    stop.wait(5)
  t = threading.Thread(target=helper, name="helper-thread")
  t.start()
  started.wait(5)
  try:
    sink = io.StringIO()
    text = hb_module.dump_stacks(sink)
  finally:
    stop.set()
    t.join(5)
  assert sink.getvalue() == text + "\n"
  first = text.splitlines()[0]
  assert first == "Thread 'MainThread' (most recent call last):"
  assert "Thread 'helper-thread' (most recent call last):" in text
  assert "in test_dump_stacks_shows_the_main_thread_first" in text


def test_a_frozen_client_is_killed_at_once_not_after_the_grace():
  """A SIGSTOPped client cannot act on SIGTERM: once the others named it,
  the launcher kills it at once instead of spending its 30 s grace, and the
  summary counts it among the clients it stopped, saying how."""
  import time
  res, out, err, ended = launch_clients(
      [sys.executable, CLIENT], 3, 2, timeout=120, grace=30, SCENARIO="sigstop",
      CULPRIT="1", STOP_SECONDS="600", JDTENSOR_HEARTBEAT_PERIOD="1",
      JDTENSOR_STUCK_TIMEOUT="3")
  returned = time.time() - (time.monotonic() - ended)
  assert res.first_failure == 1 and res.returncodes[1] == -9, (res, err)
  assert returned - max(res.ended_at[0], res.ended_at[2]) < 5, (res.ended_at, returned)
  assert re.fullmatch(r"jdtensor launch: client 1 missed beat \d+ \(last seen [\d.]+ s "
                      r"ago\) \(named by clients 0, 2\); stopped clients 1 \(client 1 "
                      r"frozen \(SIGSTOP, or a debugger\): killed at once\) \(also: "
                      r"client ([02]) exited with code 75, client (?!\1)[02] exited "
                      r"with code 75\)", res.reason), res.reason
  assert res.stopped == [1] and res.killed == [], res


SILENT = os.path.join(REPO, "tests", "multiprocess", "clients", "silent_service_client.py")


def test_client_0_silent_before_its_service_is_named_with_its_stack():
  """Client 0 meets every client, then falls silent before its JAX
  coordination service comes up; client 1's start-up fails after the init
  timeout (StartupTimeoutError). The summary names client 0, not client 1
  that only waited for it, and shows where client 0's main thread is."""
  res, out, err, _ = launch_clients([sys.executable, SILENT], 2, timeout=120, grace=5,
                                    SCENARIO="silent_service", CULPRIT="0",
                                    JDTENSOR_INIT_TIMEOUT="10")
  assert "[client 0] STALLING" in out and "STARTED" not in out, (out, err)
  assert res.first_failure == 0 and res.exit_code == 1, res.reason
  assert res.returncodes[1] == 1, res.returncodes
  assert re.fullmatch(r"jdtensor launch: client 0's JAX coordination service at "
                      r"DTENSOR_JOBS\[0\]='localhost:\d+' did not come up within the "
                      r"init timeout \(10 s, JDTENSOR_INIT_TIMEOUT\) though client 0 met "
                      r"every client \(named by client 1\); stopped clients 0 \(also: "
                      r"client 1 exited with code 1\)", res.reason), res.reason
  assert res.verdict_stacks[0] == "jdtensor launch: main threads when the verdict was named:"
  assert re.fullmatch(r"  client 0: silent_service_client\.py:\d+ stall_before_the_"
                      r"service <- startup\.py:\d+ \w+ <- startup\.py:\d+ \w+ \(start-up\)",
                      res.verdict_stacks[1]), res.verdict_stacks
  assert res.verdict_stacks[2:] == [
      "  client 1: exited with code 1 (no stack: it ended first)"], res.verdict_stacks
  # Client 1 says why in its own words.
  assert re.search(r"\[client 1\] .*StartupTimeoutError: Client 1: client 0 met every "
                   r"client, but its JAX coordination service", err), err
