"""`jdtensor launch` on several nodes (two launchers on loopback), restarts,
and the demo resuming from its checkpoint after a SIGKILL.

Across two network-namespace hosts: tests/multihost/test_netns.py.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from jdtensor import _trace

from tests.helpers import REPO, TEST_TIMEOUTS, clean_env, free_port, pid_alive
from jdtensor.launcher.processes import stop_process_groups

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "failure_client.py")
SECRET = "nodes test secret " + "x" * 16


class Launchers:
  """`jdtensor launch` processes, one per node, read as their output comes."""

  def __init__(self, argv_per_node, prefixes=None, **env):
    self.procs = [subprocess.Popen(
        [*(prefixes[r] if prefixes else []), sys.executable, "-m", "jdtensor",
         "launch", *argv], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=clean_env(**{**TEST_TIMEOUTS, "JDTENSOR_RUN_SECRET": SECRET, **env}))
        for r, argv in enumerate(argv_per_node)]
    self.out = ["" for _ in self.procs]
    self.ended: dict[int, float] = {}
    self._threads = [threading.Thread(target=self._read, args=(i,), daemon=True)
                     for i in range(len(self.procs))]
    for t in self._threads:
      t.start()

  def _read(self, i):
    for line in iter(self.procs[i].stdout.readline, ""):
      self.out[i] += line
    self.ended[i] = time.monotonic()

  def wait_for(self, pattern, node, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      match = re.search(pattern, self.out[node], re.M)
      if match:
        return match
      time.sleep(0.05)
    raise AssertionError(f"{pattern!r} not seen on node {node}:\n{self.out[node]}")

  def finish(self, timeout):
    deadline = time.monotonic() + timeout
    try:
      for proc in self.procs:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      raise AssertionError(f"launchers exceeded {timeout} s: {self.out}") from None
    finally:
      stop_process_groups(self.procs, grace=3)
      for t in self._threads:
        t.join(timeout=5)
    return [p.returncode for p in self.procs]


def nodes_argv(nnodes, per_node, devices, *extra, coordinator=None):
  coordinator = coordinator or f"127.0.0.1:{free_port()}"
  return [["--nnodes", str(nnodes), "--node-rank", str(r), "--coordinator",
           coordinator, "-n", str(per_node), "--devices-per-client", str(devices),
           "--timeout", "120", "--grace", "3", *extra, "--", sys.executable, CLIENT]
          for r in range(nnodes)]


def test_two_launchers_make_one_cluster_with_a_cross_node_psum():
  run = Launchers(nodes_argv(2, 2, 2), SCENARIO="none", STEPS="5")
  codes = run.finish(180)
  assert codes == [0, 0], run.out
  # failure_client checks every psum over all 8 devices (2 nodes x 2 x 2).
  assert sorted(re.findall(r"^\[client (\d)\] DONE$", run.out[0], re.M)) == ["0", "1"]
  assert sorted(re.findall(r"^\[client (\d)\] DONE$", run.out[1], re.M)) == ["2", "3"]


def test_each_nodes_trace_and_jdtensor_trace_make_one_picture(tmp_path):
  """Two nodes, each launcher in a pid namespace of its own (a container:
  both launchers pid 1, their clients one pid), each with the same
  `--trace run.json` (one command on every node, as srun runs it; here one
  file system): node 0 writes run.json, node 1 run.node1.json beside it and
  says how to merge them; `jdtensor trace` of the two gives one trace with a
  track for every launcher and client, each with its own slices, the
  clients on client 0's clock."""
  import json  # pylint: disable=g-import-not-at-top
  from jdtensor import _trace  # pylint: disable=g-import-not-at-top
  prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
  if subprocess.run([*prefix, "true"], capture_output=True, timeout=10,
                    check=False).returncode:
    pytest.skip("needs pid namespaces (root and unshare) to start launchers as pid 1")
  given = str(tmp_path / "run.json")
  argv = nodes_argv(2, 1, 1)
  for r in range(2):
    argv[r][-3:-3] = ["--trace", given]
  run = Launchers(argv, prefixes=[prefix, prefix], SCENARIO="none", STEPS="5",
                  JDTENSOR_HEARTBEAT_PERIOD="0.2")
  assert run.finish(180) == [0, 0], run.out
  paths = [given, str(tmp_path / "run.node1.json")]
  assert re.search(rf"^jdtensor launch: trace of the run in {re.escape(given)} \(",
                   run.out[0], re.M), run.out[0]
  assert (f"jdtensor launch: trace of node 1's part of the run in {paths[1]} (" in
          run.out[1]), run.out[1]
  assert (f"), beside node 0's {given}; one trace of every node: jdtensor trace {given} "
          f"{tmp_path / 'run.node*.json'} -o {tmp_path / 'run.all.json'}\n" in
          run.out[1]), run.out[1]
  merged = str(tmp_path / "run.json")
  out = subprocess.run([sys.executable, "-m", "jdtensor", "trace", *paths, "-o", merged],
                       cwd=REPO, capture_output=True, text=True, timeout=60,
                       env=clean_env(), check=False)
  assert out.returncode == 0, out.stderr
  with open(merged, encoding="utf-8") as f:
    trace = json.load(f)
  assert _trace.problems(trace) == []
  names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
           if e["ph"] == "M" and e["name"] == "process_name"}
  clients = sorted(n for n in names.values() if n.startswith("client "))
  assert sorted(set(names.values()) - set(clients)) == [
      "jdtensor launch (node 0, pid 1)", "jdtensor launch (node 1, pid 1)"], names
  pids = [re.fullmatch(rf"client {c} \(.+, pid (\d+)\)", n).group(1)
          for c, n in enumerate(clients)]
  assert len(pids) == 2 and pids[0] == pids[1], names  # The same pid, two tracks.
  for track, name in names.items():
    if name.startswith("client "):
      assert any(e["ph"] == "B" and e["pid"] == track for e in trace["traceEvents"]), name
  meta = [m for m in _trace.track_metadata(trace["traceEvents"]).values() if "client" in m]
  assert len(meta) == 2 and all(abs(m["clock_offset_s"]) < 0.05 for m in meta), meta
  assert len(trace["metadata"]["jdtensor"]["residuals_s"]) == 2


def test_a_failure_on_node_1_stops_node_0_within_seconds_naming_it():
  run = Launchers(nodes_argv(2, 2, 1), SCENARIO="exception",
                  CULPRIT="2", STEPS="200")
  stamp = float(run.wait_for(r"^\[client 2\] MISBEHAVING ([\d.]+)$", 1, 120).group(1))
  codes = run.finish(60)
  assert codes == [1, 1], run.out
  lines = [[l for l in out.splitlines() if l.startswith("jdtensor launch")]
           for out in run.out]
  why = r"ZeroDivisionError: division by zero \(failure_client\.py:\d+ in misbehave\)"
  assert re.match(rf"jdtensor launch \(node 0\): client 2 exited with code 1: {why} "
                  r"\(on node 1\); stopped clients ", lines[0][0]), run.out[0]
  assert re.match(rf"jdtensor launch \(node 1\): client 2 exited with code 1: {why}; "
                  r"stopped clients ", lines[1][0]), run.out[1]
  # Node 0's clients stopped within seconds of the failure on node 1.
  assert time.time() - stamp < 30
  ends = [m for m in re.findall(r"^\[client [01]\] heartbeat: client 2 failed: "
                                r"ZeroDivisionError", run.out[0], re.M)]
  assert len(ends) == 2, run.out[0]


@pytest.mark.parametrize("victim", [1, 0])
def test_a_node_whose_launcher_is_killed_stops_the_others_naming_it(victim):
  other = 1 - victim
  run = Launchers(nodes_argv(2, 1, 1), SCENARIO="none", STEPS="2000")
  run.wait_for(r"^\[client 1\] ATTEMPT", 1, 120)
  time.sleep(4)  # In its steps by now.
  killed = time.monotonic()
  os.kill(run.procs[victim].pid, signal.SIGKILL)  # Its clients die with it.
  codes = run.finish(60)
  assert codes[victim] == -signal.SIGKILL and codes[other] not in (0, None), run.out
  assert run.ended[other] - killed < 15, run.out[other]
  lines = [l for l in run.out[other].splitlines() if l.startswith("jdtensor launch")]
  assert lines == [f"jdtensor launch (node {other}): node {victim}'s launcher is gone "
                   "(connection closed)."], run.out[other]


def test_max_restarts_starts_the_group_again_with_a_new_restart_count():
  run = Launchers(nodes_argv(2, 2, 1, "--max-restarts", "1"), SCENARIO="exception",
                  CULPRIT="2", SCENARIO_ON_ATTEMPT="0", STEPS="5")
  codes = run.finish(240)
  assert codes == [0, 0], run.out
  for node, clients in ((0, "01"), (1, "23")):
    out = run.out[node]
    assert (f"jdtensor launch (node {node}): restarting the group (1 of 1) after: "
            f"client 2 exited with code 1") in out, out
    for c in clients:
      assert re.search(rf"^\[client {c}\] ATTEMPT 0$", out, re.M), out
      assert re.search(rf"^\[client {c}\] ATTEMPT 1$", out, re.M), out
      assert re.search(rf"^\[client {c}\] DONE$", out, re.M), out


def test_one_node_restarts_too():
  run = Launchers([["-n", "2", "--max-restarts", "2", "--timeout", "120", "--",
                    sys.executable, CLIENT]], SCENARIO="exit3", CULPRIT="1",
                  SCENARIO_ON_ATTEMPT="0", STEPS="5")
  codes = run.finish(180)
  assert codes == [0], run.out
  # Why restarts compile again (a CPU run), then one line per restart, with
  # the attempt's whole summary and how long it ran, then where each client
  # was at the verdict (client 0's heartbeat named client 1's early exit),
  # and at the end the restart's time to recovery; nothing else.
  lines = re.findall(r"^(?:jdtensor launch: |  clients? ).*$", run.out[0], re.M)
  assert len(lines) == 6, run.out[0]
  assert lines[0].startswith("jdtensor launch: restarts compile every program again "
                             "on CPU: "), lines
  assert re.fullmatch(r"jdtensor launch: restarting \(1 of 2\) after: client 1 "
                      r"exited with code 3; stopped clients .*; attempt 1 ran "
                      r"\d+\.\d s", lines[1]), lines
  assert lines[2] == "jdtensor launch: main threads when the verdict was named:", lines
  assert sorted(l.split(":")[0] for l in lines[3:5]) == ["  client 0", "  client 1"], lines
  assert re.fullmatch(r"jdtensor launch: time to recovery: restart 1 after client 1's "
                      r"failure: \d+\.\d s to start again \(call jdtensor.step_done\(\) "
                      r"after each step for the time to the first step\)", lines[5]), lines


def test_a_node_that_never_comes_is_named_after_the_timeout():
  argv = nodes_argv(3, 1, 1)
  for a in argv:
    a[a.index("--timeout") + 1] = "3"
  run = Launchers(argv[:2], SCENARIO="none", STEPS="2")  # Node 2 never starts.
  codes = run.finish(60)
  assert codes[0] == 2, run.out
  coordinator = argv[0][argv[0].index("--coordinator") + 1]
  assert (f"jdtensor launch (node 0): node(s) 2 did not join at {coordinator} "
          "within 3 s (--timeout)") in run.out[0]
  assert codes[1] == 2 and "node 0: node(s) 2 did not join" in run.out[1], run.out[1]


def test_a_node_with_the_wrong_secret_is_refused():
  argv = nodes_argv(2, 1, 1)
  for a in argv:
    a[a.index("--timeout") + 1] = "4"
  good = Launchers(argv[:1], SCENARIO="none", STEPS="2")
  time.sleep(0.5)
  bad = Launchers(argv[1:], SCENARIO="none", STEPS="2",
                  JDTENSOR_RUN_SECRET="another secret " + "y" * 16)
  assert good.finish(60) == [2]
  assert bad.finish(60) == [2]
  assert "refused a connection from 127.0.0.1: wrong or missing JDTENSOR_RUN_SECRET" in (
      good.out[0])
  assert "jdtensor launch (node 1): " in bad.out[0]


def test_two_nodes_on_one_address_with_the_same_port_get_a_clear_error():
  port = free_port()
  argv = nodes_argv(2, 1, 1, "--port", str(port))
  run = Launchers(argv, SCENARIO="none", STEPS="2")
  assert run.finish(60) == [2, 2], run.out
  problem = ("the nodes' clients would not have distinct addresses: "
             f"DTENSOR_JOBS='127.0.0.1:{port},127.0.0.1:{port}'")
  assert f"jdtensor launch (node 0): {problem}" in run.out[0], run.out[0]
  assert f"jdtensor launch (node 1): node 0: {problem}" in run.out[1], run.out[1]
  assert "Traceback" not in run.out[0] + run.out[1]


def test_the_demo_resumes_from_its_checkpoint_after_a_sigkill(tmp_path):
  checkpoint = tmp_path / "ckpt"
  proc = subprocess.Popen(
      [sys.executable, "-m", "jdtensor", "demo", "--steps", "30", "--checkpoint",
       str(checkpoint), "--max-restarts", "1", "--step-delay", "0.1",
       "--timeout", "240"], cwd=REPO, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True, start_new_session=True,
      env=clean_env(**TEST_TIMEOUTS))
  out, victim = [], None
  # The reads below block; this deadline ends them (EOF) even if nothing prints.
  guard = threading.Timer(270, stop_process_groups, ([proc],), {"grace": 3})
  guard.start()
  try:
    for line in iter(proc.stdout.readline, ""):
      out.append(line)
      if victim is None and line.startswith("[client 1] checkpoint step 6"):
        victim = int(next(l for l in out if l.startswith("[client 1] pid ")).split()[-1])
        os.kill(victim, signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    guard.cancel()
    stop_process_groups([proc], grace=3)
  text = "".join(out)
  assert proc.returncode == 0 and text.rstrip().endswith("OK"), text
  assert victim is not None and not pid_alive(victim)
  assert "jdtensor launch: restarting (1 of 1) after: client 1 was killed by SIGKILL" in text
  # The demo says when each step is done: the restart's whole time to recovery.
  assert re.search(r"^jdtensor launch: time to recovery: restart 1 after client 1's "
                   r"failure: \d+\.\d s \(\d+\.\d s to start again, \d+\.\d s to the "
                   r"first step\)$", text, re.M), text
  resumed = {int(m) for m in re.findall(r"^\[client \d\] resumed from step (\d+)$",
                                        text, re.M)}
  # Client 1 saved step 6, so every client took part in step 6 and had saved
  # step 5 first; step 6 itself may not be on every client's disk (the others
  # can be stopped between the step and its save): the common step is 5 or 6.
  assert len(resumed) == 1 and next(iter(resumed)) in (5, 6), text
  assert len(re.findall(r"\(resumed at step \d+\)$", text, re.M)) == 4, text
  assert len(re.findall(r"single-device loss\| = .*: OK$", text, re.M)) == 4, text

  # The same command again on the same folder: every step is saved, so there
  # is nothing left to train, and that is a success, not a crash to restart.
  again = subprocess.run(
      [sys.executable, "-m", "jdtensor", "demo", "--steps", "30", "--checkpoint",
       str(checkpoint), "--max-restarts", "1", "--timeout", "120"], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=150,
      env=clean_env(**TEST_TIMEOUTS))
  text = again.stdout
  assert again.returncode == 0 and text.rstrip().endswith("OK"), text
  assert len(re.findall(r"^\[client \d\] nothing left to train \(resumed at step "
                        r"30\)$", text, re.M)) == 4, text
  assert "restarting" not in text and "Traceback" not in text, text
