"""A run as a picture: Chrome's trace-event format, which Perfetto and
``chrome://tracing`` open.

PURE: standard library only.

Each process of a run (every client, and each launcher) writes its own
events as they happen into a file of its own (`TraceFile`): Chrome's JSON
array format, one event a line, flushed a line at a time, so that a file cut
short by a kill still opens (the format allows the closing ``]`` to be
missing). A client's main thread is a sequence of slices, one per phase
(`PhaseSlices`: set-up, own code, in JAX, in a collective, at a service
wait, at exit), made
from the heartbeat's samples, one a beat: a phase shorter than a beat is
never a slice of its own, so a 1 ms step loop writes a few lines a beat, not
a line a step. Verdicts, straggler warnings, restarts and a launcher's stops
are instant events with their text; each client's CPU use and resident
memory are counters, written when they move.

Timestamps are microseconds on client 0's clock: a client measures its
offset to client 0 once (a round trip on the liveness links) and writes its
events on that clock; the residual (half the round trip) is in its metadata.
`merge` streams the files into one trace, never holding more than a line.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Iterator
from typing import IO, Any

__all__ = ["TraceFile", "PhaseSlices", "merge", "read_events", "problems", "residuals",
           "PHASE_SLICE_NAMES", "SET_UP", "SERVICE_WAIT", "COUNTER_STEP",
           "COUNTER_FLOORS"]

# The slices of a client's main thread, by the flight recorder's phase
# (`jdtensor.heartbeat.flight`), and before its first collective.
PHASE_SLICE_NAMES = {1: "own code", 2: "in JAX", 3: "in a collective", 4: "at exit"}
SET_UP = "set-up"
# A wait on JAX's coordination service (a barrier, a key-value get), not in a
# collective.
SERVICE_WAIT = "at a service wait"
# A counter is written when it moves by this share, and at least by its
# floor (`COUNTER_FLOORS`, else 1), or once a minute: a steady client costs a
# line a minute, not a line a beat.
COUNTER_STEP = 0.05
COUNTER_FLOORS = {"cpu %": 10.0}
_COUNTER_EVERY = 60.0
# The pid of a trace event is a track, not always a process: a client's track
# is its real pid; a launcher's, its own.
_THREAD = 1  # The main thread's track in each process.
# Track ids `merge` gives a process whose pid another host's process already
# has: above any Linux pid (at most 2**22).
_FRESH_TRACKS = 1 << 23


def _us(seconds: float) -> float:
  return round(seconds * 1e6, 1)


class TraceFile:
  """One process's trace events, appended a line at a time.

  Args:
    path: Where (created; where a file is already there, the first free
      ``<stem>.<n>.json`` beside it: a client restarted in a new container
      can have the pid, and so the name, of the one before it). `path` is
      then the file's real name.
    pid: The track's id (the process's pid).
    name: The track's name (``client 2 (host, pid 123)``).
    sort_index: The track's place in the picture (clients in id order).
    offset: Seconds to add to this process's ``time.time()`` for client 0's
      clock.
    metadata: What `merge` puts in the trace's metadata for this track (the
      clock's residual, ...).
  """

  def __init__(self, path: str, pid: int, name: str, sort_index: int = 0,
               offset: float = 0.0, metadata: dict[str, Any] | None = None):
    self.path, self.pid, self.offset = path, pid, offset
    self._lock = threading.Lock()
    self._file: IO[str] | None = _create(path)
    self.path = self._file.name
    self._file.write("[\n")
    self._meta("process_name", {"name": name})
    self._meta("process_sort_index", {"sort_index": sort_index})
    self._meta("thread_name", {"name": "main thread"})
    if metadata:
      self._write({"ph": "M", "name": "jdtensor", "pid": pid, "tid": _THREAD,
                   "args": metadata})

  def _meta(self, name: str, args: dict[str, Any]) -> None:
    self._write({"ph": "M", "name": name, "pid": self.pid, "tid": _THREAD, "args": args})

  def _write(self, event: dict[str, Any]) -> None:
    with self._lock:
      if self._file is None:
        return
      try:
        self._file.write(json.dumps(event, separators=(",", ":")) + ",\n")
        self._file.flush()
      except (OSError, ValueError):
        self._file = None  # A full disk, or closed: the trace ends here.

  def write(self, event: dict[str, Any]) -> None:
    """Any event, as given (another process's track: the launcher writes
    each client's end on the client's)."""
    self._write(event)

  def ts(self, at: float) -> float:
    """`at` (``time.time()``) on client 0's clock, in microseconds."""
    return _us(at + self.offset)

  def begin(self, name: str, at: float) -> None:
    """A slice of the main thread begins (ended by `end`, or, for a process
    killed in it, by `merge` at the process's end)."""
    self._write({"ph": "B", "name": name, "pid": self.pid, "tid": _THREAD,
                 "ts": self.ts(at)})

  def end(self, at: float) -> None:
    """The main thread's open slice ends."""
    self._write({"ph": "E", "pid": self.pid, "tid": _THREAD, "ts": self.ts(at)})

  def instant(self, name: str, at: float, args: dict[str, Any] | None = None,
              scope: str = "p") -> None:
    """An instant event (a verdict, a restart), on the track (``p``) or the
    whole picture (``g``)."""
    event: dict[str, Any] = {"ph": "i", "name": name, "pid": self.pid, "tid": _THREAD,
                             "ts": self.ts(at), "s": scope}
    if args:
      event["args"] = args
    self._write(event)

  def counter(self, name: str, at: float, values: dict[str, float]) -> None:
    """A counter track's values at `at`."""
    self._write({"ph": "C", "name": name, "pid": self.pid, "ts": self.ts(at),
                 "args": values})

  def close(self) -> None:
    with self._lock:
      if self._file is not None:
        try:
          self._file.close()
        except OSError:
          pass
        self._file = None


def _create(path: str) -> IO[str]:
  """A new file at `path`, or at the first free ``<stem>.<n><ext>``."""
  stem, ext = os.path.splitext(path)
  for n in range(10_000):
    try:
      return open(path if n == 0 else f"{stem}.{n}{ext}", "x", encoding="utf-8")
    except FileExistsError:
      continue
  return open(path, "w", encoding="utf-8")


class PhaseSlices:
  """A client's main thread as slices, from one sample a beat.

  A sample says the phase and how long the main thread has been in it, so a
  slice starts where the phase began, not at the beat that saw it; a phase
  that came and went between two beats is part of its neighbours.
  """

  def __init__(self, out: TraceFile):
    self.out = out
    self._name: str | None = None
    self._start = 0.0
    self._last = 0.0
    self._counters: dict[str, tuple[float, float]] = {}

  def sample(self, at: float, name: str, seconds: float) -> None:
    """The main thread at `at` (``time.time()``): in phase `name` for
    `seconds`."""
    if self._name is None:
      self._name, self._start = name, at - max(0.0, seconds)
      self.out.begin(name, self._start)
    elif name != self._name:
      # The new phase began `seconds` ago, but not before the last sample
      # that still saw the old one.
      began = min(at, max(self._last, at - max(0.0, seconds)))
      self.out.end(began)
      self.out.begin(name, began)
      self._name, self._start = name, began
    self._last = at

  def counters(self, at: float, values: dict[str, float]) -> None:
    """Each counter, written when it moved by `COUNTER_STEP` (or a minute
    passed)."""
    for name, value in values.items():
      last = self._counters.get(name)
      if (last is None or at - last[1] >= _COUNTER_EVERY
          or abs(value - last[0]) >= max(COUNTER_STEP * abs(last[0]),
                                         COUNTER_FLOORS.get(name, 1.0))):
        self._counters[name] = (value, at)
        self.out.counter(name, at, {name: round(value, 1)})

  def end(self, at: float) -> None:
    """The main thread's last slice ends at `at`."""
    if self._name is not None:
      self.out.end(max(at, self._start))
      self._name = None


def read_events(path: str) -> Iterator[dict[str, Any]]:
  """The events of one process's file (a line cut short by a kill is
  skipped)."""
  try:
    with open(path, encoding="utf-8") as f:
      for line in f:
        # A process's own file ends each line with a comma; a merged trace
        # (`merge`) begins each but the first with one.
        line = line.strip().strip(",")
        if line in ("", "[", "]"):
          continue
        try:
          event = json.loads(line)
        except ValueError:
          continue
        if isinstance(event, dict):
          yield event
  except OSError:
    return


def merge(paths: Iterable[str], out: str, metadata: dict[str, Any],
          ends: dict[int, float] | None = None, one_host: bool = False) -> int:
  """Writes the events of `paths` into one trace at `out` (Chrome's JSON
  object format: ``traceEvents`` and ``metadata``), a line at a time.

  A path is a process's own file or a trace `merge` wrote (one node's
  ``jdtensor launch --trace``). A track is a pid, and a pid is a track only
  on its own host: unless `one_host` (a launcher's files and its clients',
  which it writes on), each file's tracks are its own, and a pid that an
  earlier file already gave a track (two hosts, two containers' pid 1) gets
  a new track id above any pid (its name still says the real pid).

  A process that ended inside a slice (killed, or ended without its
  heartbeat's end) has it closed at its end: `ends` (pid -> microseconds on
  the trace's clock, as the launcher saw it; with `one_host`), else its last
  event.

  Returns:
    The number of events written.
  """
  count = 0
  tracks = _Tracks()
  tmp = f"{out}.partial"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write('{"displayTimeUnit":"ms","metadata":')
    f.write(json.dumps(metadata, separators=(",", ":")))
    f.write(',"traceEvents":[\n')

    def put(event: dict[str, Any]) -> None:
      nonlocal count
      f.write(("," if count else "") + json.dumps(event, separators=(",", ":")) + "\n")
      count += 1
    for space, path in enumerate(paths):
      space = 0 if one_host else space
      open_slices: dict[tuple[Any, Any], int] = {}
      last = 0.0
      for event in read_events(path):
        pid = event.get("pid")
        event["pid"] = tracks.id(space, pid)
        track = (event["pid"], event.get("tid"))
        if event.get("ph") == "B":
          open_slices[track] = open_slices.get(track, 0) + 1
        elif event.get("ph") == "E":
          if not open_slices.get(track):
            continue  # A slice whose begin was lost (a line cut short).
          open_slices[track] -= 1
        last = max(last, float(event.get("ts", 0.0)) + float(event.get("dur", 0.0)))
        put(event)
      for (track_id, tid), n in open_slices.items():
        at = max(last, (ends or {}).get(tracks.pid_of[track_id], last))
        for _ in range(n):
          put({"ph": "E", "pid": track_id, "tid": tid, "ts": at,
               "args": {"ended": "process"}})
    f.write("]}\n")
  os.replace(tmp, out)
  return count


class _Tracks:
  """The trace's track ids: a process keeps its pid, unless another pid
  space already has it (then `_FRESH_TRACKS` and up)."""

  def __init__(self) -> None:
    self._ids: dict[tuple[int, Any], Any] = {}
    self.pid_of: dict[Any, Any] = {}  # Track id -> the pid its file gave.
    self._next = _FRESH_TRACKS

  def id(self, space: int, pid: Any) -> Any:
    key = (space, pid)
    if key not in self._ids:
      track = pid
      if pid in self.pid_of or not isinstance(pid, int):
        while self._next in self.pid_of:
          self._next += 1
        track = self._next if isinstance(pid, int) else pid
      self._ids[key] = track
      self.pid_of[track] = pid
    return self._ids[key]


def residuals(paths: Iterable[str]) -> dict[str, float | None]:
  """Each client track's clock residual (seconds), from its metadata, by
  ``client k (host, pid P)`` (and the restart after which it ran)."""
  out: dict[str, float | None] = {}
  for path in paths:
    for event in read_events(path):  # The last word on the clock wins.
      if event.get("ph") == "M" and event.get("name") == "jdtensor":
        args = event.get("args", {})
        key = f"client {args.get('client')} ({args.get('host')}, pid {args.get('pid')})"
        if args.get("restart"):
          key += f" after restart {args['restart']}"
        out[key] = args.get("clock_residual_s")
  return out


_REQUIRED = {"X": ("name", "pid", "tid", "ts", "dur"), "i": ("name", "pid", "ts", "s"),
             "C": ("name", "pid", "ts", "args"), "M": ("name", "pid", "args"),
             "B": ("name", "pid", "tid", "ts"), "E": ("pid", "tid", "ts")}


def problems(trace: dict[str, Any]) -> list[str]:
  """What breaks the trace-event format in `trace` (empty: none): every
  event's required fields, begin/end pairs balanced and slices monotonic per
  track, counters with numbers."""
  out: list[str] = []
  events = trace.get("traceEvents")
  if not isinstance(events, list):
    return ["no traceEvents list"]
  open_slices: dict[tuple[Any, Any], int] = {}
  last_start: dict[tuple[Any, Any], float] = {}
  for i, event in enumerate(events):
    ph = event.get("ph")
    if ph not in _REQUIRED:
      out.append(f"event {i}: unknown phase {ph!r}")
      continue
    missing = [k for k in _REQUIRED[ph] if k not in event]
    if missing:
      out.append(f"event {i} ({ph}): missing {missing}")
      continue
    track = (event.get("pid"), event.get("tid"))
    if ph in ("B", "E"):
      if event["ts"] < last_start.get(track, float("-inf")):
        out.append(f"event {i}: goes back in time on {track}")
      last_start[track] = event["ts"]
    if ph == "B":
      open_slices[track] = open_slices.get(track, 0) + 1
    elif ph == "E":
      if not open_slices.get(track):
        out.append(f"event {i}: an end without a begin on {track}")
      else:
        open_slices[track] -= 1
    elif ph == "X":
      if event["dur"] < 0:
        out.append(f"event {i}: a negative duration")
      if event["ts"] < last_start.get(track, float("-inf")):
        out.append(f"event {i}: {event['name']!r} starts before the slice before it "
                   f"on {track}")
      last_start[track] = event["ts"]
    elif ph == "C":
      if not all(isinstance(v, (int, float)) for v in event["args"].values()):
        out.append(f"event {i}: a counter without numbers")
  out += [f"{n} slice(s) never ended on {t}" for t, n in open_slices.items() if n]
  return out
