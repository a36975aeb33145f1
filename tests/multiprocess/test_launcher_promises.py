"""The launcher's promises as a user meets them:
the root cause with its reason, exactly the clients stopped, a time-out
never restarted, nothing left behind on success, a gone reader, strict
numbers, a clear error for an environment too large."""

import io
import os
import signal
import subprocess
import sys
import time

import pytest

from jdtensor import launcher
from jdtensor.launcher.spec import Attempt, Interrupt
from jdtensor.launcher.supervisor import run_attempt
from jdtensor.launcher.supervisor import Signals
from tests.helpers import REPO, clean_env, launch_clients, pid_alive

pytestmark = pytest.mark.multiprocess

FAILURE_CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "failure_client.py")


def jdtensor_launch(*args, timeout=60, **kwargs):
  return subprocess.run([sys.executable, "-m", "jdtensor", "launch", *args],
                        capture_output=True, text=True, timeout=timeout,
                        env=clean_env(PYTHONPATH=REPO), cwd=REPO, **kwargs)


def test_the_root_cause_comes_with_its_reason_and_is_not_among_the_stopped():
  res, out, err, _ = launch_clients([sys.executable, FAILURE_CLIENT], 3, 1, timeout=60,
                                    SCENARIO="exception", CULPRIT="0",
                                    JDTENSOR_HEARTBEAT_PERIOD="0.5")
  assert res.first_failure == 0, res.reason
  head, _, stopped = res.reason.partition("; stopped clients ")
  assert head.startswith("jdtensor launch: client 0 exited with code 1: "
                         "ZeroDivisionError: division by zero (failure_client.py:"), head
  assert head.endswith(" in misbehave)"), head
  assert "0" not in stopped.split(" (also")[0].split(", "), res.reason


def test_a_survivors_line_says_who_reported_it_once():
  res, out, err, _ = launch_clients([sys.executable, FAILURE_CLIENT], 4, 1, timeout=60,
                                    SCENARIO="stall", JDTENSOR_STALL_TIMEOUT="3",
                                    JDTENSOR_HEARTBEAT_PERIOD="0.5")
  assert res.first_failure == 1, res.reason
  assert err.count("client 1 stalled") >= 4, err
  assert ") (reported by client" not in err, err


def test_a_timeout_is_never_restarted():
  start = time.monotonic()
  proc = jdtensor_launch("-n", "2", "--timeout", "3", "--grace", "1",
                         "--max-restarts", "2", "--", "sleep", "30")
  assert proc.returncode == 124, proc.stderr
  assert time.monotonic() - start < 10
  assert "restarting" not in proc.stderr, proc.stderr
  assert "jdtensor launch: timed out after 3 s; stopped clients 0, 1" in proc.stderr


def test_nothing_a_client_started_outlives_a_successful_run(tmp_path):
  pids = tmp_path / "pids"
  script = ("import os, subprocess, sys\n"
            "helper = subprocess.Popen(['sleep', '300'])\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "  os.execvp('sleep', ['sleep', '300'])\n"
            f"open({str(pids)!r} + os.environ['DTENSOR_CLIENT_ID'], 'w').write("
            "f'{helper.pid} {child}')\n")
  start = time.monotonic()
  proc = jdtensor_launch("-n", "2", "--", sys.executable, "-c", script)
  took = time.monotonic() - start
  assert proc.returncode == 0, proc.stderr
  assert took < 8, took  # Not the pipes' 2 x 5 s wait for a helper's EOF.
  left = []
  for c in (0, 1):
    for pid in map(int, (tmp_path / f"pids{c}").read_text().split()):
      deadline = time.monotonic() + 5
      while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
      if pid_alive(pid):
        left.append(pid)
        os.kill(pid, signal.SIGKILL)
  assert not left, f"still running after the launch: {left}"


def test_a_gone_reader_stops_the_run():
  chatty = "import itertools\nfor i in itertools.count(): print('line', i, flush=True)\n"
  start = time.monotonic()
  launch = subprocess.Popen([sys.executable, "-m", "jdtensor", "launch", "-n", "2", "--",
                             sys.executable, "-c", chatty], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env(PYTHONPATH=REPO),
                            cwd=REPO)
  try:
    import select
    ready, _, _ = select.select([launch.stdout], [], [], 30)  # A deadline for the line.
    assert ready, "the launcher printed nothing in 30 s"
    launch.stdout.readline()
    launch.stdout.close()  # As `| head -1` does.
    _, err = launch.communicate(timeout=30)
  finally:
    if launch.poll() is None:
      launch.kill()
      launch.wait(10)
  assert time.monotonic() - start < 30
  assert launch.returncode == 128 + signal.SIGPIPE, err
  assert b"jdtensor launch: its output was closed (the reader of its pipe exited); " \
         b"stopped clients 0, 1" in err, err
  assert b"BrokenPipeError" not in err, err


@pytest.mark.parametrize("args, message", [
    (["-n", "\u0662"], "argument -n/--num-clients: expected a positive integer in ASCII "
                       "digits, got '\u0662'"),
    (["--grace", "inf"], "argument --grace: expected a finite number of seconds > 0, "
                         "got 'inf'"),
    (["--timeout", "nan"], "argument --timeout: expected a finite number of seconds > 0, "
                           "got 'nan'"),
], ids=["arabic-indic-digit", "grace-inf", "timeout-nan"])
def test_numbers_are_ascii_and_finite(args, message):
  proc = jdtensor_launch(*args, "--", "true", timeout=30)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1] == f"jdtensor launch: error: {message}"


def test_an_environment_too_large_is_named_not_argument_list_too_long():
  n = 10_000
  spec = launcher.LaunchSpec(command=("true",), num_clients=n, secret=None)
  attempt = Attempt(tuple(range(n)), tuple(f"localhost:{10000 + i}" for i in range(n)),
                    None)
  err = io.StringIO()
  result = run_attempt(spec, attempt, io.StringIO(), err, clean_env(),
                       Signals(Interrupt()))
  assert result.exit_code == 127
  assert result.reason.startswith(
      "jdtensor launch: cannot start 'true': the clients' environment is too large "
      "(DTENSOR_JOBS alone is 159,999 bytes for 10,000 clients; Linux allows 131,072 "
      "bytes in one variable"), result.reason


def test_clients_are_stopped_with_a_test_that_times_out(tmp_path):
  """pytest-timeout's signal method raises inside the waiting launcher."""
  class TimedOut(Exception):
    pass

  def expire(signum, frame):
    raise TimedOut()
  pids = tmp_path / "pid"
  command = ("sh", "-c", f'echo $$ > {pids}$DTENSOR_CLIENT_ID; exec sleep 60')
  previous = signal.signal(signal.SIGALRM, expire)
  signal.setitimer(signal.ITIMER_REAL, 1.5)
  try:
    with pytest.raises(TimedOut):
      launcher.launch(launcher.LaunchSpec(command=command, num_clients=2, grace=1),
                      out=io.StringIO(), err=io.StringIO(), env=clean_env())
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
  for c in (0, 1):
    pid = int((tmp_path / f"pid{c}").read_text())
    assert not pid_alive(pid), pid


def test_a_client_that_ignores_sigterm_is_named_as_killed():
  ignore = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
  start = time.monotonic()
  proc = jdtensor_launch("-n", "2", "--timeout", "2", "--grace", "1", "--",
                         sys.executable, "-c", ignore)
  assert proc.returncode == 124
  assert time.monotonic() - start < 15
  assert proc.stderr.strip().splitlines()[-1] == (
      "jdtensor launch: timed out after 2 s; stopped clients 0, 1 (clients 0, 1 "
      "ignored SIGTERM for 1 s: killed)"), proc.stderr


PREEMPT_CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "preempt_client.py")


def saved_steps(out):
  import re
  return {int(c): int(s) for c, s in re.findall(r"^\[client (\d)\] SAVED step (\d+)$",
                                                 out, re.M)}


@pytest.mark.parametrize("devices", ["1", "2"])
def test_a_preempted_client_lets_every_client_save_the_same_step(devices):
  """SIGTERM to one client (a pod eviction): JAX's preemption service tells
  every client; each saves at the same step and the run ends with 0."""
  proc = subprocess.run(
      [sys.executable, "-m", "jdtensor", "launch", "-n", "3", "--devices-per-client",
       devices, "--timeout", "80", "--", sys.executable, PREEMPT_CLIENT],
      capture_output=True, text=True, timeout=120, cwd=REPO,
      env=clean_env(PYTHONPATH=REPO, SELF_TERM="1", CULPRIT="1", SAVE_SECONDS="1",
                    JDTENSOR_HEARTBEAT_PERIOD="0.5"))
  assert proc.returncode == 0, proc.stderr
  steps = saved_steps(proc.stdout)
  assert sorted(steps) == [0, 1, 2] and len(set(steps.values())) == 1, proc.stdout


def test_a_launcher_stop_gives_every_client_time_to_save():
  """--timeout's SIGTERM is a preemption notice too; the default grace (30 s,
  torchrun's) fits a save longer than the old 5 s, and nobody is killed."""
  start = time.monotonic()
  proc = subprocess.run(
      [sys.executable, "-m", "jdtensor", "launch", "-n", "3", "--timeout", "6", "--",
       sys.executable, PREEMPT_CLIENT], capture_output=True, text=True, timeout=120,
      cwd=REPO, env=clean_env(PYTHONPATH=REPO, SAVE_SECONDS="7",
                              JDTENSOR_HEARTBEAT_PERIOD="0.5"))
  took = time.monotonic() - start
  assert proc.returncode == 124, proc.stderr
  steps = saved_steps(proc.stdout)
  assert sorted(steps) == [0, 1, 2] and len(set(steps.values())) == 1, proc.stdout
  assert proc.stderr.strip().splitlines()[-1] == (
      "jdtensor launch: timed out after 6 s; stopped clients 0, 1, 2"), proc.stderr
  assert 13 < took < 30, took


def test_a_client_that_had_finished_is_not_among_the_stopped():
  """Client 3 ends its script at once and waits at exit; client 1 then
  fails: the summary does not count client 3 as stopped."""
  code = ("import os, sys, time, jdtensor\n"
          "jdtensor.initialize_accelerator_system('CPU')\n"
          "me = jdtensor.client_id()\n"
          "if me == 1:\n"
          "  time.sleep(3); raise ValueError('late failure')\n"
          "if me != 3:\n"
          "  time.sleep(30)\n")
  res, out, err, _ = launch_clients([sys.executable, "-c", code], 4, 1, timeout=60,
                                    JDTENSOR_HEARTBEAT_PERIOD="0.5")
  assert res.first_failure == 1, res.reason
  assert res.reason.startswith("jdtensor launch: client 1 exited with code 1: "
                               "ValueError: late failure"), res.reason
  stopped = res.reason.split("; stopped clients ", 1)[1].split(" (")[0]
  assert "3" not in stopped.split(", "), res.reason


# Client 0 fails after a second; client 1 is frozen (SIGSTOP), or (a child)
# runs on with a frozen child of its own, ending at SIGTERM.
_FROZEN = """
import os, signal, subprocess, sys, time
if os.environ["DTENSOR_CLIENT_ID"] == "0":
  time.sleep(1.0)
  sys.exit(3)
if sys.argv[1] == "client":
  os.kill(os.getpid(), signal.SIGSTOP)
worker = subprocess.Popen(["sleep", "600"])
os.kill(worker.pid, signal.SIGSTOP)
time.sleep(600)
"""


@pytest.mark.parametrize("frozen", ["client", "child"])
def test_a_frozen_client_is_killed_at_once_its_frozen_child_is_not(frozen):
  """A stopped client cannot act on SIGTERM: killed at once, without the
  grace (30 s), and counted among the clients stopped. A client that runs
  on beside a stopped child of its own gets its SIGTERM and the grace."""
  start = time.monotonic()
  res, out, err, _ = launch_clients([sys.executable, "-c", _FROZEN, frozen], 2, grace=30,
                                    timeout=60)
  assert time.monotonic() - start < 10, res.reason
  assert res.returncodes == [3, -9 if frozen == "client" else -15], res
  note = " (client 1 frozen (SIGSTOP, or a debugger): killed at once)"
  assert res.reason == ("jdtensor launch: client 0 exited with code 3; stopped clients 1"
                        + (note if frozen == "client" else "")), res.reason
