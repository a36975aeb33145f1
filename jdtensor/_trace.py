"""A run as a picture: Chrome's trace-event format, which Perfetto and
``chrome://tracing`` open.

PURE: standard library only.

Each process of a run (every client, and each launcher) writes its own
events as they happen into a file of its own (`TraceFile`): Chrome's JSON
array format, one event a line, flushed a line at a time, so that a file cut
short by a kill still opens (the format allows the closing ``]`` to be
missing). A client's main thread is a sequence of slices, one per phase
(`PhaseSlices`: set-up, own code, in JAX, in a collective, at a service
wait, at exit), made from the heartbeat's samples, one a beat: a phase
shorter than a beat is never a slice of its own, so a 1 ms step loop writes
a few lines a beat, not a line a step. Verdicts, straggler warnings, restarts and a launcher's stops
are instant events with their text; each client's CPU use and resident
memory are counters, written when they move.

Timestamps are microseconds on client 0's clock: a client measures its
offset to client 0 once (a round trip on the liveness links) and writes its
events on that clock; the residual (half the round trip) is in its metadata.
`merge` streams the files into one trace, never holding more than a line.

Every event is one the format defines: a ``tid`` on each (the main thread's,
1), and metadata (``"ph": "M"``) only under the format's names. jdtensor's
own metadata for a track (the client, its host, pid and restart; its clock's
offset and residual) is the ``jdtensor`` argument of the track's
``process_name`` and ``process_labels`` events (`track_metadata`); a merged
trace's own, its top-level ``metadata`` (the format takes any top-level key
but its own for the trace's metadata). `problems` checks all of it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

__all__ = ["TraceFile", "PhaseSlices", "TraceError", "merge", "read_events", "problems",
           "residuals", "track_metadata", "PHASE_SLICE_NAMES", "SET_UP", "SERVICE_WAIT",
           "COUNTER_STEP", "COUNTER_FLOORS"]

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
# The argument of a track's metadata events that holds jdtensor's own.
_META = "jdtensor"
# A launcher's own file in a run's folder (``launcher-<node>.json``).
_LAUNCHER_PREFIX = "launcher-"


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
    metadata: jdtensor's metadata for this track (the client, its host, ...):
      the ``jdtensor`` argument of its ``process_name`` event (see
      `track_metadata`).
  """

  def __init__(self, path: str, pid: int, name: str, sort_index: int = 0,
               offset: float = 0.0, metadata: dict[str, Any] | None = None,
               thread: str = "main thread"):
    self.path, self.pid, self.offset = path, pid, offset
    self._lock = threading.Lock()
    self._file: IO[str] | None = _create(path)
    self.path = self._file.name
    self._file.write("[\n")
    self._meta("process_name", {"name": name, **({_META: metadata} if metadata else {})})
    self._meta("process_sort_index", {"sort_index": sort_index})
    self._meta("thread_name", {"name": thread})  # The one the heartbeat watches.

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

  def labels(self, text: str, metadata: dict[str, Any] | None = None) -> None:
    """Labels of the track (`text`: a viewer shows them beside its name), and
    more of jdtensor's metadata for it (its clock, once measured)."""
    self._meta("process_labels", {"labels": text, **({_META: metadata} if metadata else {})})

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
    self._write({"ph": "C", "name": name, "pid": self.pid, "tid": _THREAD,
                 "ts": self.ts(at), "args": values})

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


class TraceError(ValueError):
  """A file that is not a trace (`read_events`): the message names the file
  and says what is wrong with it."""

  def __init__(self, path: str, why: str):
    super().__init__(f"{path}: {why}")
    self.path, self.why = path, why


# The phases the trace-event format defines.
_PHASES = frozenset(["B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O",
                     "N", "D", "M", "V", "v", "R", "c", "(", ")"])


def _shown(value: Any) -> str:
  """`value` as JSON, cut to a length a line can hold."""
  text = json.dumps(value, default=repr)
  return text if len(text) <= 40 else text[:37] + "..."


def _number(value: Any) -> bool:  # Not NaN or Infinity, which Python's JSON reads.
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _track_id(value: Any) -> bool:
  return isinstance(value, (int, str)) and not isinstance(value, bool)


def _not_an_event(event: Any) -> str | None:
  """Why `event` cannot be a trace event (None: it can): what `merge` needs
  of one to place it, never more (its rules: `problems`)."""
  if not isinstance(event, dict):
    return f"{_shown(event)}, not an object"
  ph = event.get("ph")
  if not isinstance(ph, str) or ph not in _PHASES:
    return f"an object without a phase the trace format defines (ph {_shown(ph)})"
  if not _track_id(event.get("pid")):
    return f"an event without a process id (pid {_shown(event.get('pid'))})"
  if "tid" in event and not _track_id(event["tid"]):
    return f"an event whose tid {_shown(event['tid'])} is not a thread id"
  for key in ("ts", "dur"):
    if key in event and not _number(event[key]):
      return f"an event whose {key} {_shown(event[key])} is not a number"
  if "args" in event and not isinstance(event["args"], dict):
    return f"an event whose args {_shown(event['args'])} are not an object"
  return None


def read_events(path: str) -> Iterator[dict[str, Any]]:
  """The events of one trace file: a process's own (`TraceFile`: a line an
  event; its last line, cut short by a kill, is skipped) or one `merge` wrote,
  both streamed a line at a time; a trace of another kind in either of
  Chrome's JSON formats (an array of events, or an object with a
  ``traceEvents`` array) is read whole.

  Raises:
    TraceError: `path` cannot be read or is not a trace: empty, not JSON, no
      ``traceEvents`` list, an event that is not an object with a phase the
      format defines, a pid and numbers where it has them, or no event.
  """
  count = 0
  for event in _events_of(path):
    count += 1
    yield event
  if not count:
    raise TraceError(path, "no trace events in it")


def _events_of(path: str) -> Iterator[dict[str, Any]]:
  try:
    with open(path, encoding="utf-8") as f:
      lines = ((n, line.strip()) for n, line in enumerate(f, 1) if line.strip())
      first = next(lines, None)
      if first is None:
        raise TraceError(path, "empty, not a trace")
      head = first[1]
      if head == "[":  # A process's own file, unless its events span lines.
        ahead = list(itertools.islice(lines, 2))
        if len(ahead) < 2 or _parses(ahead[0][1].removesuffix(",")):
          yield from _line_events(path, itertools.chain(ahead, lines), own=True)
          return
      elif head.startswith("{") and head.endswith('"traceEvents":[') and _parses(
          head + "]}"):  # One that `merge` wrote.
        yield from _line_events(path, lines, own=False)
        return
      f.seek(0)
      yield from _whole_events(path, f)
  except UnicodeDecodeError:
    raise TraceError(path, "not text (UTF-8), so not a trace") from None
  except OSError as e:
    raise TraceError(path, f"cannot be read ({e.strerror})") from None


def _parses(text: str) -> bool:
  try:
    json.loads(text)
  except (ValueError, RecursionError):
    return False
  return True


def _line_events(path: str, lines: Iterator[tuple[int, str]],
                 own: bool) -> Iterator[dict[str, Any]]:
  """The events of a file written a line an event: a process's own (`own`:
  each line ends with a comma, and only the last can be cut short) or
  `merge`'s (each line but the first begins with one, then ``]}``)."""
  closing = "]" if own else "]}"
  cut: int | None = None  # A line that is not JSON: only the last may be.
  closed = False
  for number, text in lines:
    if cut is not None:
      raise TraceError(path, f"line {cut} is not JSON, and more follows it")
    if closed:
      raise TraceError(path, f"line {number}: more after the closing {closing}")
    if text == closing:
      closed = True
      continue
    text = text.removesuffix(",") if own else text.removeprefix(",")
    try:
      event = json.loads(text)
    except (ValueError, RecursionError):
      cut = number  # Cut short by a kill, if nothing follows.
      continue
    why = _not_an_event(event)
    if why is not None:
      raise TraceError(path, f"line {number} is {why}")
    yield event
  if not own and not closed:
    raise TraceError(path, f"cut short: no closing {closing}")


def _whole_events(path: str, f: IO[str]) -> Iterator[dict[str, Any]]:
  try:
    data = json.load(f)
  except json.JSONDecodeError as e:
    raise TraceError(path, f"not JSON ({e.msg}, line {e.lineno}), so not a trace") from None
  except RecursionError:
    raise TraceError(path, "JSON nested too deep to be a trace") from None
  if isinstance(data, dict):
    if "traceEvents" not in data:
      raise TraceError(path, f"a JSON object without traceEvents ({_shown(data)})")
    events = data["traceEvents"]
    if not isinstance(events, list):
      raise TraceError(path, f"its traceEvents is {_shown(events)}, not a list of events")
  elif isinstance(data, list):
    events = data
  else:
    raise TraceError(path, f"JSON {_shown(data)}, not a trace (a list of events, or an "
                     "object with a traceEvents list)")
  for i, event in enumerate(events):
    why = _not_an_event(event)
    if why is not None:
      raise TraceError(path, f"event {i} is {why}")
    yield event


def merge(paths: Iterable[str | Sequence[str]], out: str, metadata: dict[str, Any],
          ends: dict[int, float] | None = None, one_host: bool = False) -> int:
  """Writes the events of `paths` into one trace at `out` (Chrome's JSON
  object format: ``traceEvents`` and ``metadata``), a line at a time.

  A path is a process's own file or a trace `merge` wrote (one node's
  ``jdtensor launch --trace``). A track is a pid, and a pid is a track only
  on its own host: each file's tracks are its own, and a pid that an earlier
  file already gave a track (two hosts, two containers' pid 1) gets a new
  track id above any pid (its name still says the real pid). A sequence of
  paths in `paths` is one host's (a launcher's file and its clients'), as is
  every path with `one_host`: its files share their pids.

  A process that ended inside a slice (killed, or ended without its
  heartbeat's end) has it closed at its end: `ends` (pid -> microseconds on
  the trace's clock, as the launcher saw it; with `one_host`), else where its
  host's launcher file (``launcher-<node>.json``) recorded it, else its last
  event.

  Returns:
    The number of events written.

  Raises:
    TraceError: A path is not a trace (`read_events`); `out` is left as it was.
    OSError: `out` cannot be written.
  """
  groups = [[p] if isinstance(p, str) else list(p) for p in paths]
  if one_host:
    groups = [[p for group in groups for p in group]]
  count = 0
  tracks = _Tracks()
  tmp = f"{out}.partial"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write('{"displayTimeUnit":"ms","metadata":')
      f.write(json.dumps(metadata, separators=(",", ":")))
      f.write(',"traceEvents":[\n')

      def put(event: dict[str, Any]) -> None:
        nonlocal count
        f.write(("," if count else "") + json.dumps(event, separators=(",", ":")) + "\n")
        count += 1
      for space, group in enumerate(groups):
        # A launcher's file first: where it saw each client end.
        group.sort(key=lambda p: not os.path.basename(p).startswith(_LAUNCHER_PREFIX))
        seen_ends: dict[Any, float] = {}
        for path in group:
          launchers = os.path.basename(path).startswith(_LAUNCHER_PREFIX)
          open_slices: dict[tuple[Any, Any], int] = {}
          last = 0.0
          for event in read_events(path):
            if launchers and event["ph"] == "i" and "code" in event.get("args", {}):
              seen_ends[event["pid"]] = float(event.get("ts", 0.0))
            event["pid"] = tracks.id(space, event["pid"])
            track = (event["pid"], event.get("tid"))
            if event["ph"] == "B":
              open_slices[track] = open_slices.get(track, 0) + 1
            elif event["ph"] == "E":
              if not open_slices.get(track):
                continue  # A slice whose begin was lost (a line cut short).
              open_slices[track] -= 1
            last = max(last, float(event.get("ts", 0.0)) + float(event.get("dur", 0.0)))
            put(event)
          known = {**seen_ends, **(ends or {})}
          for (track_id, tid), n in open_slices.items():
            at = max(last, known.get(tracks.pid_of[track_id], last))
            for _ in range(n):
              put({"ph": "E", "pid": track_id, "tid": tid, "ts": at,
                   "args": {"ended": "process"}})
      f.write("]}\n")
  except BaseException:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise
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


def track_metadata(events: Iterable[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
  """Each track's jdtensor metadata (pid -> the ``jdtensor`` arguments of its
  metadata events, a later one adding to or replacing an earlier's keys):
  a client's ``client``, ``host``, ``pid``, ``restart``, and, once its clock
  was measured, ``clock_offset_s`` (and ``clock_residual_s``, where client 0
  answered)."""
  out: dict[Any, dict[str, Any]] = {}
  for event in events:
    if event.get("ph") == "M":
      meta = (event.get("args") or {}).get(_META)
      if isinstance(meta, dict):
        out.setdefault(event.get("pid"), {}).update(meta)
  return out


def residuals(paths: Iterable[str]) -> dict[str, float | None]:
  """Each client track's clock residual (seconds; None: not measured), from
  its metadata, by ``client k (host, pid P)`` (and the restart after which it
  ran).

  Raises:
    TraceError: As `read_events`.
  """
  out: dict[str, float | None] = {}
  for path in paths:
    for meta in track_metadata(read_events(path)).values():  # The last word wins.
      if "client" not in meta:
        continue  # A launcher's track.
      key = f"client {meta.get('client')} ({meta.get('host')}, pid {meta.get('pid')})"
      if meta.get("restart"):
        key += f" after restart {meta['restart']}"
      out[key] = meta.get("clock_residual_s")
  return out


_REQUIRED = {"X": ("name", "pid", "tid", "ts", "dur"), "i": ("name", "pid", "tid", "ts", "s"),
             "C": ("name", "pid", "tid", "ts", "args"), "M": ("name", "pid", "tid", "args"),
             "B": ("name", "pid", "tid", "ts"), "E": ("pid", "tid", "ts")}
# The metadata events the format defines, each with the argument it carries.
_METADATA = {"process_name": ("name", str), "process_labels": ("labels", str),
             "process_sort_index": ("sort_index", int), "thread_name": ("name", str),
             "thread_sort_index": ("sort_index", int)}


def _event_problem(event: dict[str, Any]) -> str | None:
  """What breaks the format in one event with its required fields."""
  ph = event["ph"]
  for key in ("pid", "tid"):
    if not isinstance(event[key], int) or isinstance(event[key], bool):
      return f"{key} {_shown(event[key])} is not an integer"
  for key in ("ts", "dur"):
    if key in event and not _number(event[key]):
      return f"{key} {_shown(event[key])} is not a number"
  if "name" in event and not isinstance(event["name"], str):
    return f"name {_shown(event['name'])} is not a string"
  args = event.get("args", {})
  if not isinstance(args, dict):
    return f"args {_shown(args)} are not an object"
  if ph == "i" and event["s"] not in ("g", "p", "t"):
    return f"scope {_shown(event['s'])} is not g, p or t"
  if ph == "C" and not (args and all(_number(v) for v in args.values())):
    return "a counter without numbers"
  if ph == "M":
    if event["name"] not in _METADATA:
      return (f"metadata named {_shown(event['name'])}, not one the format defines "
              f"({', '.join(_METADATA)})")
    key, kind = _METADATA[event["name"]]
    if not isinstance(args.get(key), kind) or isinstance(args.get(key), bool):
      return f"{event['name']} without its {key} ({kind.__name__})"
  return None


def problems(trace: dict[str, Any]) -> list[str]:
  """What breaks the trace-event format in `trace` (empty: none), strictly:
  only the phases jdtensor writes, each event with the fields the format
  requires of it (a ``tid`` on each, a counter's numbers, an instant's scope),
  metadata only under the format's names with their argument, begin/end
  pairs balanced and slices monotonic per track."""
  out: list[str] = []
  events = trace.get("traceEvents")
  if not isinstance(events, list):
    return ["no traceEvents list"]
  open_slices: dict[tuple[Any, Any], int] = {}
  last_start: dict[tuple[Any, Any], float] = {}
  for i, event in enumerate(events):
    if not isinstance(event, dict):
      out.append(f"event {i}: {_shown(event)} is not an object")
      continue
    ph = event.get("ph")
    if not isinstance(ph, str) or ph not in _REQUIRED:
      out.append(f"event {i}: unknown phase {ph!r}")
      continue
    missing = [k for k in _REQUIRED[ph] if k not in event]
    if missing:
      out.append(f"event {i} ({ph}): missing {missing}")
      continue
    wrong = _event_problem(event)
    if wrong is not None:
      out.append(f"event {i} ({ph}): {wrong}")
      continue
    track = (event["pid"], event["tid"])
    if ph in ("B", "E", "X"):
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
    elif ph == "X" and event["dur"] < 0:
      out.append(f"event {i}: a negative duration")
  out += [f"{n} slice(s) never ended on {t}" for t, n in open_slices.items() if n]
  return out
