"""The trace format (`jdtensor._trace`): slices from a beat's samples,
counters written when they move, a killed process's slice closed at its end,
the format's rules, and the size of a long run."""

import json
import random
import sys
import threading
import time
from pathlib import Path

import pytest

from jdtensor import _trace


def _events(path):
  return list(_trace.read_events(str(path)))


def _file(tmp_path, name="client-1-11.json", **kw):
  return _trace.TraceFile(str(tmp_path / name), 11, "client 1 (host, pid 11)",
                          sort_index=1, **kw)


def test_a_phase_slice_starts_where_the_phase_began_not_at_the_beat_that_saw_it(tmp_path):
  out = _file(tmp_path)
  slices = _trace.PhaseSlices(out)
  slices.sample(100.0, "set-up", 3.0)  # Set up since 97.
  slices.sample(102.0, "set-up", 5.0)
  slices.sample(104.0, "in a collective", 0.5)  # Began at 103.5.
  slices.sample(106.0, "own code", 10.0)  # Longer than it can be: since the last beat.
  slices.end(107.0)
  out.close()
  be = [(e["ph"], e.get("name"), e["ts"] / 1e6) for e in _events(tmp_path / "client-1-11.json")
        if e["ph"] in "BE"]
  assert be == [("B", "set-up", 97.0), ("E", None, 103.5), ("B", "in a collective", 103.5),
                ("E", None, 104.0), ("B", "own code", 104.0), ("E", None, 107.0)]


def test_a_phase_between_two_beats_is_never_a_slice(tmp_path):
  """A 1 ms step loop: what the beats see is what is written, a few lines a
  beat at most."""
  out = _file(tmp_path)
  slices = _trace.PhaseSlices(out)
  for beat in range(1000):
    slices.sample(float(beat), "in a collective", 0.0005)  # Every beat the same.
  slices.end(1000.0)
  out.close()
  assert sum(e["ph"] in "BE" for e in _events(tmp_path / "client-1-11.json")) == 2


def test_counters_are_written_when_they_move(tmp_path):
  out = _file(tmp_path)
  slices = _trace.PhaseSlices(out)
  for t, cpu, rss in [(0, 3, 200), (1, 7, 200.5), (2, 12, 201), (3, 30, 230), (70, 30, 230)]:
    slices.counters(float(t), {"cpu %": cpu, "rss MiB": rss})
  out.close()
  got = [(e["ts"] / 1e6, e["args"]) for e in _events(tmp_path / "client-1-11.json")
         if e["ph"] == "C"]
  # CPU moves by 10 points at least, memory by 5% (10 MiB of 200): noise is
  # never a line; a minute without one writes both again.
  assert got == [(0.0, {"cpu %": 3}), (0.0, {"rss MiB": 200}), (3.0, {"cpu %": 30}),
                 (3.0, {"rss MiB": 230}), (70.0, {"cpu %": 30}), (70.0, {"rss MiB": 230})]


def test_timestamps_are_on_client_0s_clock(tmp_path):
  out = _file(tmp_path, offset=-2.5, metadata={"client": 1})
  out.labels("clock: client 0's", {"clock_offset_s": -2.5, "clock_residual_s": 0.001})
  out.instant("verdict", 100.0, {"text": "client 2 stalled"})
  out.close()
  events = _events(tmp_path / "client-1-11.json")
  assert [e["ts"] for e in events if e["ph"] == "i"] == [97.5e6]
  assert _trace.track_metadata(events) == {
      11: {"client": 1, "clock_offset_s": -2.5, "clock_residual_s": 0.001}}


def test_every_event_a_track_writes_follows_the_format_strictly(tmp_path):
  """A tid on every event (counters too), and metadata only under the
  format's names: jdtensor's own rides in their arguments."""
  out = _file(tmp_path, metadata={"client": 1, "host": "h", "pid": 11, "restart": 0})
  out.labels("clock: client 0's, within 0.10 ms",
             {"clock_offset_s": 0.0, "clock_residual_s": 0.0001})
  slices = _trace.PhaseSlices(out)
  slices.sample(10.0, "set-up", 1.0)
  slices.counters(10.0, {"cpu %": 50.0, "rss MiB": 100.0})
  out.instant("verdict", 11.0, {"text": "client 1 stalled"}, scope="g")
  slices.end(12.0)
  out.close()
  events = _events(tmp_path / "client-1-11.json")
  assert _trace.problems({"traceEvents": events}) == []
  assert all(e["tid"] == 1 for e in events)
  assert {e["name"] for e in events if e["ph"] == "M"} == {
      "process_name", "process_sort_index", "thread_name", "process_labels"}
  assert {e["ph"] for e in events} == {"M", "B", "E", "C", "i"}


def test_a_killed_clients_slice_ends_where_it_ended_and_a_cut_line_is_skipped(tmp_path):
  out = _file(tmp_path)
  slices = _trace.PhaseSlices(out)
  slices.sample(10.0, "own code", 1.0)
  out.close()  # Killed: no end.
  with open(tmp_path / "client-1-11.json", "a") as f:
    f.write('{"ph":"E","pid":11,')  # A line cut short by the kill.
  other = _trace.TraceFile(str(tmp_path / "client-2-12.json"), 12, "client 2")
  other.instant("verdict", 11.0)
  other.close()
  merged = tmp_path / "run.json"
  count = _trace.merge([str(tmp_path / "client-1-11.json"), str(tmp_path / "client-2-12.json")],
                       str(merged), {"jdtensor": {}}, ends={11: 12.5e6})
  trace = json.loads(merged.read_text())
  assert _trace.problems(trace) == []
  assert count == len(trace["traceEvents"])
  ends = [e for e in trace["traceEvents"] if e["ph"] == "E" and e["pid"] == 11]
  assert [e["ts"] for e in ends] == [12.5e6]


@pytest.mark.parametrize("events,problem", [
    ([{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 5}], "missing ['dur']"),
    ([{"ph": "E", "pid": 1, "tid": 1, "ts": 5}], "an end without a begin"),
    ([{"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 5}], "never ended"),
    ([{"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 5},
      {"ph": "E", "pid": 1, "tid": 1, "ts": 4}], "goes back in time"),
    ([{"ph": "C", "name": "c", "pid": 1, "tid": 1, "ts": 5, "args": {"x": "high"}}],
     "without numbers"),
    ([{"ph": "Q", "pid": 1}], "unknown phase"),
    ([{"ph": "C", "name": "c", "pid": 1, "ts": 5, "args": {"x": 1}}], "missing ['tid']"),
    ([{"ph": "i", "name": "v", "pid": 1, "ts": 5, "s": "p"}], "missing ['tid']"),
    ([{"ph": "M", "name": "jdtensor", "pid": 1, "tid": 1, "args": {"client": 0}}],
     "metadata named \"jdtensor\", not one the format defines"),
    ([{"ph": "M", "name": "process_name", "pid": 1, "tid": 1, "args": {}}],
     "process_name without its name (str)"),
    ([{"ph": "M", "name": "process_sort_index", "pid": 1, "tid": 1,
       "args": {"sort_index": "1"}}], "process_sort_index without its sort_index (int)"),
    ([{"ph": "i", "name": "v", "pid": 1, "tid": 1, "ts": 5, "s": "x"}], "scope \"x\""),
    ([{"ph": "B", "name": "a", "pid": 1, "tid": "main", "ts": 5}], "tid \"main\" is not"),
    ([{"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": "5"}], "ts \"5\" is not a number"),
    (["x"], "is not an object")])
def test_the_format_checker_finds_each_problem(events, problem):
  found = _trace.problems({"traceEvents": events})
  assert any(problem in p for p in found), found


def test_a_long_run_stays_small(tmp_path):
  """The documented bound: a client whose phase changes at every beat (the
  worst case) for an hour at the default period (2 s), with its counters
  moving each beat, writes under 400 KiB (316 measured): 32 clients under
  13 MB."""
  out = _file(tmp_path)
  slices = _trace.PhaseSlices(out)
  rng = random.Random(0)
  for beat in range(1800):
    at = 2.0 * beat
    slices.sample(at, ("own code", "in a collective")[beat % 2], 1.0)
    slices.counters(at, {"cpu %": rng.uniform(0, 100), "rss MiB": 2000 + beat})
  slices.end(3600.0)
  out.close()
  size = (tmp_path / "client-1-11.json").stat().st_size
  assert size < 400 * 1024, size


class _Client:
  """A coordination-service client whose barrier is a C call (as jaxlib's)."""
  wait_at_barrier = staticmethod(time.sleep)
  other_wait = staticmethod(time.sleep)


@pytest.mark.parametrize("method,expected", [("wait_at_barrier", True),
                                             ("other_wait", False)])
def test_a_wait_on_the_coordination_service_is_told_from_its_call_site(method, expected):
  """The trace's "at a service wait": the main thread's innermost Python
  frame is calling a service wait (`flight.at_service_wait`)."""
  from jdtensor.heartbeat import flight  # pylint: disable=g-import-not-at-top
  client = _Client()
  calls = {"wait_at_barrier": lambda: client.wait_at_barrier(1.0),
           "other_wait": lambda: client.other_wait(1.0)}
  waiter = threading.Thread(target=calls[method], daemon=True)
  waiter.start()
  time.sleep(0.2)
  frame = sys._current_frames()[waiter.ident]  # pylint: disable=protected-access
  assert flight.at_service_wait(frame) is expected
  assert flight.at_service_wait(None) is False
  waiter.join(5)


def _client(folder, client, pid, host, restart=0, killed=False):
  """A client's own file, as its heartbeat writes it: a set-up slice, its
  own code (left open where `killed`), a verdict."""
  out = _trace.TraceFile(str(folder / f"client-{client}-{pid}.json"), pid,
                         f"client {client} ({host}, pid {pid})", sort_index=client,
                         metadata={"client": client, "host": host, "pid": pid,
                                   "restart": restart, "clock_residual_s": 0.001 * pid})
  slices = _trace.PhaseSlices(out)
  slices.sample(10.0, "set-up", 1.0)
  slices.sample(12.0, "own code", 1.0)
  out.instant("verdict", 13.0, {"text": "client 1 stalled"})
  if not killed:
    slices.end(14.0)
  out.close()
  return out.path


def _tracks_of(trace):
  """track id -> its name."""
  return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
          if e["ph"] == "M" and e["name"] == "process_name"}


def test_clients_of_different_hosts_with_the_same_pid_keep_tracks_of_their_own(tmp_path):
  """Two containers' clients, both pid 1 (a Kubernetes pod's first process),
  and a third on a host of its own: three tracks, each with its own slices;
  the first keeps its pid, the others get ids above any pid."""
  paths = [_client(tmp_path, 0, 1, "pod-a"), _client(tmp_path, 1, 1, "pod-b"),
           _client(tmp_path, 2, 7, "pod-c")]
  merged = tmp_path / "run.json"
  _trace.merge(paths, str(merged), {})
  trace = json.loads(merged.read_text())
  assert _trace.problems(trace) == []
  tracks = _tracks_of(trace)
  assert sorted(tracks.values()) == ["client 0 (pod-a, pid 1)", "client 1 (pod-b, pid 1)",
                                     "client 2 (pod-c, pid 7)"]
  by_name = {name: track for track, name in tracks.items()}
  assert by_name["client 0 (pod-a, pid 1)"] == 1 and by_name["client 2 (pod-c, pid 7)"] == 7
  assert by_name["client 1 (pod-b, pid 1)"] >= 1 << 23
  for track in tracks:  # Every track has its own two slices, whole.
    assert [e["ph"] for e in trace["traceEvents"] if e["pid"] == track
            and e["ph"] in "BE"] == ["B", "E", "B", "E"]
  assert _trace.residuals(paths) == {"client 0 (pod-a, pid 1)": 0.001,
                                     "client 1 (pod-b, pid 1)": 0.001,
                                     "client 2 (pod-c, pid 7)": 0.007}


def test_the_traces_of_several_nodes_make_one(tmp_path):
  """Each node's `jdtensor launch --trace` wrote one trace of its launcher
  and clients (pids that the other node also has, a client killed inside a
  slice); merged, every process keeps its own track, the killed client's
  slice still ends where its launcher saw it end, and merging the merged
  trace again changes nothing."""
  nodes = []
  for node, (launcher_pid, client_pids) in enumerate([(100, (101, 102)), (101, (100, 102))]):
    folder = tmp_path / f"node{node}"
    folder.mkdir()
    own = _trace.TraceFile(str(folder / f"launcher-{node}.json"), launcher_pid,
                           f"jdtensor launch (node {node}, pid {launcher_pid})",
                           sort_index=-1)
    own.instant("summary", 15.0, {"text": "jdtensor launch: client 1 stalled"}, scope="g")
    own.close()
    files = [own.path] + [_client(folder, 2 * node + k, pid, f"node{node}", killed=k == 1)
                          for k, pid in enumerate(client_pids)]
    nodes.append(str(tmp_path / f"run-node{node}.json"))
    _trace.merge(files, nodes[-1], {}, ends={client_pids[1]: 20e6}, one_host=True)
  merged = tmp_path / "run.json"
  count = _trace.merge(nodes, str(merged), {})
  trace = json.loads(merged.read_text())
  assert _trace.problems(trace) == []
  assert count == sum(len(json.loads(Path(n).read_text())["traceEvents"]) for n in nodes)
  tracks = _tracks_of(trace)
  assert sorted(tracks.values()) == [
      "client 0 (node0, pid 101)", "client 1 (node0, pid 102)", "client 2 (node1, pid 100)",
      "client 3 (node1, pid 102)", "jdtensor launch (node 0, pid 100)",
      "jdtensor launch (node 1, pid 101)"]
  killed = {name: track for track, name in tracks.items() if name.startswith(
      ("client 1 ", "client 3 "))}
  for track in killed.values():
    ends = [e for e in trace["traceEvents"] if e["pid"] == track and e["ph"] == "E"]
    assert ends[-1]["ts"] == 20e6 and ends[-1]["args"] == {"ended": "process"}
  again = tmp_path / "again.json"
  _trace.merge([str(merged)], str(again), {})
  assert json.loads(again.read_text())["traceEvents"] == trace["traceEvents"]


def test_a_file_already_there_is_never_replaced(tmp_path):
  """A client restarted in a new container can have the pid of the one
  before it (so its file's name): the new one writes beside it."""
  first = _client(tmp_path, 0, 1, "pod-a")
  second = _client(tmp_path, 0, 1, "pod-a", restart=1)
  assert first == str(tmp_path / "client-0-1.json")
  assert second == str(tmp_path / "client-0-1.1.json")
  assert _trace.residuals([first, second]) == {"client 0 (pod-a, pid 1)": 0.001,
                                               "client 0 (pod-a, pid 1) after restart 1": 0.001}
  merged = tmp_path / "run.json"
  _trace.merge([first, second], str(merged), {})
  assert len(_tracks_of(json.loads(merged.read_text()))) == 2


@pytest.mark.parametrize("rank,given,node_0,written", [
    (1, "run.json", "run.json", "run.node1.json"),
    (3, "run", "run", "run.node3.json"),
    (1, "mine.json", "run.json", "mine.json"),
    (0, "run.json", "run.json", "run.json"),
], ids=["same-path", "no-extension", "own-path", "node-0"])
def test_a_node_given_node_0s_trace_path_writes_beside_it(tmp_path, rank, given, node_0,
                                                         written):
  from jdtensor.launcher.trace import RunTrace  # pylint: disable=g-import-not-at-top
  trace = RunTrace(str(tmp_path / given), node_rank=rank)
  trace.beside(str(tmp_path / node_0))
  line = trace.close()
  assert trace.path == str(tmp_path / written)
  assert json.loads((tmp_path / written).read_text())["traceEvents"]
  if written != given:
    assert line.startswith(f"jdtensor launch: trace of node {rank}'s part of the run in "
                           f"{tmp_path / written} (")
  else:
    assert line.startswith(f"jdtensor launch: trace of the run in {tmp_path / written} (")


def _launcher(folder, pid, ends):
  """A launcher's own file: its track, and each client's end (pid -> its
  exit code, at 20 s) on the client's track, as `RunTrace.attempt` writes."""
  own = _trace.TraceFile(str(folder / "launcher-0.json"), pid,
                         f"jdtensor launch (node 0, pid {pid})", sort_index=-1)
  own.instant("client 1 stalled", 15.0, {"text": "jdtensor launch: client 1 stalled"},
              scope="g")
  for client_pid, code in ends.items():
    own.write({"ph": "i", "name": "client ended", "pid": client_pid, "tid": 1,
               "ts": own.ts(20.0), "s": "p", "args": {"code": code}})
  own.close()
  return own.path


def test_a_launchers_folder_is_one_host_and_its_file_ends_a_killed_clients_slice(tmp_path):
  """A folder a launcher left (killed, say): merged as one host, its own
  track beside its clients', each client's end on the client's own track,
  and the slice of the client killed inside it closed where the launcher saw
  it end, not at its last event."""
  files = [_launcher(tmp_path, 100, {101: 0, 102: -9}), _client(tmp_path, 0, 101, "h"),
           _client(tmp_path, 1, 102, "h", killed=True)]
  merged = tmp_path / "run.json"
  _trace.merge([tuple(files)], str(merged), {})
  trace = json.loads(merged.read_text())
  assert _trace.problems(trace) == []
  assert sorted(_tracks_of(trace)) == [100, 101, 102]  # Three tracks, one pid space.
  ends = {e["pid"]: e["args"]["code"] for e in trace["traceEvents"]
          if e.get("name") == "client ended"}
  assert ends == {101: 0, 102: -9}
  closed = [e for e in trace["traceEvents"] if e["ph"] == "E" and e["pid"] == 102]
  assert closed[-1] == {"ph": "E", "pid": 102, "tid": 1, "ts": 20e6,
                        "args": {"ended": "process"}}


def _bad(tmp_path, content):
  bad = tmp_path / "bad.json"
  if isinstance(content, bytes):
    bad.write_bytes(content)
  else:
    bad.write_text(content)
  return bad


_MERGED_HEAD = '{"displayTimeUnit":"ms","metadata":{},"traceEvents":[\n'


@pytest.mark.parametrize("content,said", [
    ("", "empty, not a trace"),
    ("\n  \n", "empty, not a trace"),
    ("hello", "not JSON (Expecting value, line 1), so not a trace"),
    ("[]", "no trace events in it"),
    ("[1, 2]", "event 0 is 1, not an object"),
    ("42", "JSON 42, not a trace (a list of events, or an object with a traceEvents list)"),
    ('{"traceEvents": "x"}', 'its traceEvents is "x", not a list of events'),
    ('{"events": []}', 'a JSON object without traceEvents ({"events": []})'),
    ('{"traceEvents": [{"ph": "i", "pid": 1, "ts": "soon"}]}',
     'event 0 is an event whose ts "soon" is not a number'),
    ('{"traceEvents": [{"ph": "i", "pid": 1, "ts": NaN}]}',
     "event 0 is an event whose ts NaN is not a number"),
    ('[{"name": "x", "pid": 1}]',
     "event 0 is an object without a phase the trace format defines (ph null)"),
    ('[{"ph": "i", "ts": 1}]', "event 0 is an event without a process id (pid null)"),
    ('[{"ph": "i", "pid": [1], "ts": 1}]', "event 0 is an event without a process id "
     "(pid [1])"),
    ('[\n{"ph":"i","pid":1,"ts":1},\n"x",\n', 'line 3 is "x", not an object'),
    ('[\n{"ph":"i","pid":1,"ts":1},\n{"ph":\n{"ph":"i","pid":1,"ts":2},\n',
     "line 3 is not JSON, and more follows it"),
    (_MERGED_HEAD + '{"ph":"i","pid":1,"ts":1}\n', "cut short: no closing ]}"),
    (_MERGED_HEAD + '{"ph":"i","pid":1,"ts":1}\n,{"ph":"i","pid":1,"ts"\n]}\n',
     "line 3 is not JSON, and more follows it"),
    (b"\xff\xfe[", "not text (UTF-8), so not a trace"),
], ids=["empty", "blank", "not-json", "empty-array", "array-of-numbers", "a-number",
        "traceEvents-a-string", "wrong-object", "ts-a-string", "ts-nan", "no-phase",
        "no-pid", "pid-a-list", "part-with-a-string", "part-broken-inside",
        "merged-cut-short", "merged-broken-inside", "binary"])
def test_what_is_not_a_trace_is_refused_naming_the_file_and_the_trace_left_alone(
    tmp_path, content, said):
  """Never an empty trace, never a value passed through as an event: the
  merge stops at the first thing wrong, and the trace already there stays."""
  bad = _bad(tmp_path, content)
  good = _client(tmp_path, 0, 1, "pod-a")
  out = tmp_path / "run.json"
  out.write_text("before")
  with pytest.raises(_trace.TraceError) as e:
    _trace.merge([good, str(bad)], str(out), {})
  assert str(e.value) == f"{bad}: {said}"
  assert out.read_text() == "before"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "client-0-1.json",
                                                         "run.json"]
  with pytest.raises(_trace.TraceError):
    _trace.residuals([str(bad)])


def test_a_missing_file_is_refused_by_name(tmp_path):
  with pytest.raises(_trace.TraceError) as e:
    list(_trace.read_events(str(tmp_path / "gone.json")))
  assert str(e.value) == f"{tmp_path / 'gone.json'}: cannot be read (No such file or directory)"


@pytest.mark.parametrize("content", [
    '[{"ph": "i", "name": "v", "pid": 1, "tid": 1, "ts": 1, "s": "g"}]',
    '{\n  "traceEvents": [\n    {"ph": "i", "name": "v", "pid": 1, "tid": 1, "ts": 1,\n'
    '     "s": "g"}\n  ],\n  "otherData": {"by": "another tool"}\n}\n',
    '[\n  {\n    "ph": "i", "name": "v", "pid": 1, "tid": 1, "ts": 1, "s": "g"\n  }\n]\n',
], ids=["array-on-one-line", "object-pretty-printed", "array-pretty-printed"])
def test_a_trace_in_either_of_chromes_json_formats_is_read_whole(tmp_path, content):
  bad = _bad(tmp_path, content)
  assert list(_trace.read_events(str(bad))) == [
      {"ph": "i", "name": "v", "pid": 1, "tid": 1, "ts": 1, "s": "g"}]
