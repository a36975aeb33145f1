"""`jdtensor status` beside a running `jdtensor launch`, and stragglers named:
4 real clients under the launcher, client 3 slow in its own data loader
(straggler_client.py)."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, TEST_TIMEOUTS, clean_env

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "straggler_client.py")
STRAGGLING = {**TEST_TIMEOUTS, "JDTENSOR_HEARTBEAT_PERIOD": "0.2",
              "JDTENSOR_STRAGGLER_WINDOW": "2", "JDTENSOR_STRAGGLER_THRESHOLD": "30"}


def status(env, *args, timeout=30):
  return subprocess.run([sys.executable, "-m", "jdtensor", "status", *args], env=env,
                        capture_output=True, text=True, timeout=timeout, cwd=REPO)


def rows(table):
  """client -> (phase, waiting %, waited for %) from `jdtensor status`'s table."""
  out = {}
  for line in table.splitlines():
    m = re.match(r"\s*(\d+)\s+(own code|in JAX|collective|at exit)\s.*\s(\d+)%\s+(\d+)%$",
                 line)
    if m:
      out[int(m[1])] = (m[2], int(m[3]), int(m[4]))
  return out


def test_a_slow_client_is_named_a_straggler_and_status_shows_it(tmp_path):
  env = clean_env(XDG_RUNTIME_DIR=str(tmp_path), STEPS="50", SLOW_SECONDS="0.15",
                  **STRAGGLING)
  assert status(env).returncode == 1  # Nothing running yet.
  proc = subprocess.Popen(
      [sys.executable, "-m", "jdtensor", "launch", "-n", "4", "--timeout", "120",
       "--grace", "2", "--", sys.executable, CLIENT], env=env, cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    seen, deadline = {}, time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
      res = status(env, "--wait", "3")
      table = rows(res.stdout)
      # Once the window is full: the others wait for client 3.
      if len(table) == 4 and table[3][2] >= 30:
        seen = table
        break
      time.sleep(0.3)
    out, err = proc.communicate(timeout=90)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate(timeout=10)
  assert seen, f"status never showed the straggler:\n{res.stdout}\n{res.stderr}\n{err}"
  assert res.stdout.startswith("jdtensor launch (pid "), res.stdout
  for c in (0, 1, 2):
    assert seen[3][1] < seen[c][1], seen  # Client 3 waits less than the others...
    assert seen[c][2] < seen[3][2], seen  # ...and they wait for it.
  assert "straggler_client.py:" in res.stdout  # Where each main thread is.
  assert proc.returncode == 0, err
  # Named once on every client, with where it was (its loader).
  for c in range(4):
    said = [line for line in err.splitlines() if line.startswith(f"[client {c}] ")
            and "is a straggler" in line]
    assert len(said) == 1, err
    assert re.search(r"heartbeat: client 3 is a straggler: the others waited for it "
                     r"\d+% of the last 2 s \(main thread in straggler_client\.py:\d+ "
                     r"next_batch <- ", said[0]), said[0]
  # The launcher's line at the end: waiting was uneven, client 3 first.
  assert re.search(r"^jdtensor launch: the clients waited in collectives unevenly over "
                   r"the run \(\d+ s\): share of the run the others waited for each: "
                   r"client 3 \d+%, ", err, re.M), err
  # Nothing is left registered once the launcher is gone.
  assert status(env).returncode == 1


def test_status_without_a_run_says_so(tmp_path):
  res = status(clean_env(XDG_RUNTIME_DIR=str(tmp_path)))
  assert res.returncode == 1
  assert res.stdout.strip() == ("jdtensor status: no `jdtensor launch` is running for "
                                "this user on this machine (on several nodes, run it "
                                "on node 0).")
