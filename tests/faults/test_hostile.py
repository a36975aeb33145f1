"""A hostile or careless neighbour on the coordinator port, two runs sharing
an address, a SIGKILLed launcher, and bad values that used to pass validation.

Part of the fault suite (`python -m pytest -m faults`): each case asserts the
exact message, a time bound and no process left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from jdtensor import _wire
from jdtensor.runtime import host, rendezvous
from tests.faults.test_faults import (assert_clean, assert_no_leftovers,
                                      error_line, jobs, run_env_case)
from tests.helpers import (CLIENT, REPO, clean_env, cluster_env, finish,
                           free_port, pid_alive, run_python, start_clients)

pytestmark = pytest.mark.faults


def listening(port: int, timeout: float = 30) -> bool:
  """Whether something listens on 127.0.0.1:port (read from /proc, no connect)."""
  deadline = time.monotonic() + timeout
  needle = f":{port:04X} "
  while time.monotonic() < deadline:
    with open("/proc/net/tcp") as f:
      if any(needle in line and line.split()[3] == "0A" for line in f):
        return True
    time.sleep(0.02)
  return False


def neighbour_then_client_1(action, n_clients=2):
  """Starts client 0, lets `action(port)` loose on its port, then the real
  clients; returns their results and the seconds it all took."""
  js = jobs(n_clients)
  port = int(js[0].rsplit(":", 1)[1])
  start = time.monotonic()
  procs = start_clients("init_only", [cluster_env(js, 0)])
  try:
    assert listening(port), "client 0 never listened"
    action(port)
    procs += start_clients("init_only", [cluster_env(js, c)
                                         for c in range(1, n_clients)])
    results = finish(procs, timeout=60)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  elapsed = time.monotonic() - start
  assert_no_leftovers(procs)
  return results, elapsed


def read_frame(sock: socket.socket) -> dict:
  data = b""
  while not data.endswith(b"\n"):
    chunk = sock.recv(65536)
    if not chunk:
      break
    data += chunk
  return json.loads(data)


def test_rogue_bytes_are_refused_and_the_run_goes_on():
  def send_list(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
      read_frame(s)
      s.sendall(b"[]\n")
      assert read_frame(s) == {"error": "malformed handshake"}
  (r0, r1), elapsed = neighbour_then_client_1(send_list)
  assert r0.returncode == 0 and r1.returncode == 0, (r0, r1)
  assert re.search(r"jdtensor: client 0 refused a start-up connection from "
                   r"127\.0\.0\.1:\d+: it sent a frame that is not a JSON object",
                   r0.stderr), r0.stderr
  assert elapsed < 20


def test_partial_lines_do_not_stall_client_0():
  """Eight connections that send '{' and wait: served at once, dropped after
  2 s each, in parallel; the real client is not held up behind them."""
  socks = []

  def half_frames(port):
    for _ in range(8):
      s = socket.create_connection(("127.0.0.1", port))
      s.sendall(b"{")
      socks.append(s)
  try:
    (r0, r1), elapsed = neighbour_then_client_1(half_frames)
  finally:
    for s in socks:
      s.close()
  assert r0.returncode == 0 and r1.returncode == 0, (r0, r1)
  assert elapsed < 10  # Was 8 x 5 s, one half-frame after another.


def test_a_silent_connection_is_dropped_after_2s_with_a_log_line():
  socks = []

  def silent(port):
    socks.append(socket.create_connection(("127.0.0.1", port)))
    time.sleep(2.5)  # Client 0 gives up on it while waiting for client 1.
  try:
    (r0, r1), elapsed = neighbour_then_client_1(silent)
  finally:
    for s in socks:
      s.close()
  assert r0.returncode == 0 and r1.returncode == 0, (r0, r1)
  assert re.search(r"jdtensor: client 0 refused a start-up connection from "
                   r"127\.0\.0\.1:\d+: it sent nothing valid within 2 s \(the auth "
                   r"stage\)", r0.stderr), r0.stderr
  assert elapsed < 15


def test_many_refused_connections_are_logged_a_few_lines_a_minute():
  """Anyone who reaches client 0's start-up port could fill its log, a line a
  connection: a few are logged, the rest counted."""
  socks = []

  def crowd(port):
    for _ in range(200):
      socks.append(socket.create_connection(("127.0.0.1", port)))
    time.sleep(2.5)  # Each is dropped after 2 s of silence.
  try:
    (r0, r1), elapsed = neighbour_then_client_1(crowd)
  finally:
    for s in socks:
      s.close()
  assert r0.returncode == 0 and r1.returncode == 0, (r0, r1)
  lines = re.findall(r"refused a start-up connection from", r0.stderr)
  assert len(lines) == host.REFUSALS_LOGGED, r0.stderr
  counted = re.search(r"jdtensor: client 0 refused (\d+) more start-up connections in "
                      r"the last 60 s \(not each logged\)", r0.stderr)
  assert counted and int(counted.group(1)) == 200 - host.REFUSALS_LOGGED, r0.stderr
  assert elapsed < 20


def test_an_oversized_line_is_refused_at_once():
  def flood(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
      read_frame(s)
      try:
        s.sendall(b"x" * (19 * 2**20))
      except OSError:
        pass  # Client 0 hung up on us: good.
  (r0, r1), elapsed = neighbour_then_client_1(flood)
  assert r0.returncode == 0 and r1.returncode == 0, (r0, r1)
  assert f"it sent more than {_wire.MAX_FRAME} bytes without a line end" in (
      r0.stderr)
  assert elapsed < 20


def test_a_forged_client_without_the_secret_is_refused():
  """It claims to be client 1 and knows the run id (client 0 says it), but not
  the secret: refused before anything about the cluster is said."""
  def forge(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
      challenge = read_frame(s)
      assert sorted(challenge) == ["auth", "jdtensor", "nonce", "run"]  # No config.
      s.sendall((json.dumps({"jdtensor": challenge["jdtensor"], "run": challenge["run"],
                             "nonce": "ab" * 32, "proof": "00" * 32}) + "\n").encode())
      assert read_frame(s) == {"error": "authentication failed"}
  (r0, r1), elapsed = neighbour_then_client_1(forge)
  assert r0.returncode == 0 and r1.returncode == 0, (r0, r1)
  assert "it did not prove it knows JDTENSOR_RUN_SECRET; refused" in r0.stderr
  assert elapsed < 20


def test_a_client_of_another_run_is_refused_by_name():
  js = jobs(2)
  env0 = cluster_env(js, 0)
  # Another run: its own DTENSOR_JOBS, which shares client 0's address.
  stranger = cluster_env([js[0], f"localhost:{free_port()}"], 1,
                         JDTENSOR_RUN_SECRET="another run " * 3)
  procs = start_clients("init_only", [env0])
  try:
    assert listening(int(js[0].rsplit(":", 1)[1]))
    [bad] = finish(start_clients("init_only", [stranger]), timeout=30)
    real = start_clients("init_only", [cluster_env(js, 1)])
    r0, r1 = finish(procs + real, timeout=60)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert r0.returncode == 0 and r1.returncode == 0, (r0, r1)
  mine = rendezvous.run_id(env0["JDTENSOR_RUN_SECRET"])
  theirs = rendezvous.run_id(stranger["JDTENSOR_RUN_SECRET"].strip())
  assert (f"a client of another run (run id {theirs}) connected; refused"
          in r0.stderr), r0.stderr
  assert_clean(bad, f"ERROR StartupError: Client 1: start-up refused by client 0: "
               f"this is client 0 of another run (run id {mine}; this client's is "
               f"{theirs}): the runs share an address. Give each run its own "
               "DTENSOR_JOBS ports and JDTENSOR_RUN_SECRET.")


def test_clients_with_different_secrets_are_told_so_at_once():
  """The same DTENSOR_JOBS, another JDTENSOR_RUN_SECRET: client 1 is told at
  once, client 0 says it at once and its time-out names it (it goes on
  waiting: an unauthenticated peer cannot end a run)."""
  js = jobs(2)
  env0 = cluster_env(js, 0, JDTENSOR_INIT_TIMEOUT="8")
  other = cluster_env(js, 1, JDTENSOR_RUN_SECRET="a different secret " * 3)
  procs = start_clients("init_only", [env0])
  try:
    assert listening(int(js[0].rsplit(":", 1)[1]))
    started = time.monotonic()
    [r1] = finish(start_clients("init_only", [other]), timeout=30)
    told_in = time.monotonic() - started
    [r0] = finish(procs, timeout=60)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert_clean(r1, "ERROR StartupError: Client 1: start-up refused by client 0: client 0 "
               "has a different JDTENSOR_RUN_SECRET than this client (1) (the same "
               "DTENSOR_JOBS): set the same JDTENSOR_RUN_SECRET on every client")
  assert told_in < 15, told_in  # Its own start-up, then at once.
  said = re.search(r"client 1 connected with a different JDTENSOR_RUN_SECRET \(from "
                   r"\S+; the same DTENSOR_JOBS\): set the same JDTENSOR_RUN_SECRET on "
                   r"every client", r0.stderr)
  assert said, r0.stderr
  assert r0.returncode == 1 and "StartupTimeoutError" in r0.stdout, r0
  assert ("which never connected. client 1 connected with a different "
          "JDTENSOR_RUN_SECRET") in r0.stdout, r0.stdout


@pytest.mark.parametrize("who", [0, 1], ids=["client-0-has-one", "client-1-has-one"])
def test_a_secret_on_one_side_only_is_a_clear_error(who):
  js = jobs(2)
  envs = [cluster_env(js, c, secret=(c == who), JDTENSOR_INIT_TIMEOUT="3")
          for c in (0, 1)]
  r0, r1 = finish(start_clients("init_only", envs), timeout=60)
  has, hasnt = ("client 0 has", "this client has") if who == 0 else (
      "this client has", "client 0 has")
  assert_clean(r1, f"ERROR StartupError: Client 1: {has} a JDTENSOR_RUN_SECRET and "
               f"{hasnt} none; set the same JDTENSOR_RUN_SECRET on every client.")
  assert r0.returncode == 1 and "StartupTimeoutError" in r0.stdout


def test_two_launches_on_the_same_port_never_join():
  port = free_port()
  first = subprocess.Popen(
      [sys.executable, "-m", "jdtensor", "launch", "-n", "2", "--port", str(port),
       "--timeout", "90", "--", sys.executable, CLIENT, "init_then_sleep"],
      env=clean_env(JDTENSOR_INIT_TIMEOUT="30", SLEEP_SECONDS="6"),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
      start_new_session=True)
  try:
    deadline = time.monotonic() + 60
    line = ""
    while "RESULT initialized" not in line and time.monotonic() < deadline:
      line = first.stdout.readline()
    second = subprocess.run(
        [sys.executable, "-m", "jdtensor", "launch", "-n", "2", "--port",
         str(port), "--timeout", "60", "--", sys.executable, CLIENT, "init_only"],
        env=clean_env(JDTENSOR_INIT_TIMEOUT="10"), capture_output=True, text=True,
        cwd=REPO, timeout=90)
    out, err = first.communicate(timeout=60)
  finally:
    if first.poll() is None:
      os.killpg(first.pid, signal.SIGKILL)
      first.communicate(timeout=10)
  assert first.returncode == 0, err  # The first run finishes normally.
  assert second.returncode != 0
  assert (f"127.0.0.1:{port} is already in use by another process" in second.stderr
          ), second.stderr


GUARDED = {
    "direct": lambda: [sys.executable, CLIENT, "sleep"],
    "bash-wrapper": lambda: ["bash", "-c", f"{sys.executable} {CLIENT} sleep; "
                             "echo done"],
}


def _descendants(pid: int) -> list[int]:
  out, todo = [], [pid]
  while todo:
    p = todo.pop()
    try:
      with open(f"/proc/{p}/task/{p}/children") as f:
        kids = [int(k) for k in f.read().split()]
    except OSError:
      kids = []
    out += kids
    todo += kids
  return out


@pytest.mark.parametrize("command", list(GUARDED), ids=list(GUARDED))
def test_sigkill_of_the_launcher_leaves_no_process(command):
  launcher = subprocess.Popen(
      [sys.executable, "-m", "jdtensor", "launch", "-n", "2", "--timeout", "120",
       "--", *GUARDED[command]()],
      env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      cwd=REPO)
  try:
    ready = 0
    deadline = time.monotonic() + 60
    while ready < 2 and time.monotonic() < deadline:
      if "RESULT ready=" in launcher.stdout.readline():
        ready += 1
    assert ready == 2
    tree = _descendants(launcher.pid)
    assert len(tree) >= 4, tree  # Guardians, the commands (and their shells).
    launcher.kill()
    launcher.communicate(timeout=10)
    time.sleep(5)
    left = [p for p in tree if pid_alive(p)]
  finally:
    if launcher.poll() is None:
      launcher.kill()
  assert not left, f"left behind: {left}"


# -- values that must fail validation, not later and badly ----------------------------

BAD_VALUES = [
    ("port-arabic-digits", {"DTENSOR_JOBS": "localhost:٤٥٦٧١,localhost:2"},
     "ConfigError: DTENSOR_JOBS='localhost:٤٥٦٧١,localhost:2': entry "
     "'localhost:٤٥٦٧١' has an invalid port '٤٥٦٧١' (expected 1..65535 in ASCII "
     "digits)."),
    ("port-superscript", {"DTENSOR_JOBS": "localhost:²,localhost:2"},
     "has an invalid port '²' (expected 1..65535 in ASCII digits)."),
    ("bind-port-too-big", {"JDTENSOR_COORDINATOR_BIND_ADDRESS": "127.0.0.1:99999"},
     "ConfigError: JDTENSOR_COORDINATOR_BIND_ADDRESS='127.0.0.1:99999' has an "
     "invalid port '99999' (expected 1..65535 in ASCII digits)."),
    ("bind-port-zero", {"JDTENSOR_COORDINATOR_BIND_ADDRESS": ":0"},
     "ConfigError: JDTENSOR_COORDINATOR_BIND_ADDRESS=':0' has an invalid port '0' "
     "(expected 1..65535 in ASCII digits)."),
    ("long-dns-label", {"DTENSOR_JOBS": "a" * 64 + ".example:5,localhost:2"},
     "has an invalid host '" + "a" * 64 + ".example': each dot-separated part of a "
     "host name has 1 to 63 characters."),
    ("client-id-5000-digits", {"DTENSOR_CLIENT_ID": "9" * 5000},
     "ConfigError: DTENSOR_CLIENT_ID='99999999999999999999...9999999999' is too "
     "long for an integer; set it to this process's index in DTENSOR_JOBS (0 for "
     "the first)."),
    ("num-clients-5000-digits", {"DTENSOR_NUM_CLIENTS": "9" * 5000},
     "ConfigError: DTENSOR_NUM_CLIENTS='99999999999999999999...9999999999' is too "
     "long for an integer"),
    ("init-timeout-1e20", {"JDTENSOR_INIT_TIMEOUT": "1e20"},
     "ConfigError: JDTENSOR_INIT_TIMEOUT='1e20' must be a number of seconds above "
     "0 and at most 604800 (a week)."),
    ("coordination-timeout-1e20", {"JDTENSOR_COORDINATION_TIMEOUT": "1e20"},
     "ConfigError: JDTENSOR_COORDINATION_TIMEOUT='1e20' must be a number of seconds "
     "above 0 and at most 604800 (a week)."),
    ("heartbeat-period-1e-6", {"JDTENSOR_HEARTBEAT_PERIOD": "1e-6"},
     "ConfigError: JDTENSOR_HEARTBEAT_PERIOD='1e-6' must be a number of seconds "
     "from 0.01 to 3600."),
    ("run-secret-short", {"JDTENSOR_RUN_SECRET": "hunter2"},
     "ConfigError: JDTENSOR_RUN_SECRET is set but has 7 characters; use at least 16 "
     "random characters"),
]


@pytest.mark.parametrize("extra,message", [c[1:] for c in BAD_VALUES],
                         ids=[c[0] for c in BAD_VALUES])
def test_bad_values(extra, message):
  res, elapsed = run_env_case(extra)
  assert_clean(res, message)
  assert message in error_line(res)
  assert elapsed < 30


def test_an_unresolvable_coordinator_is_named_as_such_on_every_client():
  res, elapsed = run_env_case({"DTENSOR_JOBS": "no-such-host.invalid:5000,"
                                               "localhost:5001",
                               "DTENSOR_CLIENT_ID": "1"})
  assert_clean(res, "ERROR StartupError: Client 1: the host of DTENSOR_JOBS[0]="
               "'no-such-host.invalid:5000' ('no-such-host.invalid') does not "
               "resolve")
  assert elapsed < 30


def test_job_names_must_agree():
  js = jobs(2)
  envs = [cluster_env(js, 0, DTENSOR_JOB_NAME="trainer"), cluster_env(js, 1)]
  r0, r1 = finish(start_clients("init_only", envs), timeout=60)
  message = ("Client 1 has DTENSOR_JOB_NAME='worker' but client 0 has 'trainer'; "
             "set DTENSOR_JOB_NAME the same on every client.")
  assert_clean(r0, "ERROR StartupError: " + message)
  assert_clean(r1, "ERROR StartupError: Client 1: start-up refused by client 0: "
               + message)


def test_a_reply_of_two_lines_from_a_fake_client_0_is_a_clear_error():
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(4)
  port = server.getsockname()[1]

  def answer():
    while True:
      try:
        conn, _ = server.accept()
      except OSError:
        return
      conn.sendall(b'{"go": true}\n{"x": 1}\n')
      conn.close()
  threading.Thread(target=answer, daemon=True).start()
  try:
    res, elapsed = run_env_case({"DTENSOR_JOBS": f"localhost:{port},localhost:"
                                                 f"{free_port()}",
                                 "DTENSOR_CLIENT_ID": "1"})
  finally:
    server.close()
  assert_clean(res, "ERROR StartupError: Client 1: the process at DTENSOR_JOBS[0]="
               f"'localhost:{port}' is not a jdtensor client 0 of this version (its "
               "challenge is malformed).")
  assert elapsed < 30


ARGUMENT_CASES = [
    ("bind-address-int",
     "jdtensor.initialize_accelerator_system('CPU', coordinator_bind_address=12345)",
     "TypeError: coordinator_bind_address must be a str like 'host', 'host:port' or "
     "'[::1]:port', got 12345 of type int."),
    ("init-timeout-arg-1e20",
     "jdtensor.initialize_accelerator_system('CPU', init_timeout=1e20)",
     "ConfigError: init_timeout=1e+20 must be a number of seconds above 0 and at "
     "most 604800 (a week)."),
    ("barrier-0", "jdtensor.barrier(MESH, 'b', timeout_in_ms=0)",
     "ValueError: timeout_in_ms=0 must be from 1 to 2147483647 milliseconds (about "
     "24.8 days); None waits DTensor's default of 24 hours."),
    ("barrier-negative", "jdtensor.barrier(MESH, 'b', timeout_in_ms=-1)",
     "ValueError: timeout_in_ms=-1 must be from 1 to 2147483647 milliseconds"),
    ("barrier-str", "jdtensor.barrier(MESH, 'b', timeout_in_ms='5000')",
     "TypeError: timeout_in_ms must be an int number of milliseconds, got '5000' "
     "of type str."),
    ("barrier-nan", "jdtensor.barrier(MESH, 'b', timeout_in_ms=float('nan'))",
     "TypeError: timeout_in_ms must be an int number of milliseconds, got nan of "
     "type float."),
    ("barrier-1e20", "jdtensor.barrier(MESH, 'b', timeout_in_ms=10**20)",
     "ValueError: timeout_in_ms=100000000000000000000 must be from 1 to 2147483647"),
    ("mesh-string-huge", "jdtensor.Mesh.from_string('m|x=100000000|*CPU')",
     "ValueError: Mesh string 'm|x=100000000|*CPU' describes 100,000,000 devices; "
     "jdtensor supports at most 1,048,576."),
    ("dim-name-separators", "jdtensor.create_mesh([('x=1,y', 2)])",
     "ValueError: Mesh dimension name 'x=1,y' cannot be used: a name must be "
     "non-empty and without '|', ',', '=', ':', '*' or white space (the mesh "
     "string format uses them as separators)."),
    ("dim-name-pipe", "jdtensor.create_mesh([('a|b', 2)])",
     "ValueError: Mesh dimension name 'a|b' cannot be used"),
    ("dim-name-duplicate", "jdtensor.create_mesh([('x', 1), ('x', 2)])",
     "ValueError: repeated mesh dimension"),
    ("dim-name-reserved", "jdtensor.create_mesh([('unsharded', 2)])",
     "ValueError: mesh dimension name unsharded is reserved"),
    ("mesh-name-pipe", "jdtensor.create_mesh([('x', 2)], mesh_name='a|b')",
     "ValueError: mesh_name='a|b' cannot be used: a mesh name may not contain '|' "
     "or be 'empty_mesh' (the mesh string format uses them)."),
]


@pytest.mark.parametrize("call,message", [c[1:] for c in ARGUMENT_CASES],
                         ids=[c[0] for c in ARGUMENT_CASES])
def test_bad_arguments(call, message):
  start = time.monotonic()
  res = run_python(f"""
      import jdtensor
      if "initialize_accelerator_system" not in {call!r}:
        jdtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
        MESH = jdtensor.create_mesh([("x", 2)])
      try:
        {call}
      except Exception as e:
        print(f"{{type(e).__name__}}: {{e}}")
      """, env=clean_env(DTENSOR_JOBS="localhost:1,localhost:2")
      if "coordinator_bind_address" in call or "init_timeout" in call else None,
      timeout=60)
  assert res.returncode == 0, res.stderr
  assert message in res.stdout, res.stdout + res.stderr
  assert time.monotonic() - start < 30
