"""Warm clusters (jdtensor.testing) as users run them: pytest on a test file,
in a subprocess; which tests shared client processes, what the next test
saw, what a failure cost, and that nothing is left behind."""

import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.helpers import REPO, TEST_TIMEOUTS, clean_env, pid_alive, run_pytest

pytestmark = pytest.mark.multiprocess

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "clients", "warm_cluster_examples.py")


def clients_of(output):
  """{test mark: set of client pids} from the bodies' WARM lines."""
  seen = {}
  for name, pid in re.findall(r"\[client \d+\] WARM (\S+) (\d+)", output):
    seen.setdefault(name, set()).add(int(pid))
  return seen


def _cluster_dirs():
  return set(glob.glob(os.path.join(tempfile.gettempdir(), "jdtensor-warm-*")))


@pytest.fixture(scope="module")
def examples():
  before = _cluster_dirs()
  result = run_pytest(EXAMPLES, "-s", timeout=300)
  return (*result, _cluster_dirs() - before)


EXPECTED = {
    "test_changes_everything_it_can": "passed", "test_sees_none_of_it": "passed",
    "test_leaves_a_thread_running": "passed", "test_after_the_thread": "passed",
    "test_leaves_a_process_running": "passed", "test_after_the_process": "passed",
    "test_leaves_a_file_open": "passed", "test_after_the_file": "passed",
    "test_leaves_a_default_mesh_open": "passed", "test_after_the_mesh": "passed",
    "test_stops_the_heartbeat": "passed", "test_after_the_heartbeat": "passed",
    "test_client_1_fails_while_client_0_waits": "failure",
    "test_after_the_failure": "passed", "test_times_out": "failure",
    "test_after_the_time_out": "passed", "test_kills_client_1": "failure",
    "test_after_the_kill": "passed", "test_exits_on_client_0": "failure",
    "test_after_the_exit": "passed", "test_fresh": "passed",
    "test_after_fresh": "passed", "test_the_marker_form": "passed",
    "test_run_in_multi_client_shares_it_too": "passed",
    "test_a_failure_is_the_callers_to_catch": "passed",
    "test_after_a_caught_failure": "passed", "test_shape_b": "passed",
    "test_shape_c": "passed", "test_shape_d": "passed",
    "test_back_to_the_first_shape": "passed",
}


def test_each_test_has_its_own_outcome(examples):
  """A failure fails its own test only: the next one on the shape passes."""
  _, outcomes, out, _ = examples
  assert {name: o[0] for name, o in outcomes.items()} == EXPECTED, out
  assert "RuntimeWarning" not in out, out  # The client module is loaded once.


def test_a_cluster_is_shared_until_a_test_retires_it(examples):
  _, _, out, _ = examples
  seen = clients_of(out)
  assert all(len(pids) == (1 if name.startswith("shape-") else 2)
             for name, pids in seen.items()), seen
  same = [("changes", "sees-none"), ("sees-none", "thread"),
          ("after-thread", "process"), ("after-process", "file"), ("after-file", "mesh"), ("after-mesh", "heartbeat"),
          ("after-heartbeat", "fails"),
          ("after-failure", "times-out"), ("after-time-out", "kills"),
          ("after-kill", "exits"), ("after-exit", "after-fresh"),
          ("after-fresh", "marker"), ("marker", "plain")]
  for a, b in same:
    assert seen[a] == seen[b], (a, b, seen)
  # Retired after a passing test that left something, or after a failure.
  new = [("thread", "after-thread"), ("process", "after-process"), ("file", "after-file"), ("mesh", "after-mesh"),
         ("heartbeat", "after-heartbeat"),
         ("fails", "after-failure"), ("times-out", "after-time-out"),
         ("kills", "after-kill"), ("exits", "after-exit"), ("plain", "after-caught")]
  for a, b in new:
    assert not seen[a] & seen[b], (a, b, seen)
  assert not seen["fresh"] & (seen["after-exit"] | seen["after-fresh"]), seen
  # Three other shapes since: the first shape's cluster was the one used
  # longest ago, retired to keep at most MAX_CLUSTERS.
  assert not seen["after-caught"] & seen["back"], seen


def test_the_next_test_sees_none_of_what_one_changed(examples):
  _, outcomes, out, _ = examples
  assert outcomes["test_sees_none_of_it"][0] == "passed", out
  assert outcomes["test_after_the_mesh"][0] == "passed", out


def test_a_retired_cluster_is_said_with_its_reason(examples):
  _, _, out, _ = examples
  for test, why in (("test_leaves_a_thread_running", "a thread the body started is "
                     "still running: 'left-behind'"),
                    ("test_leaves_a_process_running", "a process the body "
                     "started is still running: pid "),
                    ("test_leaves_a_file_open", "the body left open: "
                     f"{EXAMPLES}"),
                    ("test_leaves_a_default_mesh_open", "a default_mesh scope the "
                     "body entered is still open"),
                    ("test_stops_the_heartbeat", "the body stopped, started or "
                     "replaced jdtensor's heartbeat")):
    assert re.search(rf"WarmClusterRetired: {test}: passed, but its warm cluster "
                     rf"\(2 x 2 CPU\) was retired after it .*client 0: {re.escape(why)}",
                     out), (test, out[-4000:])


def test_failures_are_reported_as_on_fresh_clients(examples):
  _, outcomes, _, _ = examples
  message = outcomes["test_client_1_fails_while_client_0_waits"][1]
  assert "client 1: ValueError: wrong on purpose in client 1" in message, message
  assert "client 0 stopped as a consequence" in outcomes[
      "test_client_1_fails_while_client_0_waits"][2]
  assert ("test_times_out: timed out after 4 s: clients 0, 1 did not finish"
          in outcomes["test_times_out"][1]), outcomes
  assert "in test_times_out" in outcomes["test_times_out"][2]
  assert "killed by SIGKILL" in outcomes["test_kills_client_1"][2]
  assert "client 0: SystemExit: 0" in outcomes["test_exits_on_client_0"][1]


def test_no_client_is_left_after_the_session(examples):
  _, _, out, left = examples
  pids = set().union(*clients_of(out).values())
  assert pids and not [p for p in pids if pid_alive(p)]
  assert not left  # Nor a cluster's folder.


@pytest.mark.parametrize("scope", ["session", "module", "fresh"])
def test_clusters_are_kept_for_the_scope_asked(tmp_path, scope):
  """--jdtensor-clusters: two modules of two tests each, one shape."""
  for module in ("a", "b"):
    (tmp_path / f"test_{module}.py").write_text(
        "import os\n"
        "from jdtensor.testing import multi_client\n"
        + "".join(f"@multi_client(num_clients=2)\n"
                  f"def test_{module}{k}():\n"
                  f"  print(f'WARM {module}{k} {{os.getpid()}}', flush=True)\n"
                  for k in (1, 2)))
  code, outcomes, out = run_pytest(str(tmp_path), "-s", f"--jdtensor-clusters={scope}",
                                   timeout=240)
  assert code == 0 and len(outcomes) == 4, out
  seen = clients_of(out)
  shared = {"session": [("a1", "a2"), ("a2", "b1"), ("b1", "b2")],
            "module": [("a1", "a2"), ("b1", "b2")], "fresh": []}[scope]
  apart = {"session": [], "module": [("a2", "b1")],
           "fresh": [("a1", "a2"), ("a2", "b1"), ("b1", "b2")]}[scope]
  for a, b in shared:
    assert seen[a] == seen[b], (scope, a, b, seen)
  for a, b in apart:
    assert not seen[a] & seen[b], (scope, a, b, seen)


# Seconds from Ctrl-C to the end of a pytest run on warm clusters, at most:
# the test's cluster is killed at once (`_warm.KILL_WAIT`, 10 s, at most;
# about 1 s measured), then every other at the session's end (the same), and
# pytest reports the interruption and exits.
CTRL_C_BOUND = 30.0

# pytest with SIGINT at its default: a background job of a non-interactive
# shell (`bash tests/envs.sh &`, a CI runner's) starts with SIGINT ignored,
# and a process started from it inherits that across exec; a terminal's
# Ctrl-C reaches a foreground pytest whose SIGINT raises KeyboardInterrupt.
_PYTEST_WITH_CTRL_C = ("import signal, sys; "
                       "signal.signal(signal.SIGINT, signal.default_int_handler); "
                       "import pytest; sys.exit(pytest.main(sys.argv[1:]))")


def _descendants(pid):
  """The processes under `pid`, by pid: their command lines."""
  children = {}
  for name in os.listdir("/proc"):
    if not name.isdecimal():
      continue
    try:
      with open(f"/proc/{name}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{name}/cmdline", "rb") as f:
        command = f.read().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError, ValueError):
      continue
    children.setdefault(parent, []).append((int(name), command))
  found, todo = {}, [pid]
  while todo:
    for child, command in children.get(todo.pop(), []):
      found[child] = command
      todo.append(child)
  return found


@pytest.mark.parametrize("when", ["a body runs", "the cluster starts"])
def test_ctrl_c_leaves_no_client_behind(tmp_path, when):
  """SIGINT to pytest while a body runs on a warm cluster (one before it
  made the cluster warm), or while a cluster's clients start: pytest ends
  within CTRL_C_BOUND, and every client with it."""
  started = tmp_path / "started"
  test = tmp_path / "test_interrupted.py"
  test.write_text(
      "import os, time\n"
      "from jdtensor.testing import multi_client\n"
      "@multi_client(num_clients=2)\n"
      "def test_warms():\n"
      "  print(f'WARM warm {os.getpid()}', flush=True)\n"
      "@multi_client(num_clients=2)\n"
      "def test_interrupted():\n"
      "  print(f'WARM interrupted {os.getpid()}', flush=True)\n"
      f"  open({str(started)!r} + str(os.getpid()), 'w').close()\n"
      "  time.sleep(120)\n")
  proc = subprocess.Popen(
      [sys.executable, "-c", _PYTEST_WITH_CTRL_C, "-q", "-s", "-p", "no:cacheprovider",
       str(test)],
      cwd=REPO, env=clean_env(**TEST_TIMEOUTS), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True, start_new_session=True)
  clients = set()
  try:
    deadline = time.monotonic() + 120
    while True:
      assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
      under = _descendants(proc.pid)
      clients |= {p for p, command in under.items() if "jdtensor.testing._client" in command}
      if when == "the cluster starts" and clients:
        break
      if when == "a body runs" and len(list(tmp_path.glob("started*"))) == 2:
        break
      time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    out, _ = proc.communicate(timeout=CTRL_C_BOUND)
    took = time.monotonic() - interrupted
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()
  print(f"pytest ended {took:.1f} s after SIGINT ({when})")
  assert took < CTRL_C_BOUND, out
  if when == "a body runs":
    pids = set().union(*clients_of(out).values())
    assert len(pids) == 2, out  # Both tests on one cluster.
    clients |= pids
  assert clients, out
  deadline = time.monotonic() + 10
  while [p for p in clients if pid_alive(p)] and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not [p for p in clients if pid_alive(p)], out
  assert "KeyboardInterrupt" in out or "Interrupted" in out, out


def test_xdist_workers_keep_their_own_clusters():
  pytest.importorskip("xdist")
  code, outcomes, out = run_pytest(
      os.path.join(HERE, "clients", "multi_client_examples.py"), "-s", "-n", "2",
      "-k", "psum_4x2 or parameters or returns_each or marker_form", timeout=300)
  assert outcomes and all(o[0] == "passed" for o in outcomes.values()), out
  assert code == 0, out
