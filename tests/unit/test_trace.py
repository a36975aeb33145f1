"""The trace format (`jdtensor._trace`): slices from a beat's samples,
counters written when they move, a killed process's slice closed at its end,
the format's rules, and the size of a long run."""

import json
import random
import sys
import threading
import time

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
  out = _file(tmp_path, offset=-2.5, metadata={"clock_residual_s": 0.001})
  out.instant("verdict", 100.0, {"text": "client 2 stalled"})
  out.close()
  events = _events(tmp_path / "client-1-11.json")
  assert [e["ts"] for e in events if e["ph"] == "i"] == [97.5e6]
  assert {"ph": "M", "name": "jdtensor", "pid": 11, "tid": 1,
          "args": {"clock_residual_s": 0.001}} in events


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
    ([{"ph": "C", "name": "c", "pid": 1, "ts": 5, "args": {"x": "high"}}], "without numbers"),
    ([{"ph": "Q", "pid": 1}], "unknown phase")])
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
