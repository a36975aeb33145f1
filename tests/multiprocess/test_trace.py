"""``jdtensor launch --trace FILE`` as a user runs it: 4 clients with a
set-up, a straggler and a stall, one trace that follows the trace-event
format, each client on its own track with its phases, the verdict on every
track at the time it was said, the launcher's summary on its own track at
the time it was printed, and the clocks within the stated residual
(clients/trace_client.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jdtensor import _trace
from jdtensor.launcher import free_ports
from tests.helpers import REPO, clean_env, cluster_env, finish, pid_alive, run_python

CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "trace_client.py")
PERIOD = 0.2


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
  """One traced run: (the trace, the launcher's stderr, the clients' stdout)."""
  path = tmp_path_factory.mktemp("trace") / "run.json"
  result = run_python(f"""
      import sys
      from jdtensor import cli
      sys.exit(cli.main(["launch", "-n", "4", "--timeout", "90", "--grace", "3",
                         "--trace", {str(path)!r}, "--", sys.executable, {CLIENT!r}]))
      """, env=clean_env(JDTENSOR_HEARTBEAT_PERIOD=str(PERIOD), JDTENSOR_STALL_TIMEOUT="3",
                         JDTENSOR_STRAGGLER_WINDOW="2", SETUP_SECONDS="1", STEPS="25",
                         SLOW_SECONDS="0.15", STALLER="2", LATE_BARRIER="1.5"),
      timeout=150)
  assert result.returncode == 70, result.stderr  # Client 2's stall.
  return json.loads(path.read_text()), result.stderr, result.stdout


def _tracks(trace):
  """pid -> (track name, the jdtensor metadata of a client's track)."""
  names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
           if e["ph"] == "M" and e["name"] == "process_name"}
  meta = {pid: m for pid, m in _trace.track_metadata(trace["traceEvents"]).items()
          if "client" in m}
  return names, meta


def test_the_trace_follows_the_format_and_has_a_track_per_client(traced):
  trace, err, _ = traced
  # Strictly: a tid on every event, metadata only under the format's names.
  assert _trace.problems(trace) == []
  assert all("tid" in e for e in trace["traceEvents"])
  assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "M"} == {
      "process_name", "process_sort_index", "thread_name", "process_labels"}
  names, meta = _tracks(trace)
  clients = {m["client"]: pid for pid, m in meta.items()}
  assert sorted(clients) == [0, 1, 2, 3]
  for client, pid in clients.items():
    assert re.fullmatch(rf"client {client} \(.+, pid {pid}\)", names[pid]), names
  launcher = [n for n in names.values() if n.startswith("jdtensor launch (node 0, pid ")]
  assert len(launcher) == 1, names
  assert re.search(r"jdtensor launch: trace of the run in .*run\.json \([\d,]+ events, "
                   r"4 client track\(s\); open it in https://ui\.perfetto\.dev", err), err
  for m in meta.values():  # Who each client is, and its clock, in its metadata.
    assert set(m) == {"client", "host", "pid", "restart", "clock_offset_s",
                      "clock_residual_s"}, m


def test_the_launcher_says_first_where_the_traces_parts_are_kept(traced):
  """So that after a SIGKILLed launcher they can be found and merged; at the
  end they are gone (merged into the trace)."""
  _, err, _ = traced
  first = err.splitlines()[0]
  parts = re.fullmatch(r"jdtensor launch: the trace's parts are in (\S+) until the run ends "
                       r"\(should this launcher be killed before, merge them with: jdtensor "
                       r"trace (\S+)\)", first)
  assert parts is not None and parts.group(1) == parts.group(2), err
  assert os.path.basename(parts.group(1)).startswith("jdtensor-trace-")
  assert not os.path.exists(parts.group(1))


def test_each_client_shows_its_phases(traced):
  trace, _, _ = traced
  names, meta = _tracks(trace)
  pids = {m["client"]: pid for pid, m in meta.items()}
  phases = {c: [e["name"] for e in trace["traceEvents"] if e["ph"] == "B" and e["pid"] == p]
            for c, p in pids.items()}
  for client, seen in phases.items():
    assert seen[0] == "set-up", (client, seen)  # Before its first collective.
    assert "in a collective" in seen, (client, seen)
    # Waiting 1.5 s at the start barrier for client 1, which was not.
    assert ("at a service wait" in seen) == (client != 1), (client, seen)
  assert phases[2][-1] == "own code", phases[2]  # Its stall, to its end.
  for client in (0, 1, 3):
    assert phases[client][-1] == "in a collective", phases  # Waiting for client 2.


def test_the_verdict_is_on_every_track_when_it_was_said_and_the_summary_when_printed(traced):
  trace, err, out = traced
  names, meta = _tracks(trace)
  pids = {m["client"]: pid for pid, m in meta.items()}
  events = trace["traceEvents"]
  verdicts = {e["pid"]: e for e in events if e["ph"] == "i" and e["name"] == "verdict"}
  assert sorted(verdicts) == sorted(pids.values())
  for e in verdicts.values():
    assert e["args"]["text"].startswith("heartbeat: client 2 stalled: main thread in "
                                        "trace_client.py:"), e
  summary = next(line for line in err.splitlines()
                 if line.startswith("jdtensor launch: client 2 exited with code 70"))
  (printed,) = [e for e in events if e["ph"] == "i" and e.get("args", {}).get("text") == summary]
  assert printed["s"] == "g"  # A line across the whole picture.
  said = [e["ts"] for e in verdicts.values()]
  assert max(said) <= printed["ts"] <= max(said) + 10e6
  # The stall began when the client said so, on client 0's clock: its
  # "own code" slice (the track's last: under load a step's own code can
  # outlast a beat and have a slice of its own before it) starts within a
  # beat or two of it.
  stalling = float(re.search(r"\[client 2\] STALLING ([\d.]+)", out).group(1))
  start = [e["ts"] for e in events if e["ph"] == "B" and e["pid"] == pids[2]
           and e["name"] == "own code"][-1]
  assert abs(start / 1e6 - stalling) < 3 * PERIOD + 0.2, (start, stalling)
  # Each client's end, on its own track, as the launcher saw it.
  ends = {e["pid"]: e["name"] for e in events if e["ph"] == "i" and e["name"].startswith("client ")
          and "exited" in e["name"]}
  assert ends[pids[2]] == "client 2 exited (code 70)"
  assert all(ends[pids[c]] == f"client {c} exited (code 75)" for c in (0, 1, 3)), ends


def test_stragglers_are_on_the_tracks_and_the_clocks_within_the_residual(traced):
  trace, _, _ = traced
  names, meta = _tracks(trace)
  stragglers = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "straggler"]
  assert any(e["args"]["text"].startswith("heartbeat: client 3 is a straggler")
             for e in stragglers), stragglers
  residuals = trace["metadata"]["jdtensor"]["residuals_s"]
  assert len(residuals) == 4 and all(r is not None and 0 <= r < 0.05
                                     for r in residuals.values()), residuals
  assert all(abs(m["clock_offset_s"]) < 0.05 for m in meta.values())  # One host.
  counters = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
  assert counters == {"cpu %", "rss MiB"}


@pytest.mark.parametrize("given,said", [
    ("{tmp}/no/run.json", "--trace {tmp}/no/run.json: cannot write the trace there: its "
     "folder {tmp}/no does not exist; create it first."),
    ("", "--trace '': the file name is empty; give the file the run's trace goes to, e.g. "
     "--trace run.json"),
    ("{tmp}", "--trace {tmp}: cannot write the trace there: {tmp} is a directory; give a "
     "file name (e.g. {tmp}/run.json)."),
    ("{tmp}/new/", "--trace {tmp}/new/: cannot write the trace there: {tmp}/new/ names a "
     "folder; give a file name (e.g. {tmp}/new/run.json)."),
    # A pipe here: never a device (/dev/null), which a regression would replace.
    ("{tmp}/pipe", "--trace {tmp}/pipe: cannot write the trace there: {tmp}/pipe is not a "
     "regular file; give the name of a file."),
], ids=["missing-folder", "empty", "a-directory", "a-folder-name", "not-a-regular-file"])
def test_a_trace_where_it_cannot_be_written_is_refused_before_any_client_starts(
    tmp_path, given, said):
  """Exit 2 and one line, and no client started."""
  os.mkfifo(tmp_path / "pipe")
  given, said = given.format(tmp=tmp_path), said.format(tmp=tmp_path)
  result = run_python(f"""
      import sys
      from jdtensor import cli
      sys.exit(cli.main(["launch", "-n", "2", "--trace", {given!r},
                         "--", sys.executable, "-c", "print('STARTED')"]))
      """, env=clean_env(), timeout=60)
  assert result.returncode == 2, result.stderr
  assert "STARTED" not in result.stdout
  assert result.stderr == f"jdtensor launch: {said}\n"


def test_the_demo_refuses_an_empty_trace_name_before_it_starts():
  result = run_python("""
      import sys
      from jdtensor import cli
      sys.exit(cli.main(["demo", "--steps", "1", "--trace", ""]))
      """, env=clean_env(), timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stdout == ""
  assert result.stderr == ("jdtensor demo: --trace '': the file name is empty; give the "
                           "file the run's trace goes to, e.g. --trace run.json\n")


def _own_pid_namespace() -> list[str]:
  """The command prefix that starts a process as pid 1 of a pid namespace of
  its own, as a container's first process is (skips where it cannot)."""
  import shutil  # pylint: disable=g-import-not-at-top
  prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
  if shutil.which("unshare") is None or subprocess.run(
      [*prefix, "true"], capture_output=True, timeout=10, check=False).returncode != 0:
    pytest.skip("needs pid namespaces (root and unshare) to start clients as pid 1")
  return prefix


@pytest.mark.parametrize("containers", [False, True], ids=["one-host", "pid-1-each"])
def test_clients_under_an_engine_write_files_that_jdtensor_trace_merges(tmp_path,
                                                                       containers):
  """Under mpirun or srun there is no launcher: each client started with
  JDTENSOR_TRACE_DIR writes its own file, and `jdtensor trace DIR` makes one
  trace of them (here two clients started by hand). In containers (a pid
  namespace each, as Kubernetes starts them) both clients are pid 1: each
  still has a track of its own."""
  prefix = _own_pid_namespace() if containers else []
  jobs = [f"localhost:{p}" for p in free_ports(2)]
  procs = [subprocess.Popen(
      [*prefix, sys.executable, CLIENT], env=cluster_env(
          jobs, c, JDTENSOR_TRACE_DIR=str(tmp_path), JDTENSOR_HEARTBEAT_PERIOD="0.2",
          SETUP_SECONDS="0.5", STEPS="10", SLOW_SECONDS="0"),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
      for c in range(2)]
  results = finish(procs, timeout=90)
  assert [r.returncode for r in results] == [0, 0], results
  if containers:
    assert sorted(os.listdir(tmp_path)) == ["client-0-1.json", "client-1-1.json"]
  result = run_python(f"""
      import sys
      from jdtensor import cli
      sys.exit(cli.main(["trace", {str(tmp_path)!r}, "-o", {str(tmp_path / "run.json")!r}]))
      """, env=clean_env(), timeout=60)
  assert result.returncode == 0, result.stderr
  assert re.fullmatch(rf"jdtensor trace: {re.escape(str(tmp_path / 'run.json'))} \([\d,]+ "
                      r"events from 2 file\(s\)\)\n", result.stdout)
  trace = json.loads((tmp_path / "run.json").read_text())
  assert _trace.problems(trace) == []
  names, meta = _tracks(trace)
  assert sorted(m["client"] for m in meta.values()) == [0, 1]
  for pid, m in meta.items():  # Each client's track is named for it, with its slices.
    assert re.fullmatch(rf"client {m['client']} \(.+, pid {m['pid']}\)", names[pid])
    assert any(e["ph"] == "B" and e["pid"] == pid and e["name"] == "set-up"
               for e in trace["traceEvents"])
  assert len(trace["metadata"]["jdtensor"]["residuals_s"]) == 2


def _fails_on_client_1():
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 1:
    raise ValueError("client 1's assertion")


def test_a_failing_multi_client_test_leaves_its_trace_where_asked(tmp_path, monkeypatch):
  """`jdtensor.testing` with JDTENSOR_TRACE_DIR set: a failing run's trace is
  kept there, named after the test, and the failure says where; a passing
  run's is not kept."""
  from jdtensor import testing  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("JDTENSOR_TRACE_DIR", str(tmp_path))
  with pytest.raises(testing.MultiClientTestError) as failed:
    testing.run_in_multi_client(_fails_on_client_1, num_clients=2, fresh=True, timeout=60)
  kept = re.search(r"\(trace of the failed run: (.+\.json)\)$", str(failed.value)).group(1)
  assert os.path.dirname(kept) == str(tmp_path)
  assert os.path.basename(kept).startswith("_fails_on_client_1-")
  trace = json.loads(open(kept).read())
  assert _trace.problems(trace) == []
  assert sorted(m["client"] for m in _tracks(trace)[1].values()) == [0, 1]
  testing.run_in_multi_client(lambda: None, num_clients=2, fresh=True, timeout=60)
  assert os.listdir(tmp_path) == [os.path.basename(kept)]


def test_a_restart_shows_as_new_tracks_after_the_restart_line(tmp_path):
  path = tmp_path / "run.json"
  result = run_python(f"""
      import sys
      from jdtensor import cli
      sys.exit(cli.main(["launch", "-n", "2", "--timeout", "90", "--grace", "3",
                         "--max-restarts", "1", "--trace", {str(path)!r}, "--",
                         sys.executable, {CLIENT!r}]))
      """, env=clean_env(JDTENSOR_HEARTBEAT_PERIOD=str(PERIOD), SETUP_SECONDS="0.3",
                         STEPS="5", SLOW_SECONDS="0", FAIL_FIRST_ATTEMPT="1"), timeout=150)
  assert result.returncode == 0, result.stderr
  trace = json.loads(path.read_text())
  assert _trace.problems(trace) == []
  names, meta = _tracks(trace)
  attempts = sorted((m["restart"], m["client"]) for m in meta.values())
  assert attempts == [(0, 0), (0, 1), (1, 0), (1, 1)]
  events = trace["traceEvents"]
  (restart,) = [e for e in events if e["ph"] == "i"
                and e.get("args", {}).get("text", "").startswith("jdtensor launch: restarting (1 of 1)")]
  assert restart["s"] == "g"
  first = [p for p, m in meta.items() if m["restart"] == 0]
  second = [p for p, m in meta.items() if m["restart"] == 1]
  ends = {e["pid"]: e for e in events if e["ph"] == "i" and " exited " in e["name"]
          and e["pid"] in meta}
  assert all(ends[p]["ts"] <= restart["ts"] for p in first)
  assert all(ends[p]["name"].endswith("exited (code 0)") for p in second)
  starts = [e["ts"] for e in events if e["ph"] == "B" and e["pid"] in second]
  assert min(starts) >= restart["ts"]


def test_the_parts_a_killed_launcher_leaves_merge_with_its_own_file(tmp_path):
  """A SIGKILLed launcher never merges its trace: it said at its start where
  the parts are, and `jdtensor trace DIR` makes one trace of them, its own
  track (the launcher's lines) beside its clients'."""
  import shutil  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  proc = subprocess.Popen(
      [sys.executable, "-m", "jdtensor", "launch", "-n", "2", "--grace", "2", "--timeout",
       "120", "--trace", str(tmp_path / "run.json"), "--", sys.executable, CLIENT],
      env=clean_env(JDTENSOR_HEARTBEAT_PERIOD=str(PERIOD), SETUP_SECONDS="0.2",
                    STEPS="1000000", SLOW_SECONDS="0"),
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
      start_new_session=True)
  parts = None
  try:
    first = proc.stderr.readline()
    parts = re.fullmatch(r"jdtensor launch: the trace's parts are in (\S+) until the run "
                         r"ends \(should this launcher be killed before, merge them with: "
                         r"jdtensor trace \1\)\n", first)
    assert parts is not None, first
    folder = parts.group(1)
    rest = threading.Thread(target=proc.stderr.read, daemon=True)  # Never a full pipe.
    rest.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # Both clients in their step loop.
      files = [os.path.join(folder, f) for f in os.listdir(folder)
               if f.startswith("client-")]
      if len(files) == 2 and all('"in a collective"' in Path(f).read_text() for f in files):
        break
      time.sleep(0.1)
    else:
      raise AssertionError(f"the clients never reached their steps: {os.listdir(folder)}")
    proc.kill()
    proc.wait(timeout=10)
    # At once: a launch elsewhere (another test) may now remove a dead
    # launcher's folder.
    left = shutil.copytree(folder, tmp_path / "parts")
    clients = [int(re.fullmatch(r"client-\d+-(\d+)\.json", os.path.basename(f)).group(1))
               for f in files]
    gone_by = time.monotonic() + 10
    while any(pid_alive(p) for p in clients) and time.monotonic() < gone_by:
      time.sleep(0.05)
    assert not any(pid_alive(p) for p in clients)  # They died with their launcher.
    result = run_python(f"""
        import sys
        from jdtensor import cli
        sys.exit(cli.main(["trace", {str(left)!r}, "-o", {str(tmp_path / "left.json")!r}]))
        """, env=clean_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("events from 3 file(s))\n"), result.stdout
    trace = json.loads((tmp_path / "left.json").read_text())
    assert _trace.problems(trace) == []
    names, meta = _tracks(trace)
    assert sorted(m["client"] for m in meta.values()) == [0, 1]
    assert names[proc.pid] == f"jdtensor launch (node 0, pid {proc.pid})", names
    said = [e["args"]["text"] for e in trace["traceEvents"]
            if e["pid"] == proc.pid and e["ph"] == "i"]
    assert said and said[0].startswith("jdtensor launch: the trace's parts are in "), said
    assert not (tmp_path / "run.json").exists()  # Never merged by the launcher.
  finally:
    if proc.poll() is None:
      # The launcher alone: its clients' guardians then stop them (killing
      # its whole group at once can leave them without one).
      proc.kill()
      proc.wait(timeout=10)
    if parts is not None:
      shutil.rmtree(parts.group(1), ignore_errors=True)
