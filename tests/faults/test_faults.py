"""The fault and bad-input suite: `python -m pytest -m faults`.

Every case runs in fresh processes with a hard deadline and asserts three
things: a clear error (the message names the variable, value or client), a
bounded time, and no process left behind.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time

import pytest

from jdtensor.errors import PEER_FAILURE_EXIT_CODE
from tests.helpers import (clean_env, cluster_env, finish, free_port,
                           kill_when_ready, pid_alive, sigterm_launcher,
                           start_clients, start_launcher)

pytestmark = pytest.mark.faults

CRASH_SIGNS = ("Check failed", "Fatal Python error", "*** SIG", "Segmentation fault")


def jobs(n):
  return [f"localhost:{free_port()}" for _ in range(n)]


def error_line(res) -> str:
  """The client's one ``ERROR <type>: <message>`` line."""
  lines = [l for l in res.stdout.splitlines() if l.startswith("ERROR ")]
  assert len(lines) == 1, res.stdout + res.stderr
  return lines[0]


def assert_clean(res, message, returncode=1):
  assert res.returncode == returncode, (res.returncode, res.stdout, res.stderr)
  assert message in res.stdout + res.stderr, res.stdout + res.stderr
  for sign in CRASH_SIGNS:
    assert sign not in res.stderr, res.stderr


def assert_no_leftovers(procs):
  for proc in procs:
    assert not pid_alive(proc.pid), f"process {proc.pid} left behind"
    try:
      os.killpg(proc.pid, 0)
      raise AssertionError(f"process group {proc.pid} still has processes")
    except ProcessLookupError:
      pass


def run_env_case(extra: dict[str, str], client: int = 0, n_jobs: int = 2,
                 scenario: str = "init_only", timeout: float = 60):
  env = cluster_env(jobs(n_jobs), client)
  for key, value in extra.items():
    if value is None:
      env.pop(key, None)
    else:
      env[key] = value
  start = time.monotonic()
  procs = start_clients(scenario, [env])
  [res] = finish(procs, timeout=timeout)
  elapsed = time.monotonic() - start
  assert_no_leftovers(procs)
  return res, elapsed


# -- malformed DTENSOR_* / JDTENSOR_* values and combinations --------------------------

ENV_CASES = [
    ("client-id-word", {"DTENSOR_CLIENT_ID": "abc"},
     "ConfigError: DTENSOR_CLIENT_ID='abc' is not an integer; set it to this "
     "process's index in DTENSOR_JOBS (0 for the first)."),
    ("client-id-empty", {"DTENSOR_CLIENT_ID": ""},
     "ConfigError: DTENSOR_CLIENT_ID='' is not an integer"),
    ("client-id-float", {"DTENSOR_CLIENT_ID": "1.5"},
     "ConfigError: DTENSOR_CLIENT_ID='1.5' is not an integer"),
    ("client-id-negative", {"DTENSOR_CLIENT_ID": "-1"},
     "ConfigError: Environment variable DTENSOR_CLIENT_ID must be >= 0, got -1. "),
    ("client-id-too-big", {"DTENSOR_CLIENT_ID": "2"},
     "ConfigError: Environment variable DTENSOR_CLIENT_ID must be < 2, got 2"),
    ("client-id-without-jobs", {"DTENSOR_JOBS": None, "DTENSOR_CLIENT_ID": "1"},
     "ConfigError: Environment variable DTENSOR_CLIENT_ID must be < 1, got 1"),
    ("jobs-empty-entry", {"DTENSOR_JOBS": "localhost:1,,localhost:2"},
     "ConfigError: DTENSOR_JOBS='localhost:1,,localhost:2' has an empty entry at "
     "position 1"),
    ("jobs-trailing-comma", {"DTENSOR_JOBS": "localhost:1,localhost:2,"},
     "has an empty entry at position 2"),
    ("jobs-no-port", {"DTENSOR_JOBS": "localhost,localhost:2"},
     "entry 'localhost' is not of the form host:port"),
    ("jobs-port-zero", {"DTENSOR_JOBS": "localhost:0,localhost:2"},
     "has an invalid port '0' (expected 1..65535 in ASCII digits)"),
    ("jobs-port-too-big", {"DTENSOR_JOBS": "localhost:70000,localhost:2"},
     "has an invalid port '70000' (expected 1..65535 in ASCII digits)"),
    ("jobs-port-word", {"DTENSOR_JOBS": "localhost:http,localhost:2"},
     "has an invalid port 'http'"),
    ("jobs-bad-host", {"DTENSOR_JOBS": "ho st:1,localhost:2"},
     "has an invalid host 'ho st'"),
    ("jobs-duplicate", {"DTENSOR_JOBS": "localhost:5,localhost:5"},
     "lists 'localhost:5' twice (clients 0 and 1); every client needs its own "
     "address."),
    ("jobs-bns-unsorted", {"DTENSOR_JOBS": "/bns/a/2:p,/bns/a/1:p"},
     "Unexpected DTENSOR_JOBS content /bns/a/2:p,/bns/a/1:p. Sort entries in "
     "DTENSOR_JOBS because cluster construction relies on the order."),
    ("jobs-bns-mixed", {"DTENSOR_JOBS": "/bns/a/1:p,host:2"},
     "mixes BNS entries with numeric task ids and entries without one"),
    ("num-clients-disagree", {"DTENSOR_NUM_CLIENTS": "3"},
     "disagrees with DTENSOR_JOBS="),
    ("num-clients-word", {"DTENSOR_NUM_CLIENTS": "two"},
     "ConfigError: DTENSOR_NUM_CLIENTS='two' is not an integer"),
    ("num-clients-without-jobs", {"DTENSOR_JOBS": None, "DTENSOR_CLIENT_ID": None,
                                  "DTENSOR_NUM_CLIENTS": "4"},
     "ConfigError: DTENSOR_NUM_CLIENTS='4' disagrees with DTENSOR_JOBS=unset "
     "(local mode)"),
    ("job-name-empty", {"DTENSOR_JOB_NAME": ""},
     "ConfigError: DTENSOR_JOB_NAME='' is not a valid job name"),
    ("job-name-slash", {"DTENSOR_JOB_NAME": "my/job"},
     "ConfigError: DTENSOR_JOB_NAME='my/job' is not a valid job name"),
    ("heartbeat-flag", {"DTENSOR_ENABLE_HEARTBEAT": "maybe"},
     "ConfigError: DTENSOR_ENABLE_HEARTBEAT='maybe' is not a boolean"),
    ("nccl-flag", {"DTENSOR_GPU_USE_NCCL_COMMUNICATION": "sure"},
     "ConfigError: DTENSOR_GPU_USE_NCCL_COMMUNICATION='sure' is not a boolean"),
    ("init-timeout", {"JDTENSOR_INIT_TIMEOUT": "-5"},
     "ConfigError: JDTENSOR_INIT_TIMEOUT='-5' must be a number of seconds above 0 "
     "and at most 604800 (a week)."),
    ("heartbeat-period", {"JDTENSOR_HEARTBEAT_PERIOD": "0"},
     "ConfigError: JDTENSOR_HEARTBEAT_PERIOD='0' must be a number of seconds from "
     "0.01 to 3600."),
    ("heartbeat-period-huge", {"JDTENSOR_HEARTBEAT_PERIOD": "1e300"},
     "ConfigError: JDTENSOR_HEARTBEAT_PERIOD='1e300' must be a number of seconds "
     "from 0.01 to 3600."),
    ("stuck-timeout-short", {"JDTENSOR_HEARTBEAT_PERIOD": "2",
                             "JDTENSOR_STUCK_TIMEOUT": "1"},
     "ConfigError: JDTENSOR_STUCK_TIMEOUT='1' must be at least twice the heartbeat "
     "period (JDTENSOR_HEARTBEAT_PERIOD='2'): a beat may take a period to start. Set "
     "JDTENSOR_STUCK_TIMEOUT to at least 4 or the period to at most 0.5."),
    ("stall-timeout", {"JDTENSOR_STALL_TIMEOUT": "-1"},
     "ConfigError: JDTENSOR_STALL_TIMEOUT='-1' must be 0 (off) or a number of "
     "seconds from 1 to 604800."),
    ("heartbeat-policy", {"JDTENSOR_HEARTBEAT_POLICY": "abort"},
     "ConfigError: JDTENSOR_HEARTBEAT_POLICY='abort' is not one of terminate, "
     "raise, log."),
    ("cluster-detection", {"JDTENSOR_CLUSTER_DETECTION": "pbs"},
     "ConfigError: cluster_detection='pbs' is not one of none, auto, tpu, slurm, "
     "k8s, ompi."),
    ("coordinator-host-unknown", {"DTENSOR_JOBS": "no-such-host.invalid:5000,"
                                                  "localhost:5001"},
     "StartupError: Client 0 cannot start the coordinator: the host of "
     "DTENSOR_JOBS[0]='no-such-host.invalid:5000' ('no-such-host.invalid') does "
     "not resolve"),
    ("bind-address-not-here", {"JDTENSOR_COORDINATOR_BIND_ADDRESS": "192.0.2.7"},
     "is not an address of this machine; run client 0 on the host named by "
     "DTENSOR_JOBS[0], or set JDTENSOR_COORDINATOR_BIND_ADDRESS."),
]


@pytest.mark.parametrize("extra,message", [c[1:] for c in ENV_CASES],
                         ids=[c[0] for c in ENV_CASES])
def test_bad_environment(extra, message):
  res, elapsed = run_env_case(extra)
  assert_clean(res, message)
  assert message in error_line(res)
  assert elapsed < 30


def test_simulated_topology_malformed():
  res, elapsed = run_env_case({"JDTENSOR_SIMULATED_TPU_TOPOLOGY": "2x2"},
                              scenario="tpu")
  assert_clean(res, "ERROR ConfigError: JDTENSOR_SIMULATED_TPU_TOPOLOGY='2x2' is "
               "not a TPU slice shape")
  assert elapsed < 30


# -- cluster faults ----------------------------------------------------------------------

def test_coordinator_port_taken():
  blocker = socket.socket()
  blocker.bind(("127.0.0.1", 0))
  blocker.listen(1)
  port = blocker.getsockname()[1]
  try:
    res, elapsed = run_env_case({"DTENSOR_JOBS": f"localhost:{port},localhost:{free_port()}"})
  finally:
    blocker.close()
  assert_clean(res, (
      f"ERROR StartupError: Client 0 cannot start the coordinator for "
      f"DTENSOR_JOBS[0]='localhost:{port}': 127.0.0.1:{port} is already in use by "
      "another process; stop it, or choose a free port for DTENSOR_JOBS[0] "
      "(`jdtensor launch` picks free ports)."))
  assert elapsed < 30


def test_coordinator_never_comes_up():
  res, elapsed = run_env_case({"DTENSOR_CLIENT_ID": "1", "JDTENSOR_INIT_TIMEOUT": "2"})
  coordinator = re.search(r"DTENSOR_JOBS\[0\]='([^']+)'", res.stdout).group(1)
  assert_clean(res, (
      f"ERROR StartupTimeoutError: Client 1 could not reach the coordinator at "
      f"DTENSOR_JOBS[0]='{coordinator}' within 2 s (the init timeout): client 0 "
      "has not started it. Start client 0 (it hosts the coordinator), check that "
      "every client has the same DTENSOR_JOBS, or raise the init timeout "
      "(JDTENSOR_INIT_TIMEOUT)."))
  assert elapsed < 30


def test_one_client_never_starts():
  res, elapsed = run_env_case({"JDTENSOR_INIT_TIMEOUT": "2"}, n_jobs=3)
  coordinator = re.search(r"DTENSOR_JOBS\[0\]='([^']+)'", res.stdout).group(1)
  assert_clean(res, (
      f"ERROR StartupTimeoutError: Client 0 waited 2 s (the init timeout) at the "
      f"coordinator DTENSOR_JOBS[0]='{coordinator}' for client(s) 1, 2, which "
      "never connected. Start every client with the same DTENSOR_JOBS and its own "
      "DTENSOR_CLIENT_ID, or raise the init timeout (JDTENSOR_INIT_TIMEOUT)."))
  assert elapsed < 30


def test_client_killed_at_init():
  js = jobs(2)
  procs = start_clients("die_after_rendezvous", [cluster_env(js, c) for c in (0, 1)])
  start = time.monotonic()
  r0, r1 = finish(procs, timeout=60)
  assert time.monotonic() - start < 30
  assert r1.returncode == -signal.SIGKILL
  assert_clean(r0, "StartupError: client 1's process ended during start-up (its "
               "process ended without saying goodbye) after meeting the coordinator",
               returncode=PEER_FAILURE_EXIT_CODE)
  assert_no_leftovers(procs)


@pytest.mark.parametrize("scenario,victim", [("heartbeat_victim", 1),
                                             ("barrier_wait", 1)],
                         ids=["mid-collective-loop", "during-barrier"])
def test_client_killed_while_running(scenario, victim):
  js = jobs(2)
  envs = [cluster_env(js, c, JDTENSOR_HEARTBEAT_PERIOD="1") for c in (0, 1)]
  live, ended = kill_when_ready(scenario, envs, victim)
  assert live.procs[0].returncode == PEER_FAILURE_EXIT_CODE, live.err[0]
  assert ended[0] < 5
  assert f"heartbeat: client {victim} missed beat " in live.err[0]
  assert_no_leftovers(live.procs)


def test_sigterm_to_launcher_mid_run():
  proc, pids = start_launcher("heartbeat_victim", JDTENSOR_INIT_TIMEOUT="30")
  returncode, err, elapsed = sigterm_launcher(proc, pids)
  assert returncode == 128 + signal.SIGTERM
  assert "jdtensor launch: received SIGTERM; stopped clients 0, 1" in err
  assert elapsed < 10
  assert not any(pid_alive(p) for p in pids)


@pytest.mark.parametrize("scenario,message", [
    ("double_init", "ERROR AlreadyInitializedError: Accelerator system has already "
     "been initialized. Call tf.experimental.dtensor.shutdown_accelerator_system() "
     "first."),
    ("shutdown_multi", "ERROR ValueError: Shutting down accelerator system under "
     "multi-client mode is not supported."),
], ids=["double-initialize", "shutdown-multi-client"])
def test_wrong_order_calls(scenario, message):
  js = jobs(2)
  # Both clients make the same mistake at the same moment; without a heartbeat
  # neither is stopped as the other's consequence before it prints its error.
  procs = start_clients(scenario, [cluster_env(js, c, DTENSOR_ENABLE_HEARTBEAT="false")
                                   for c in (0, 1)])
  results = finish(procs, timeout=60)
  for res in results:
    assert res.returncode == 1 and message in res.stdout, res.stdout + res.stderr
  assert_no_leftovers(procs)


@pytest.mark.parametrize("which,message", [
    ("create_mesh", "ERROR ValueError: Device '/job:worker/replica:0/task:0/device:"
     "CPU:7' does not exist: client 0 has 1 CPU device(s) (CPU:0..CPU:0)."),
    ("remote_task", "ERROR ValueError: Device '/job:worker/replica:0/task:5/device:"
     "CPU:0' does not exist: client 5 has 0 CPU device(s) (none)."),
], ids=["local-device", "remote-client"])
def test_mesh_with_devices_that_do_not_exist(which, message):
  js = jobs(2)
  # Both clients make the same mistake at once; without a heartbeat client 0
  # is not stopped as client 1's consequence before it prints its error.
  procs = start_clients("missing_device", [
      cluster_env(js, c, FAULT_MESH=which, DTENSOR_ENABLE_HEARTBEAT="false")
      for c in (0, 1)])
  results = finish(procs, timeout=60)
  assert_clean(results[0], message)
  assert_no_leftovers(procs)


GOOD_MESH = ("|batch=2,model=2|0,1,2,3|0,1|/job:worker/replica:0/task:0/device:CPU:0,"
             "/job:worker/replica:0/task:0/device:CPU:1")


@pytest.mark.parametrize("kind,corrupt", [
    ("mesh", lambda s: s[:len(s) // 2]),
    ("mesh", lambda s: s.replace("=2", "=x", 1)),
    ("mesh", lambda s: s.replace("|", "/", 2)),
    ("mesh", lambda s: s.replace("0,1|", "0,9|", 1)),
    ("mesh", lambda s: s.encode()[:37].decode() + "\ufffd\x00" + s[40:]),
    ("layout", lambda s: "sharding_specs:batch mesh:" + s),
    ("layout", lambda s: "sharding_specs:batch,batch, mesh:" + s),
    ("layout", lambda s: "sharding_specs:zz, mesh:" + s),
    ("layout", lambda s: "sharding_specs:batch, mesh:" + s[:-5]),
], ids=["mesh-truncated", "mesh-dim-size", "mesh-separators", "mesh-local-id",
        "mesh-binary", "layout-no-comma", "layout-repeated", "layout-unknown-dim",
        "layout-truncated-mesh"])
def test_corrupted_string_from_disk(tmp_path, kind, corrupt):
  path = tmp_path / f"saved.{kind}"
  path.write_text(corrupt(GOOD_MESH), encoding="utf-8")
  env = clean_env(FAULT_FILE=str(path), FAULT_KIND=kind)
  procs = start_clients("corrupt_string", [env])
  [res] = finish(procs, timeout=60)
  assert res.returncode == 1, res.stdout + res.stderr
  assert "ERROR ValueError: " in res.stdout, res.stdout + res.stderr
  assert_no_leftovers(procs)
