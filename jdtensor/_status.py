"""Live status of a run: what `jdtensor status` reads, on this machine only.

PURE: standard library only (the launcher's parent and the CLI import it).

Three parties, all files, nothing on the network:

* the launcher registers each attempt of a run in a per-user directory
  (`runs_dir`: mode 0700, owned by the user; ``run-<pid>.json``: its pid,
  command, clients, restarts and report directory, itself 0700 from
  ``mkdtemp``), and removes it when the attempt ends; the folders it makes
  for the whole run (the compilation cache, the trace's parts) are recorded
  there too while they exist (``folder-<pid>-<name>.json``: `track_folder`),
  so that a later launch removes what a SIGKILLed launcher left;
* `jdtensor status` asks (touches ``status-request`` in the report
  directory) and reads the answers;
* while asked (the request is younger than `REQUEST_SECONDS`), each client's
  heartbeat writes ``status-<client>.json`` once a beat: its own view of every
  client (the merged beat: phase, seconds, CPU; waiting shares) and what only
  it knows (where its main thread is, its memory). Nobody asking costs one
  ``stat`` a beat.

On several nodes, node 0's launcher sees the files of its own clients; the
others' phases and shares come from the merged beats its clients hold.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jdtensor import _env
from jdtensor._report import rate_text

__all__ = ["REQUEST_SECONDS", "runs_dir", "register_run", "unregister_run",
           "running_runs", "track_folder", "forget_folder", "request_status", "status_requested", "write_status",
           "read_statuses", "write_waits", "read_waits", "format_status",
           "wait_summary", "PHASE_NAMES", "process_alive", "stall_line", "nan_row"]

# Clients keep answering for this long after the last request.
REQUEST_SECONDS = 10.0
_REQUEST = "status-request"
PHASE_NAMES = {1: "own code", 2: "in JAX", 3: "collective", 4: "at exit"}


def runs_dir(create: bool = False) -> str | None:
  """This user's directory of running launches; None if it is missing (and
  not `create`d) or not safe (not the user's own, or open to others)."""
  base = _env.read_user_runtime_dir()
  if base and os.path.isdir(base):
    path = os.path.join(base, "jdtensor")
  else:
    path = os.path.join(tempfile.gettempdir(), f"jdtensor-{os.getuid()}")
  if create:
    try:
      os.mkdir(path, 0o700)
    except FileExistsError:
      pass
    except OSError:
      return None
  try:
    st = os.lstat(path)
  except OSError:
    return None
  if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()
      or stat.S_IMODE(st.st_mode) & 0o077):
    return None
  return path


def _write_json(path: str, record: Mapping[str, Any]) -> None:
  """Atomically, readable only by the user."""
  tmp = f"{path}.{os.getpid()}.tmp"
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  with os.fdopen(fd, "w") as f:
    json.dump(record, f)
  os.replace(tmp, path)


def _read_json(path: str) -> dict[str, Any] | None:
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError):
    return None
  return data if isinstance(data, dict) else None


def register_run(record: Mapping[str, Any]) -> str | None:
  """Registers a launcher's attempt (`record` has ``pid`` and ``report_dir``);
  the file's path, or None where there is no safe directory. What launchers
  that died without cleaning up (SIGKILL) left is removed first."""
  directory = runs_dir(create=True)
  if directory is None:
    return None
  running_runs()
  path = os.path.join(directory, f"run-{record['pid']}.json")
  try:
    _write_json(path, record)
  except OSError:
    return None
  return path


def unregister_run(path: str | None) -> None:
  if path:
    try:
      os.unlink(path)
    except OSError:
      pass


def process_alive(pid: int) -> bool:
  """Whether process `pid` exists (another user's counts)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


# The folders a launcher makes, by the prefix of their names (`tempfile.
# mkdtemp` in the temporary directory): its report folder, the run's
# compilation cache (`jdtensor.launcher.compile_cache`), the trace's parts
# (`jdtensor.launcher.trace`). Nothing else is ever removed for a dead one.
_OWN_FOLDERS = ("jdtensor-launch-", "jdtensor-compile-cache-", "jdtensor-trace-")


def _remove_own_folder(path: Any) -> None:
  """Removes a dead launcher's folder: only one of ours, where the launcher
  makes them (``<tmp>/jdtensor-launch-*``, ``jdtensor-compile-cache-*``,
  ``jdtensor-trace-*``; a real folder, not a link, this user's), never a
  folder the user named (``--trace``'s file, their own cache)."""
  if not isinstance(path, str) or not path:
    return
  path = os.path.abspath(path)
  if (os.path.dirname(path) != os.path.abspath(tempfile.gettempdir())
      or not os.path.basename(path).startswith(_OWN_FOLDERS)):
    return
  try:
    st = os.lstat(path)
  except OSError:
    return
  if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
    shutil.rmtree(path, ignore_errors=True)


def running_runs() -> list[dict[str, Any]]:
  """Every registered launch of this user that is still running, oldest
  first; the records of launchers that died are removed, with the folders
  they left (a SIGKILLed launcher's report folder, and each it recorded
  with `track_folder`)."""
  directory = runs_dir()
  if directory is None:
    return []
  runs = []
  for path, record in _records(directory, "run-"):
    if process_alive(record["pid"]):
      runs.append(record)
    else:
      _remove_own_folder(record.get("report_dir"))
      unregister_run(path)
  for path, record in _records(directory, "folder-"):
    if not process_alive(record["pid"]):
      _remove_own_folder(record.get("folder"))
      unregister_run(path)
  return sorted(runs, key=lambda r: r.get("started", 0))


def _records(directory: str, prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
  """(path, record) of each ``<prefix>*.json`` in `directory` that names a pid."""
  try:
    names = sorted(os.listdir(directory))
  except OSError:
    return
  for name in names:
    if name.startswith(prefix) and name.endswith(".json"):
      path = os.path.join(directory, name)
      record = _read_json(path)
      if record is not None and isinstance(record.get("pid"), int):
        yield path, record


def track_folder(folder: str) -> str | None:
  """Records that this process made `folder` (one of `_OWN_FOLDERS`) for a
  run: if it dies before it removes it (SIGKILL), the next launch of this
  user removes it (`running_runs`). Returns the record, for
  `forget_folder`; None where there is no safe directory to keep it in."""
  directory = runs_dir(create=True)
  if directory is None:
    return None
  path = os.path.join(directory,
                      f"folder-{os.getpid()}-{os.path.basename(folder)}.json")
  try:
    _write_json(path, {"pid": os.getpid(), "folder": os.path.abspath(folder)})
  except OSError:
    return None
  return path


def forget_folder(record: str | None) -> None:
  """The folder of `record` (`track_folder`) was removed by its launcher."""
  unregister_run(record)


def request_status(report_dir: str) -> float:
  """Asks the clients of the run using `report_dir` to publish their status;
  the request's time (``time.time()``)."""
  path = os.path.join(report_dir, _REQUEST)
  with open(path, "a"):
    pass
  os.utime(path)
  return os.stat(path).st_mtime


def status_requested(report_dir: str, now: float | None = None) -> bool:
  """Whether someone asked within `REQUEST_SECONDS` (one ``stat``)."""
  try:
    asked = os.stat(os.path.join(report_dir, _REQUEST)).st_mtime
  except OSError:
    return False
  return (time.time() if now is None else now) - asked < REQUEST_SECONDS


def write_status(report_dir: str, client: int, record: Mapping[str, Any]) -> None:
  _write_json(os.path.join(report_dir, f"status-{client}.json"), record)


def read_statuses(report_dir: str) -> dict[int, dict[str, Any]]:
  """The clients' latest answers, by client id."""
  out: dict[int, dict[str, Any]] = {}
  try:
    names = os.listdir(report_dir)
  except OSError:
    return out
  for name in names:
    if name.startswith("status-") and name.endswith(".json"):
      record = _read_json(os.path.join(report_dir, name))
      if record is not None and isinstance(record.get("client"), int):
        out[record["client"]] = record
  return out


def write_waits(report_dir: str, client: int, shares: Sequence[float],
                seconds: float, period: float) -> None:
  """A client's record, at its normal end, of how long the others waited for
  each client over the run (every client holds the same one), counted a beat
  of `period` seconds at a time."""
  _write_json(os.path.join(report_dir, f"waits-{client}.json"),
              {"client": client, "shares": list(shares), "seconds": seconds,
               "period": period})


def read_waits(report_dir: str) -> dict[str, Any] | None:
  """The lowest client's waiting record, if any client wrote one."""
  try:
    names = [n for n in os.listdir(report_dir)
             if n.startswith("waits-") and n.endswith(".json") and n[6:-5].isdigit()]
  except OSError:
    return None
  for name in sorted(names, key=lambda n: int(n[6:-5])):
    record = _read_json(os.path.join(report_dir, name))
    if record is not None and isinstance(record.get("shares"), list):
      return record
  return None


# Beats a run's waiting must span before its shares mean anything: one beat
# that finds a client late (a short run, a first step) is 100% of nothing.
MEANINGFUL_BEATS = 10


def wait_summary(record: Mapping[str, Any] | None, uneven: float = 10.0) -> str | None:
  """The launcher's end-of-run line on waiting, when it was uneven (some
  client was waited for at least `uneven` percent of the run) over a run of
  at least `MEANINGFUL_BEATS` beats."""
  if not record:
    return None
  try:
    shares = [float(s) for s in record["shares"]]
    seconds = float(record["seconds"])
    period = float(record["period"])
  except (KeyError, TypeError, ValueError):
    return None
  if len(shares) < 2 or max(shares) < uneven or seconds < MEANINGFUL_BEATS * period:
    return None
  order = sorted(range(len(shares)), key=lambda c: -shares[c])
  parts = [f"client {c} {shares[c]:.0f}%" for c in order]
  return (f"jdtensor launch: the clients waited in collectives unevenly over the "
          f"run ({seconds:.0f} s): share of the run the others waited for each: "
          + ", ".join(parts))


def _duration(seconds: float) -> str:
  seconds = max(0.0, float(seconds))
  if seconds < 60:
    return f"{seconds:.1f} s"
  if seconds < 3600:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"
  return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def _cluster_view(statuses: Mapping[int, Mapping[str, Any]]) -> Mapping[str, Any] | None:
  """The freshest merged beat any client on this node published."""
  views = [s for s in statuses.values() if isinstance(s.get("phases"), list)]
  return max(views, key=lambda s: s.get("beats", 0), default=None)


def _percent(value: float) -> str:
  return "-" if value != value else f"{value:.0f}%"  # NaN: not known here.


def _own_view(statuses: Mapping[int, Mapping[str, Any]]) -> dict[str, Any] | None:
  """Where no client here decides the beats (client 0 runs on another node):
  a view of the clients here, from each one's own state; the waiting shares
  are kept by client 0 alone."""
  own = {c: s["own"] for c, s in statuses.items()
         if isinstance(s.get("own"), list) and len(s["own"]) in (3, 4)}
  if not own:
    return None
  n = max(own) + 1
  unknown = nan_row(n)
  phases = [own[c][0] if c in own else -1 for c in range(n)]
  return {"phases": phases, "seconds": [own.get(c, [0, 0, 0])[1] for c in range(n)],
          "busy": [own[c][2] if c in own else float("nan") for c in range(n)],
          "moved": [own[c][3] if c in own and len(own[c]) > 3 else float("nan")
                    for c in range(n)],
          "waiting": unknown, "waited_for": unknown, "only": sorted(own),
          **{k: v for k, v in next(iter(statuses.values())).items()
             if k in ("window", "threshold")}}


def nan_row(n: int) -> list[float]:
  """n unknown values."""
  return [float("nan")] * n


def stall_line(view: Mapping[str, Any]) -> str:
  """How long a stall must last now and which rule set it: learnt (and
  from what), the ceiling because the run has not shown its rhythm yet or
  the pause in progress began before it, or the set time-out ('' where the
  view does not say)."""
  timeout = view.get("stall_timeout")
  if timeout is None:
    return ""
  if not timeout:
    return "Stall time-out: off (JDTENSOR_STALL_TIMEOUT=0)."
  ceiling = view.get("stall_ceiling", timeout)
  if not view.get("stall_learnt"):
    if not view.get("stall_learn"):
      return f"Stall time-out: {timeout:g} s (JDTENSOR_STALL_TIMEOUT; not learnt)."
    if not view.get("stall_rhythm"):
      return (f"Stall time-out: {timeout:g} s (JDTENSOR_STALL_TIMEOUT: the run has not "
              f"shown its rhythm yet, {view.get('stall_steps', 0)} of "
              f"{view.get('stall_rhythm_steps', 0)} steps).")
    return (f"Stall time-out: {timeout:g} s (JDTENSOR_STALL_TIMEOUT: the pause in "
            "progress began before the run showed its rhythm).")
  longest = view.get("stall_longest")
  seen = ("no idle pause seen" if longest is None
          else f"longest idle pause {longest:g} s")
  return (f"Stall time-out: {timeout:g} s, learnt ({seen}; floor "
          f"{view.get('stall_floor', 0):g} s, ceiling {ceiling:g} s).")


def _where(own: Mapping[str, Any]) -> str:
  """A client's place in its program: its main thread's, or the thread the
  heartbeat watches, named (``train.py:12 loop (thread 'TrainingThread')``)."""
  where = str(own.get("where", "(on another node)" if not own else "?"))
  thread = own.get("thread")
  return where if thread in (None, "main thread") else f"{where} ({thread})"


def format_status(run: Mapping[str, Any], statuses: Mapping[int, Mapping[str, Any]],
                  now: float | None = None) -> str:
  """The table `jdtensor status` prints for one run."""
  now = time.time() if now is None else now
  command = " ".join(run.get("command", []))
  if len(command) > 60:
    command = command[:57] + "..."
  head = (f"jdtensor launch (pid {run.get('pid')}): {run.get('num_clients')} "
          f"client(s), `{command}`, up {_duration(now - run.get('started', now))}, "
          f"restarts {run.get('restarts', 0)}, at {time.strftime('%H:%M:%S', time.localtime(now))}")
  view = _cluster_view(statuses) or _own_view(statuses)
  if view is None:
    return head + ("\n(no client has answered yet: is the heartbeat on, and has "
                   "every client started it?)")
  n = len(view["phases"])
  window = view.get("window", 0)
  rows = [("client", "phase", "for", "where (main thread)", "CPU %", "I/O", "RSS",
           "beats", "restarts", "waiting", "waited for")]
  for c in view.get("only", range(n)):
    own = statuses.get(c, {})
    phase = PHASE_NAMES.get(int(view["phases"][c]), "?")
    rss = own.get("rss_mib")
    rows.append((
        str(c), phase, _duration(view["seconds"][c]),
        _where(own),
        f"{view['busy'][c]:.0f}", rate_text(view.get("moved", nan_row(n))[c]),
        f"{rss:.0f} MiB" if rss is not None else "-",
        str(own.get("beats", view.get("beats", "-"))),
        str(own.get("restarts", run.get("restarts", 0))),
        _percent(view["waiting"][c]), _percent(view["waited_for"][c])))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  right = {0, 4, 5, 6, 7, 8, 9, 10}
  lines = [head, ""]
  for r in rows:
    lines.append("  ".join(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                           for i, cell in enumerate(r)).rstrip())
  age = now - max(float(s.get("at", 0)) for s in statuses.values())
  lines += ["", f"waiting: share of the last {window:g} s each client spent waiting "
            f"in collectives; waited for: share the others spent waiting for it "
            f"(straggler above {view.get('threshold', 0):g}%). Beat data {age:.1f} s old."]
  stall = stall_line(view)
  if stall:
    lines.append(stall)
  if "only" in view:
    lines.append("Only this node's clients: client 0, on another node, decides the "
                 "beats and keeps every client's view and the waiting shares.")
  return "\n".join(lines)
