"""The heartbeat's verdicts in the shapes users run: one device
per client (the launcher's default) and two, a result kept or read as a
temporary, late starts and late ends, Python's exit rules, JAX's thread guard.

4 clients under `jdtensor launch`, a psum loop over a `jax.make_mesh` mesh
(waiting_client.py). Each test checks the end time, the exit codes, the
launcher's first-named client and what every client says.
"""

import os
import re
import sys
import time

import pytest

from tests.helpers import REPO, launch_clients
from jdtensor.errors import OWN_FAILURE_EXIT_CODE, PEER_FAILURE_EXIT_CODE

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "waiting_client.py")
N = 4
PERIOD = 0.5
DEVICES = pytest.mark.parametrize("devices", [1, 2], ids=["1dev", "2dev"])


def run(devices, scen, bad=-1, timeout=90, **env):
  res, out, err, ended = launch_clients(
      [sys.executable, CLIENT], N, devices, timeout=timeout, SCENARIO=scen, CULPRIT=str(bad),
      **{"JDTENSOR_HEARTBEAT_PERIOD": str(PERIOD), **env})
  stamps = re.findall(rf"^\[client {bad}\] MISBEHAVING ([\d.]+)$", out, re.M)
  # From the misbehaviour to the launcher's return.
  after = (ended - (time.monotonic() - (time.time() - float(stamps[0])))
           if stamps else None)
  return res, out, err, after


def lines(err, client):
  return [line.split("] ", 1)[1] for line in err.splitlines()
          if line.startswith(f"[client {client}] ")]


def each_names_once(err, pattern):
  """Every client says `pattern` exactly once."""
  for c in range(N):
    said = [line for line in lines(err, c) if re.search(pattern, line)]
    assert len(said) == 1, f"client {c} said {said!r}; all:\n{err}"


@DEVICES
@pytest.mark.parametrize("read", ["kept", "temporary"])
def test_a_staller_is_named_within_the_stall_timeout_plus_two_periods(devices, read):
  stall = 4
  res, out, err, after = run(devices, "stall", bad=2, READ=read,
                             JDTENSOR_STALL_TIMEOUT=str(stall))
  assert after is not None and after < stall + 2 * PERIOD + 4, f"{after}\n{err}"
  assert res.first_failure == 2 and res.returncodes[2] == OWN_FAILURE_EXIT_CODE, (
      res.reason)
  assert res.reason.startswith("jdtensor launch: client 2 exited with code 70: client 2 "
                               "stalled: main thread in waiting_client.py:"), res.reason
  # The heartbeat's line, or (a psum cut short by the staller's exit) the
  # consequence line that carries it.
  each_names_once(err, r"heartbeat: client 2 stalled: main thread in "
                       r"waiting_client\.py:\d+ next_batch .* while clients 0, 1, 3 wait "
                       r"in a collective")
  assert all(res.returncodes[c] in (PEER_FAILURE_EXIT_CODE, -15) for c in (0, 1, 3)), (
      res.returncodes)


@DEVICES
@pytest.mark.parametrize("read", ["kept", "temporary"])
def test_an_early_exit_0_is_named_within_the_exit_grace(devices, read):
  res, out, err, after = run(devices, "exit0", bad=1, READ=read)
  assert after is not None and after < max(3.0, 2 * PERIOD) + 4, f"{after}\n{err}"
  assert res.first_failure == 1, res.reason
  assert res.reason.startswith("jdtensor launch: client 1 exited (code 0) while the "
                               "others were still running (clients 0, 2, 3 wait in a "
                               "collective)"), res.reason
  for c in (0, 2, 3):
    assert res.returncodes[c] == PEER_FAILURE_EXIT_CODE, f"{res.returncodes}\n{err}"
    said = [line for line in lines(err, c) if "client 1 exited (code 0)" in line]
    assert len(said) == 1, f"client {c}:\n{err}"


@DEVICES
def test_a_slow_first_collective_is_not_killed_and_the_late_client_is_named(devices):
  """JAX's gloo gives a device group's first collective 30 s to form, with no
  setting; until then nobody is a staller (the stall time-out is far
  shorter), and when JAX gives up, the late client is named, never a waiter."""
  res, out, err, after = run(devices, "late_first", bad=3, LATE="40",
                             JDTENSOR_STALL_TIMEOUT="4")
  assert "stalled" not in err, err
  assert after is not None and 29 < after < 38, f"{after}\n{err}"
  assert res.first_failure == 3, res.reason
  assert res.reason.startswith(
      "jdtensor launch: client 3 exited with code 70: client 3 did not join the "
      "collective the others waited in within JAX's 30 s communicator set-up time "
      "(not configurable); it was still in set-up, before its first collective. If a "
      "set-up is slow by design (loading data, compiling on one client), end it with "
      "a barrier (jdtensor.barrier, multihost_utils.sync_global_devices) so that "
      "every client enters the first collective together"), res.reason
  each_names_once(err, r"heartbeat: client 3 did not join the collective")


@pytest.mark.parametrize("late_client", [0, 2])
def test_a_client_started_long_after_the_others_joins_them(late_client):
  """12 s late, longer than a client waits for a silent client 0 (10 s): a
  late client 2 failed every client's start-up before client 0 said whom it
  was waiting for. One device per client, the launcher's default."""
  res, out, err, _ = run(1, "late_start", bad=late_client, LATE="12")
  assert res.exit_code == 0 and res.returncodes == [0] * N, f"{res.reason}\n{err}"
  assert out.count("DONE") == N
  assert "Traceback" not in err and "heartbeat: client" not in err, err


@DEVICES
@pytest.mark.parametrize("late_client", [0, 2])
def test_a_late_finisher_is_waited_for_and_the_run_ends_with_0(devices, late_client):
  """Longer than the shutdown time-out: the others wait while it beats."""
  res, out, err, after = run(devices, "late_end", bad=late_client, LATE="12",
                             JDTENSOR_SHUTDOWN_TIMEOUT="4")
  assert res.exit_code == 0 and res.returncodes == [0] * N, f"{res.reason}\n{err}"
  assert out.count("DONE") == N
  assert after is not None and 12 <= after < 20, after
  assert "heartbeat: client" not in err, err
  assert re.search(rf"jdtensor: client \d ended its script; waiting for client "
                   rf"{late_client}, still running and beating", err), err


@DEVICES
def test_a_long_computation_on_its_own_devices_is_never_a_staller(devices):
  # One call of at least 7 s, on this machine, fast or slow.
  res, out, err, after = run(devices, "busy", bad=1, BUSY_SECONDS="7",
                             JDTENSOR_STALL_TIMEOUT="3")
  busy = re.search(r"BUSY ([\d.]+)", out)
  assert busy and float(busy.group(1)) > 6, out  # Twice the stall time-out.
  assert res.exit_code == 0 and res.returncodes == [0] * N, f"{res.reason}\n{err}"
  assert "stalled" not in err and "heartbeat: client" not in err, err


@DEVICES
def test_sys_exit_false_at_the_end_is_code_0(devices):
  res, out, err, _ = run(devices, "exitfalse")
  assert res.exit_code == 0 and res.returncodes == [0] * N, f"{res.reason}\n{err}"
  assert out.count("DONE") == N and "heartbeat: client" not in err, err


@DEVICES
def test_the_heartbeat_is_invisible_to_jax_thread_guard(devices):
  res, out, err, _ = run(devices, "none", GUARD="1")
  assert res.exit_code == 0 and out.count("DONE") == N, f"{res.reason}\n{err}"
  assert "FAILED_PRECONDITION" not in err and "heartbeat: client" not in err, err


@pytest.mark.parametrize("devices, python_ms", [(1, 0), (2, 0), (1, 30)],
                         ids=["1dev", "2dev", "1dev-mostly-python"])
def test_daemon_threads_in_collectives_at_the_end_are_a_clean_prompt_end(devices, python_ms):
  """Python's finalisation aborts a process whose daemon thread returns from
  JAX's C++ code. Seen in Python code at exit (30 ms of it per step, or
  between two psums), such a thread still enters JAX the next instant."""
  start = time.monotonic()
  res, out, err, _ = run(devices, "daemon", PYTHON_MS=str(python_ms))
  assert res.exit_code == 0 and res.returncodes == [0] * N, f"{res.reason}\n{err}"
  assert "FATAL" not in err and "terminate called" not in err, err
  assert time.monotonic() - start < 20


@DEVICES
def test_a_forked_child_never_speaks_for_its_parent(devices):
  start = time.monotonic()
  res, out, err, _ = run(devices, "fork", bad=1)
  assert res.exit_code == 0 and res.returncodes == [0] * N, f"{res.reason}\n{err}"
  assert out.count("DONE") == N and "heartbeat: client" not in err, err
  assert time.monotonic() - start < 20


@DEVICES
def test_every_exit_handler_runs_once_on_a_failure(devices):
  res, out, err, _ = run(devices, "atexit_raise", bad=1)
  assert res.first_failure == 1 and res.returncodes[1] == 1, res.reason
  assert [line for line in out.splitlines() if "HANDLER RAN" in line].count(
      "[client 1] HANDLER RAN") == 1, out
  for c in range(N):
    assert out.count(f"[client {c}] HANDLER RAN") <= 1, out


def test_a_stuck_timeout_not_below_the_coordination_timeout_is_refused_at_startup():
  start = time.monotonic()
  res, out, err, _ = launch_clients([sys.executable, CLIENT], 2, 1, timeout=60,
                                    JDTENSOR_STUCK_TIMEOUT="300",
                                    JDTENSOR_COORDINATION_TIMEOUT="10")
  assert time.monotonic() - start < 20
  assert res.exit_code == 1, res.reason
  message = ("ConfigError: JDTENSOR_STUCK_TIMEOUT='300' must be shorter than "
             "JDTENSOR_COORDINATION_TIMEOUT='10': JAX aborts every client 10 s after one "
             "stops answering, before jdtensor can name it. Set JDTENSOR_STUCK_TIMEOUT "
             "below 10 (at least 0.4, two heartbeat periods) or the coordination "
             "time-out above 300, or leave one of them unset: jdtensor derives it "
             "from the other.")
  # The client that failed first says it (the launcher may stop the other
  # before it prints the same line).
  assert res.first_failure in (0, 1), res.reason
  assert f"[client {res.first_failure}] jdtensor.errors.{message}" in err, err
