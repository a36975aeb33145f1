"""The heartbeat: real processes, the real all-reduce on the liveness links.

Standard JAX collectives beside it: tests/multiprocess/test_invisible.py.
"""

import io
import os
import re
import sys
import signal
import time

import pytest

from jdtensor import heartbeat, launcher
from jdtensor.testing import multi_client, run_in_multi_client
from jdtensor.errors import PEER_FAILURE_EXIT_CODE
from tests.helpers import (TEST_TIMEOUTS, LiveClients, cluster_env, finish,
                           free_port, kill_when_ready, parse_results, run_python,
                           start_clients)

pytestmark = pytest.mark.multiprocess


def results_of(res_list):
  return [parse_results("\n".join(f"[client {i}] {l}" for l in r.stdout.splitlines()))[i]
          for i, r in enumerate(res_list)]


def jobs(n):
  return [f"localhost:{free_port()}" for _ in range(n)]


def _start_twice_then_stop():
  from jdtensor import heartbeat as hb_module  # pylint: disable=reimported
  hb = hb_module.current()
  hb.ready.wait(30)
  running = (hb.period, hb.policy, hb.token)
  again = hb_module.start(5.0)
  time.sleep(1.0)
  hb.event.set()
  return running, again is hb.event, hb.stopped.wait(10), hb.beats


def test_token_agreement_second_start_and_agreed_stop(capfd):
  (r0, same0, stopped0, beats0), (r1, same1, stopped1, beats1) = (
      run_in_multi_client(_start_twice_then_stop, 2, env=TEST_TIMEOUTS, fresh=True))
  assert r0[:2] == (0.2, "terminate")
  assert r0[2] == r1[2]  # Client 0's token, everywhere.
  assert same0 and same1 and stopped0 and stopped1 and beats0 >= 3
  assert beats0 == beats1  # Every client stopped after the same beat.
  assert re.search(r"^\[client 0\] .*A heartbeat thread is already running, "
                   "skipping this one.$", capfd.readouterr().err, re.M)


@pytest.mark.parametrize("victim", [2, 0], ids=["worker", "coordinator"])
def test_sigkilled_client_every_survivor_exits_within_5s(victim):
  js = jobs(3)
  envs = [cluster_env(js, c, devices=2, JDTENSOR_HEARTBEAT_PERIOD="1")
          for c in range(3)]
  live, ended = kill_when_ready("heartbeat_victim", envs, victim)
  survivors = [c for c in range(3) if c != victim]
  for c in survivors:
    assert live.procs[c].returncode == PEER_FAILURE_EXIT_CODE, live.err[c]
    assert ended[c] < 5.0, ended
    assert f"heartbeat: client {victim} missed beat " in live.err[c]
    assert "stopping this client" in live.err[c]
    assert "RESULT survived" not in live.out[c]


def test_launcher_reports_the_killed_client(monkeypatch):
  for k, v in TEST_TIMEOUTS.items():
    monkeypatch.setenv(k, v)
  out, err = io.StringIO(), io.StringIO()
  code = ("import os, time, jdtensor\n"
          "jdtensor.initialize_accelerator_system('CPU')\n"
          "if jdtensor.client_id() == 1:\n"
          "  time.sleep(1); os.kill(os.getpid(), 9)\n"
          "time.sleep(30)\n")
  start = time.monotonic()
  res = launcher.launch(launcher.LaunchSpec(
      command=(sys.executable, "-c", code), num_clients=3, timeout=60, grace=10),
      out=out, err=err)
  assert res.first_failure == 1, err.getvalue()
  assert res.reason.startswith("jdtensor launch: client 1 was killed by SIGKILL")
  assert res.exit_code == 128 + 9
  assert time.monotonic() - start < 30
  # The survivors' heartbeats saw it (the launcher's grace is 10 s, and they
  # end in under 5 s by themselves): each names client 1 and leaves with 75.
  text = err.getvalue()
  for c in (0, 2):
    assert f"[client {c}] heartbeat: client 1 missed beat" in text, text
  assert res.returncodes[0] == res.returncodes[2] == PEER_FAILURE_EXIT_CODE, text
  # Nobody needed the launcher's stop: both ended by themselves, with 75.
  head, _, also = res.reason.partition("; stopped clients none (also: ")
  assert head == "jdtensor launch: client 1 was killed by SIGKILL", res.reason
  assert sorted(also.rstrip(")").split(", ")) == [
      "client 0 exited with code 75", "client 2 exited with code 75"], res.reason


def test_out_of_sync_token_is_detected():
  js = jobs(3)
  envs = [cluster_env(js, c, JDTENSOR_HEARTBEAT_POLICY="log") for c in range(3)]
  res = finish(start_clients("heartbeat_token", envs), timeout=90)
  out = results_of(res)
  for c, other in ((0, 2), (2, 0)):
    message, ids = out[c]["failure"]
    assert ids == [1], out[c]
    # Each client finds it in its own beat, or first hears the other
    # survivor's report (relayed through client 0's links).
    assert re.fullmatch(r"heartbeat: client 1 sent token \d+ instead of \d+ in beat "
                        rf"\d+ \(restarted or out of sync\)( \(reported by client "
                        rf"{other}\))?; carrying on \(policy 'log'\)", message), message
  message, ids = out[1]["failure"]
  assert ids == [1]
  # It finds itself out of sync, or first hears a survivor name it.
  assert (message.startswith("heartbeat: this client (1) is out of sync: it sent "
                             "token ") or
          re.fullmatch(r"heartbeat: client 1 sent token \d+ instead of \d+ in beat "
                       r"\d+ \(restarted or out of sync\) \(reported by client "
                       r"[02]\); carrying on \(policy 'log'\)", message)), message


def test_policy_raise_surfaces_at_the_next_jdtensor_call():
  js = jobs(3)
  envs = [cluster_env(js, c, JDTENSOR_HEARTBEAT_PERIOD="1",
                      JDTENSOR_HEARTBEAT_POLICY="raise") for c in range(3)]
  live = LiveClients("heartbeat_victim", envs)
  try:
    assert live.wait_for("RESULT ready", [0, 1, 2], timeout=60), live.err
    start = time.monotonic()
    os.kill(live.procs[2].pid, signal.SIGKILL)
    assert live.wait_for("RESULT peer_failure", [0, 1], timeout=10), live.out
    elapsed = time.monotonic() - start
  finally:
    live.close()
  assert elapsed < 5
  for c in (0, 1):
    r = parse_results("\n".join(f"[client {c}] {l}" for l in live.out[c].splitlines()))
    message, ids = r[c]["peer_failure"]
    assert ids == [2]
    assert message.startswith("heartbeat: client 2 missed beat ")
    assert message.endswith("raising PeerFailureError at the next jdtensor call")


@multi_client(num_clients=2, env={**TEST_TIMEOUTS, "DTENSOR_ENABLE_HEARTBEAT": "false"},
              fresh=True)
def test_disabled_by_env_then_started_by_hand():
  import threading
  assert heartbeat.current() is None
  assert not [t for t in threading.enumerate() if "heartbeat" in t.name]
  event = heartbeat.start(0.1, policy="raise")
  hb = heartbeat.current()
  event.set()
  assert hb.stopped.wait(20) and hb.failure is None


def test_single_client_has_no_heartbeat():
  res = run_python("""
      import threading, jdtensor
      from jdtensor import heartbeat
      jdtensor.initialize_accelerator_system("CPU")
      assert heartbeat.current() is None
      assert not [t for t in threading.enumerate() if "heartbeat" in t.name]
      try:
        heartbeat.start(1.0)
      except ValueError as e:
        print(e)
      """)
  assert res.returncode == 0, res.stderr
  assert res.stdout.strip() == ("The heartbeat needs an initialised multi-client run "
                                "(DTENSOR_JOBS with several clients).")
