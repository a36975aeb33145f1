"""``jdtensor launch --trace FILE``: the run as one trace Perfetto opens.

PURE of JAX: standard library only. The clients write their own events
(`jdtensor._trace`, through their heartbeat) into a folder the launcher
gives them (``JDTENSOR_TRACE_DIR``); the launcher adds its own track (every
line it prints, at the moment it prints it: the summary, a restart, a stop),
each client's end on the client's track (its exit code or signal, at the
time the launcher saw it), and at the end streams every file into FILE,
closing the slice of a client that was killed inside it at its end.
"""

from __future__ import annotations

import glob
import io
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import IO, cast

from jdtensor import _env, _trace
from jdtensor.launcher.output import say
from jdtensor.launcher.spec import LaunchResult

__all__ = ["RunTrace", "check_writable", "parts", "PART_PATTERNS"]

_PREFIX = "jdtensor launch"
# Lines that mark the whole picture (a line across every track): the
# summary (it names a client), a restart, a stop, a time-out.
_WHOLE_RUN = ("client", "restarting", "time to recovery", "received", "stopped",
              "timed out")
# A client's file: client-<id>-<pid>.json, or .<n>.json beside one already there.
_CLIENT_FILE = re.compile(r"client-\d+-(\d+)(?:\.\d+)?\.json")
# The files of a run's folder (`RunTrace.dir`, or a JDTENSOR_TRACE_DIR).
PART_PATTERNS = ("client-*.json", "launcher-*.json")


def parts(folder: str) -> list[str]:
  """The trace's parts in `folder`: each client's file and each launcher's
  (never a trace merged there, ``run.json``); an empty one (a process
  killed as it created it) is left out."""
  found = sorted(p for pattern in PART_PATTERNS
                 for p in glob.glob(os.path.join(folder, pattern)))
  return [p for p in found if os.path.isfile(p) and os.path.getsize(p) > 0]


def check_writable(path: str) -> str | None:
  """Why the trace cannot be written at `path` (a clause that says the fix),
  or None. The merge writes ``<path>.partial`` beside it, then renames it."""
  if not path:
    return "the file name is empty; give the file the trace goes to (e.g. run.json)"
  folder = os.path.dirname(os.path.abspath(path)) or "."
  if os.path.isdir(path):
    return f"{path} is a directory; give a file name (e.g. {path.rstrip('/')}/run.json)"
  if path.endswith(("/", os.sep)):
    return f"{path} names a folder; give a file name (e.g. {path}run.json)"
  if os.path.exists(path) and not os.path.isfile(path):
    return f"{path} is not a regular file; give the name of a file"
  if not os.path.isdir(folder):
    return f"its folder {folder} does not exist; create it first"
  if not os.access(folder, os.W_OK):
    return f"its folder {folder} is not writable"
  return None


def _ended(code: int | None) -> str:
  if code is None:
    return "still running"
  if code < 0:
    try:
      return f"killed by {signal.Signals(-code).name}"
    except ValueError:
      return f"killed by signal {-code}"
  return f"exited (code {code})"


class _Tee(io.TextIOBase):
  """The launcher's error stream, which also records every line of the
  launcher's own on its track (the clients' lines are theirs)."""

  def __init__(self, stream: IO[str], trace: RunTrace):
    super().__init__()
    self._stream, self._trace = stream, trace
    self._partial = ""
    self._lock = threading.Lock()

  def write(self, text: str) -> int:
    with self._lock:
      lines = (self._partial + text).split("\n")
      self._partial = lines.pop()
    for line in lines:
      if line.startswith(_PREFIX):
        self._trace.line(line)
    return self._stream.write(text)

  def flush(self) -> None:
    self._stream.flush()

  def fileno(self) -> int:
    return self._stream.fileno()

  def isatty(self) -> bool:
    return self._stream.isatty()


class RunTrace:
  """One launcher's part of a traced run.

  Args:
    path: Where the trace goes (``--trace FILE``).
    node_rank: This launcher's node.
  """

  def __init__(self, path: str, node_rank: int = 0):
    self.path = path
    self.dir = tempfile.mkdtemp(prefix="jdtensor-trace-")
    pid = os.getpid()
    self.own = _trace.TraceFile(os.path.join(self.dir, f"launcher-{node_rank}.json"), pid,
                                f"jdtensor launch (node {node_rank}, pid {pid})",
                                sort_index=-1)
    self.ends: dict[int, float] = {}  # Each client track's end (microseconds).
    self.node_rank = node_rank
    self.node_0_writes: str | None = None  # Node 0's trace, where this is beside it.

  def beside(self, node_0_path: str) -> None:
    """Node 0 writes its part of the run to `node_0_path` (absolute, as node
    0 sees it): where this node was given the same path (the same command on
    every node, as ``srun`` runs it; on a shared file system the nodes would
    overwrite each other's part), this node writes
    ``<stem>.node<R><ext>`` beside it instead, and says so."""
    if self.node_rank == 0 or os.path.abspath(self.path) != node_0_path:
      return
    stem, ext = os.path.splitext(self.path)
    self.node_0_writes, self.path = self.path, f"{stem}.node{self.node_rank}{ext or '.json'}"

  @property
  def env(self) -> Mapping[str, str]:
    """What the clients' environment gets."""
    return {_env.JDTENSOR_TRACE_DIR: self.dir}

  def watching(self, err: IO[str]) -> IO[str]:
    """`err`, recording the launcher's own lines on its track; says first
    where the parts are kept until the end (a killed launcher leaves them
    there, for ``jdtensor trace DIR``)."""
    tee = cast(IO[str], _Tee(err, self))
    say(tee, f"{_PREFIX}: the trace's parts are in {self.dir} until the run ends "
        f"(should this launcher be killed before, merge them with: jdtensor trace "
        f"{self.dir})")
    return tee

  def line(self, text: str) -> None:
    """A line the launcher printed, now."""
    name = text.split(":", 1)[1].strip() if ":" in text else text
    whole = any(name.startswith(w) for w in _WHOLE_RUN)
    self.own.instant(name[:80], time.time(), {"text": text}, scope="g" if whole else "p")

  def attempt(self, result: LaunchResult) -> None:
    """An attempt ended: each client's end, on its own track (the track of
    the process the client is: the launcher knows the guardian's pid above
    it, so the client's is read from the file its trace is in)."""
    for code, at, client in zip(result.returncodes, result.ended_at, result.client_ids):
      pid = self._track_of(client)
      if pid is None:  # No trace of its own (it never beat): nothing to end.
        continue
      at = time.time() if at is None else at
      self.ends[pid] = self.own.ts(at)
      self.own.write({"ph": "i", "name": f"client {client} {_ended(code)}", "pid": pid,
                      "tid": 1, "ts": self.own.ts(at), "s": "p", "args": {"code": code}})

  def _track_of(self, client: int) -> int | None:
    """The pid of `client`'s newest trace file not yet ended (this attempt's)."""
    found = []
    for path in glob.glob(os.path.join(self.dir, f"client-{client}-*.json")):
      name = _CLIENT_FILE.fullmatch(os.path.basename(path))
      if name and int(name.group(1)) not in self.ends:
        found.append((os.path.getmtime(path), int(name.group(1))))
    return max(found)[1] if found else None

  def close(self) -> str:
    """Writes the trace; the line that says where."""
    self.own.close()
    files = parts(self.dir)
    try:
      count = _trace.merge(files, self.path, {
          "jdtensor": {"clock": "client 0's (microseconds of time.time())",
                       "residuals_s": _trace.residuals(files)}}, self.ends,
          one_host=True)
    except OSError as e:
      return f"{_PREFIX}: the trace could not be written to {self.path} ({e.strerror})"
    except _trace.TraceError as e:  # A client wrote something else in its file.
      return f"{_PREFIX}: the trace could not be written to {self.path} ({e})"
    finally:
      shutil.rmtree(self.dir, ignore_errors=True)
    tracks = sum(1 for f in files if os.path.basename(f).startswith("client-"))
    if self.node_0_writes is not None:
      stem, ext = os.path.splitext(self.node_0_writes)
      ext = ext or ".json"
      return (f"{_PREFIX}: trace of node {self.node_rank}'s part of the run in "
              f"{self.path} ({count:,} events, {tracks} client track(s)), beside node "
              f"0's {self.node_0_writes}; one trace of every node: jdtensor trace "
              f"{self.node_0_writes} {stem}.node*{ext} -o {stem}.all{ext}")
    return (f"{_PREFIX}: trace of the run in {self.path} ({count:,} events, {tracks} "
            "client track(s); open it in https://ui.perfetto.dev or chrome://tracing)")
