"""The files `jdtensor status` reads and what it prints (`jdtensor._status`):
the private runs directory, status requests, the table, the launcher's line
on uneven waiting. Pure: no process.

The multi-client test (real processes, `jdtensor launch`, `jdtensor status`)
is tests/multiprocess/test_status.py.
"""

import os
import stat

import pytest

from jdtensor import _status
from jdtensor.heartbeat.flight import AT_EXIT, IN_JAX, RUNNING, WAITING

W, R, J, X = WAITING, RUNNING, IN_JAX, AT_EXIT


@pytest.fixture
def runs_home(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
  return tmp_path / "jdtensor"


def test_runs_are_registered_in_a_private_directory_and_dead_ones_dropped(runs_home):
  path = _status.register_run({"pid": os.getpid(), "report_dir": "/x", "started": 1.0})
  assert stat.S_IMODE(os.stat(runs_home).st_mode) == 0o700
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
  dead = _status.register_run({"pid": 2**22 + 12345, "report_dir": "/y", "started": 0})
  assert [r["report_dir"] for r in _status.running_runs()] == ["/x"]
  assert not os.path.exists(dead)  # A launcher that was SIGKILLed left it.
  _status.unregister_run(path)
  assert _status.running_runs() == []


def test_a_directory_open_to_others_is_never_used(runs_home):
  runs_home.mkdir(mode=0o777)
  os.chmod(runs_home, 0o777)
  assert _status.register_run({"pid": os.getpid(), "report_dir": "/x"}) is None
  assert _status.running_runs() == []


def test_a_request_is_answered_for_a_while_then_not(tmp_path):
  assert not _status.status_requested(str(tmp_path))
  asked = _status.request_status(str(tmp_path))
  assert _status.status_requested(str(tmp_path))
  assert not _status.status_requested(str(tmp_path), now=asked + _status.REQUEST_SECONDS)


RUN = {"pid": 4242, "command": ["python", "train.py"], "num_clients": 4,
       "client_ids": [0, 1, 2, 3], "restarts": 0, "started": 1000.0}
VIEW = {"beats": 36, "phases": [W, W, W, R], "seconds": [0, 0, 1, 2],
        "busy": [3, 4, 3, 2], "moved": [0, 0, 0, 66_000],
        "waiting": [71.0, 70.0, 72.0, 0.0],
        "waited_for": [0.0, 0.0, 0.0, 71.0], "window": 60.0, "threshold": 30.0}


def test_the_status_table_one_row_per_client():
  statuses = {c: {**VIEW, "client": c, "where": f"train.py:{50 + c} step",
                  "rss_mib": 400.0 + c, "restarts": 0, "at": 1071.5} for c in (0, 1, 2)}
  statuses[3] = {**VIEW, "client": 3, "where": "data.py:88 next_batch <- train.py:49 main",
                 "rss_mib": 405.2, "restarts": 0, "at": 1071.0}
  text = _status.format_status(RUN, statuses, now=1072.0)
  lines = text.splitlines()
  assert lines[0].startswith("jdtensor launch (pid 4242): 4 client(s), `python train.py`, "
                             "up 1 min 12 s, restarts 0, at ")
  assert lines[2].split() == ["client", "phase", "for", "where", "(main", "thread)",
                              "CPU", "%", "I/O", "RSS", "beats", "restarts", "waiting",
                              "waited", "for"]
  assert lines[3].split() == ["0", "collective", "0.0", "s", "train.py:50", "step",
                              "3", "0", "B/s", "400", "MiB", "36", "0", "71%", "0%"]
  assert lines[6].split() == ["3", "own", "code", "2.0", "s", "data.py:88", "next_batch",
                              "<-", "train.py:49", "main", "2", "64.5", "KiB/s", "405",
                              "MiB", "36", "0", "0%", "71%"]
  assert lines[-1] == ("waiting: share of the last 60 s each client spent waiting in "
                       "collectives; waited for: share the others spent waiting for it "
                       "(straggler above 30%). Beat data 0.5 s old.")


def test_a_program_on_a_worker_thread_is_shown_with_the_threads_name():
  statuses = {c: {**VIEW, "client": c, "where": f"train.py:{50 + c} step",
                  "thread": "thread 'TrainingThread'", "rss_mib": 400.0, "restarts": 0,
                  "at": 1071.5} for c in range(4)}
  statuses[0]["thread"] = "main thread"
  lines = _status.format_status(RUN, statuses, now=1072.0).splitlines()
  assert lines[3].split()[4:6] == ["train.py:50", "step"]
  assert lines[4].split()[4:7] == ["train.py:51", "step", "(thread"]


def test_clients_on_other_nodes_come_from_the_merged_beat():
  statuses = {0: {**VIEW, "client": 0, "where": "train.py:50 step", "rss_mib": 400.0,
                  "at": 1071.5}}
  text = _status.format_status({**RUN, "client_ids": [0, 1]}, statuses, now=1072.0)
  row = text.splitlines()[5].split()
  assert row[:4] == ["2", "collective", "1.0", "s"] and "(on another node)" in text
  assert "no client has answered yet" in _status.format_status(RUN, {}, now=1072.0)


@pytest.mark.parametrize("shares,seconds,period,said", [
    ([1.0, 0.5, 2.0, 41.2], 300.4, 2.0, "jdtensor launch: the clients waited in "
     "collectives unevenly over the run (300 s): share of the run the others waited "
     "for each: client 3 41%, client 2 2%, client 0 1%, client 1 0%"),
    ([3.0, 2.0, 9.9], 10, 0.5, None),  # Even enough.
    ([0.0, 0.0, 0.0, 50.0], 0.0, 2.0, None),  # `jdtensor demo`: one beat.
    ([0.0, 50.0], 19.9, 2.0, None),  # Fewer than 10 beats.
    ([0.0, 50.0], 20.0, 2.0, "jdtensor launch: the clients waited in collectives "
     "unevenly over the run (20 s): share of the run the others waited for each: "
     "client 1 50%, client 0 0%"),
])
def test_the_launchers_line_on_uneven_waiting(shares, seconds, period, said):
  record = {"shares": shares, "seconds": seconds, "period": period}
  assert _status.wait_summary(record) == said


@pytest.mark.parametrize("record", [None, {"shares": "bad"},
                                    {"shares": [0.0, 50.0], "seconds": 99.0}])
def test_no_line_on_waiting_from_a_record_that_is_not_whole(record):
  assert _status.wait_summary(record) is None


def test_the_launcher_reads_the_lowest_clients_record_of_the_run(tmp_path):
  _status.write_waits(str(tmp_path), 10, [1.0, 2.0], 5.0, 0.5)
  _status.write_waits(str(tmp_path), 2, [3.0, 4.0], 6.0, 0.5)
  (tmp_path / "waits-x.json").write_text("{}")  # Not a client's: ignored.
  assert _status.read_waits(str(tmp_path)) == {"client": 2, "shares": [3.0, 4.0],
                                               "seconds": 6.0, "period": 0.5}
  assert _status.read_waits(str(tmp_path / "gone")) is None


def test_the_status_table_of_a_node_without_client_0():
  """On another node than client 0's, each client knows only its own state:
  the table shows those clients, and says where the rest is kept."""
  statuses = {c: {"client": c, "beats": 36, "period": 2.0,
                  "own": [R if c == 5 else W, 3 + c, 2, 5000],
                  "where": f"train.py:{50 + c} step", "rss_mib": 400.0, "restarts": 0,
                  "window": 60.0, "threshold": 30.0, "at": 1071.5} for c in (4, 5)}
  lines = _status.format_status({**RUN, "num_clients": 8}, statuses, now=1072.0).splitlines()
  assert lines[3].split() == ["4", "collective", "7.0", "s", "train.py:54", "step",
                              "2", "4.9", "KiB/s", "400", "MiB", "36", "0", "-", "-"]
  assert lines[4].split()[:4] == ["5", "own", "code", "8.0"]
  assert len(lines) == 8 and lines[-1].startswith("Only this node's clients: client 0")


@pytest.mark.parametrize("view, line", [
    ({}, ""),
    ({"stall_timeout": 0}, "Stall time-out: off (JDTENSOR_STALL_TIMEOUT=0)."),
    ({"stall_timeout": 300.0, "stall_learnt": False, "stall_ceiling": 300.0},
     "Stall time-out: 300 s (JDTENSOR_STALL_TIMEOUT; not learnt)."),
    ({"stall_timeout": 300.0, "stall_learnt": False, "stall_ceiling": 300.0,
      "stall_learn": True, "stall_rhythm": False, "stall_steps": 3,
      "stall_rhythm_steps": 10},
     "Stall time-out: 300 s (JDTENSOR_STALL_TIMEOUT: the run has not shown its rhythm "
     "yet, 3 of 10 steps)."),
    ({"stall_timeout": 300.0, "stall_learnt": False, "stall_ceiling": 300.0,
      "stall_learn": True, "stall_rhythm": True, "stall_steps": 30},
     "Stall time-out: 300 s (JDTENSOR_STALL_TIMEOUT: the pause in progress began "
     "before the run showed its rhythm)."),
    ({"stall_timeout": 30.0, "stall_learnt": True, "stall_longest": None,
      "stall_floor": 30.0, "stall_ceiling": 300.0},
     "Stall time-out: 30 s, learnt (no idle pause seen; floor 30 s, ceiling 300 s)."),
    ({"stall_timeout": 42.5, "stall_learnt": True, "stall_longest": 8.5,
      "stall_floor": 30.0, "stall_ceiling": 300.0},
     "Stall time-out: 42.5 s, learnt (longest idle pause 8.5 s; floor 30 s, ceiling 300 s)."),
], ids=["unknown", "off", "set", "no-rhythm", "early-pause", "learnt-floor", "learnt"])
def test_status_shows_the_stall_time_out_in_force(view, line):
  assert _status.stall_line(view) == line


DEAD_PID = 2**22 + 12345  # Above the kernel's pid_max: never a live process.


def test_a_dead_launchers_cache_and_trace_folders_go_with_its_next_launch(
    runs_home, tmp_path, monkeypatch):
  """The folders a launcher made for a run (compilation cache, trace parts)
  are recorded while they exist; when it was SIGKILLed, the next launch (or
  `jdtensor status`) removes them, as it does its report folder. A live
  launcher's are kept, and its own removal forgets the record."""
  import tempfile
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(tmp))
  cache = tempfile.mkdtemp(prefix="jdtensor-compile-cache-")
  parts = tempfile.mkdtemp(prefix="jdtensor-trace-")
  (tmp / os.path.basename(parts) / "client-0-7.json").write_text("{}")
  mine = tempfile.mkdtemp(prefix="jdtensor-trace-")
  record = _status.track_folder(mine)
  assert stat.S_IMODE(os.stat(record).st_mode) == 0o600
  assert _status.running_runs() == [] and os.path.isdir(mine)
  for folder in (cache, parts):  # What a SIGKILLed launcher's records say.
    (runs_home / f"folder-{DEAD_PID}-{os.path.basename(folder)}.json").write_text(
        f'{{"pid": {DEAD_PID}, "folder": "{folder}"}}')
  _status.running_runs()
  assert not os.path.exists(cache) and not os.path.exists(parts)
  assert os.path.isdir(mine)  # Its launcher (this process) runs.
  assert os.listdir(runs_home) == [os.path.basename(record)]
  _status.forget_folder(record)
  assert os.listdir(runs_home) == []


@pytest.mark.parametrize("where", ["outside the temporary directory", "not ours by name",
                                   "a link", "a file"])
def test_only_a_launchers_own_folders_are_ever_removed(runs_home, tmp_path, monkeypatch,
                                                       where):
  """A record that names anything but a launcher's own folder (under the
  temporary directory, one of its prefixes, a real folder of this user's:
  never a --trace path or the user's own cache) removes nothing."""
  import tempfile
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(tmp))
  users = tmp_path / "users-cache"
  users.mkdir()
  (users / "entry-cache").write_text("x")
  target = {"outside the temporary directory": tmp_path / "jdtensor-trace-x",
            "not ours by name": tmp / "my-compile-cache",
            "a link": tmp / "jdtensor-compile-cache-link",
            "a file": tmp / "jdtensor-trace-file"}[where]
  if where == "a link":
    target.symlink_to(users)
  elif where == "a file":
    target.write_text("x")
  else:
    target.mkdir()
    (target / "entry-cache").write_text("x")
  runs_home.mkdir(mode=0o700)
  (runs_home / f"folder-{DEAD_PID}-x.json").write_text(
      f'{{"pid": {DEAD_PID}, "folder": "{target}"}}')
  _status.running_runs()
  assert os.path.lexists(target) and (users / "entry-cache").exists()
  assert os.listdir(runs_home) == []  # The dead launcher's record goes.
