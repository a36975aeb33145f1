"""What a client tells its launcher, and the launcher's root cause.

PURE: standard library and `jdtensor.errors` only. One typed record
(`Report`), written by the client (`jdtensor.heartbeat`) into
``JDTENSOR_REPORT_DIR`` and read back by the launcher
(`jdtensor.launcher.supervisor`); one pure function of exit codes, reports
and times (`root_cause`) that names the client the run failed because of;
one function that words every summary line (`summary`).

A client writes a report when it leaves with a failure of its own (a
*departure*: an exception, a non-zero exit), or when its heartbeat reaches a
verdict (whom it blames: other clients, or itself when it found itself the
cause: it stalled, was frozen, never joined a collective).
"""

from __future__ import annotations

import json
import re
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, NamedTuple, TypeVar

from jdtensor._ids import ids_text
from jdtensor.errors import PEER_FAILURE_EXIT_CODE

_R = TypeVar("_R")

__all__ = ["Reason", "Report", "ClientEnd", "RootCause", "root_cause", "summary",
           "describe_exit", "mark_finished", "finished_clients", "VerdictStack",
           "stack_lines", "rate_text", "printable", "blame_at_start",
           "withdraw_blame", "StartupStacks"]

# Characters a terminal acts on rather than shows (C0 but tab, DEL, C1): in
# a client's text they could set the window title, clear the screen or hide
# a line; shown escaped instead.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, newlines: bool = False) -> str:
  """`text` with every control character shown escaped (``\\x1b``, ``\\x00``),
  so that a line made of a client's text is only ever shown; `newlines`
  keeps line breaks (a traceback)."""
  pattern = _CONTROL_BUT_NEWLINE if newlines else _CONTROL
  return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def rate_text(moved: float) -> str:
  """Bytes a second for people: ``0 B/s``, ``64.0 KiB/s``, ``3.5 MiB/s``."""
  if moved != moved:  # NaN: not known.
    return "-"
  if moved < 1024:
    return f"{int(moved)} B/s"
  if moved < 2**20:
    return f"{moved / 1024:.1f} KiB/s"
  return f"{moved / 2**20:.1f} MiB/s"


class Reason(NamedTuple):
  """Why a client blames whom, as data; the line for people is made from it
  (`heartbeat_line`), and nothing ever reads a line back.

  Attributes:
    detail: What happened, e.g. ``client 2 missed beat 4 (last seen 1.0 s
      ago)``.
    subject: The clients `detail` begins with (``client 2 missed ...``:
      (2,)); () when it begins otherwise (``beat 4 did not complete ...``,
      ``this client (2) ...``).
    reporter: The client that found it, when its report was relayed here;
      None when this client found it.
  """
  detail: str
  subject: tuple[int, ...] = ()
  reporter: int | None = None

  def heartbeat_line(self) -> str:
    """``heartbeat: <detail>[ (reported by client N)]``."""
    by = "" if self.reporter is None else f" (reported by client {self.reporter})"
    return f"heartbeat: {printable(self.detail, newlines=True)}{by}"


def mark_finished(directory: str, client: int) -> None:
  """Records that `client` ended its script normally (it then waits for the
  others at exit): a launcher stop after that did not stop its work."""
  try:
    with open(os.path.join(directory, f"client-{client}.finished"), "w"):
      pass
  except OSError:
    pass  # The launcher then counts it among the stopped, as before.


def finished_clients(directory: str) -> set[int]:
  """The clients that ended their script normally (`mark_finished`)."""
  return _clients_with(directory, ".finished")


def mark_first_step(directory: str, client: int, at: float) -> None:
  """Records when `client` completed its first step (`jdtensor.step_done`)."""
  try:
    with open(os.path.join(directory, f"client-{client}.first-step"), "w") as f:
      f.write(repr(at))
  except OSError:
    pass  # The launcher then gives no time to the first step.


def first_steps(directory: str, clients: Sequence[int]) -> float | None:
  """When the last of `clients` completed its first step, or None while one
  has not said so (`mark_first_step`)."""
  if not _clients_with(directory, ".first-step") >= set(clients):
    return None
  times = []
  for client in clients:
    try:
      with open(os.path.join(directory, f"client-{client}.first-step")) as f:
        times.append(float(f.read()))
    except (OSError, ValueError):
      return None
  return max(times)


def blame_at_start(directory: str, client: int, reason: Reason) -> None:
  """Records that `client`'s start-up failed because of `reason.subject`
  (client 0's JAX coordination service never came up): its departure then
  names them (`Report.read_all`), and the launcher's root cause is theirs,
  not this client's, which only waited for them."""
  try:
    _write_record(os.path.join(directory, f"client-{client}.blame"),
                  {"client": client, "detail": reason.detail,
                   "subject": list(reason.subject)})
  except OSError:
    pass  # The launcher then names this client, by its own error.


class _Blame(NamedTuple):
  """A `blame_at_start` record."""
  client: int
  detail: str
  subject: tuple[int, ...]


def withdraw_blame(directory: str, client: int) -> None:
  """A new start-up of `client`: an earlier try's blame no longer holds."""
  try:
    os.remove(os.path.join(directory, f"client-{client}.blame"))
  except OSError:
    pass  # None was written.


def _clients_with(directory: str, suffix: str) -> set[int]:
  """The ids of the ``client-<id><suffix>`` files in `directory` (names
  only: nothing is read)."""
  try:
    names = os.listdir(directory)
  except OSError:
    return set()
  out = set()
  for name in names:
    if name.startswith("client-") and name.endswith(suffix):
      try:
        out.add(int(name[len("client-"):-len(suffix)]))
      except ValueError:
        continue
  return out


def describe_exit(code: int) -> str:
  """``exited with code 3`` or ``was killed by SIGKILL``, for a return code."""
  if code < 0:
    try:
      return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
      return f"was killed by signal {-code}"
  return f"exited with code {code}"


def _write_record(path: str, record: Mapping[str, object]) -> None:
  """`record` as JSON at `path`, atomically (the launcher may read at any time)."""
  with open(path + ".tmp", "w") as f:
    json.dump(record, f)
  os.replace(path + ".tmp", path)


def _read_records(directory: str, suffix: str, parse: Callable[[dict], _R]
                  ) -> dict[int, _R]:
  """Every ``client-<id><suffix>`` in `directory` that `parse` takes, by its
  ``client`` field; a malformed or half-gone one is skipped."""
  out: dict[int, _R] = {}
  try:
    names = os.listdir(directory)
  except OSError:
    return out
  for name in names:
    if not (name.startswith("client-") and name.endswith(suffix)):
      continue
    try:
      with open(os.path.join(directory, name)) as f:
        record = parse(json.load(f))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
      continue
    out[record.client] = record  # type: ignore[attr-defined]
  return out


class Report(NamedTuple):
  """What one client told the launcher.

  Attributes:
    client: Its id.
    culprits: Whom it blames ([itself] when it found itself the cause).
    why: Its reason, as it printed it (for people; never read back).
    at: When (``time.time()``).
    departure: A client that failed by itself telling when it left, rather
      than a verdict on others.
    leaving: The client leaves because of this verdict (its heartbeat's
      policy is terminate): it ends by itself, the launcher need not stop it.
    detail: The reason alone: a verdict's `Reason.detail`; a departure's
      exception (``ZeroDivisionError: ... (train.py:42 in step)``), '' for
      an exit code, which says it all.
    subject: A verdict's `Reason.subject`; a departure's, where it left
      because of other clients (`blame_at_start`).
    reporter: A verdict's `Reason.reporter`.
  """
  client: int
  culprits: tuple[int, ...]
  why: str
  at: float | None = None
  departure: bool = False
  leaving: bool = False
  detail: str = ""
  subject: tuple[int, ...] = ()
  reporter: int | None = None

  def write(self, directory: str) -> None:
    """Atomically, as ``client-<id>.json`` (the launcher may read at any time)."""
    path = os.path.join(directory, f"client-{self.client}.json")
    record = {**self._asdict(), "culprits": list(self.culprits),
              "subject": list(self.subject)}
    _write_record(path, record)

  @staticmethod
  def read_all(directory: str) -> dict[int, Report]:
    """Every well-formed report in `directory`, by client; others are skipped."""
    def parse(data: dict) -> Report:
      at = data.get("at")
      reporter = data.get("reporter")
      return Report(int(data["client"]), tuple(int(c) for c in data["culprits"]),
                    str(data["why"]),
                    float(at) if isinstance(at, (int, float)) else None,
                    bool(data.get("departure", False)),
                    bool(data.get("leaving", False)),
                    str(data.get("detail", "")),
                    tuple(int(c) for c in data.get("subject", ())),
                    None if reporter is None else int(reporter))
    reports = _read_records(directory, ".json", parse)
    # A start-up that failed waiting for other clients: it left because of
    # them (its own error stays in `why`).
    blames = _read_records(directory, ".blame", lambda data: _Blame(
        int(data["client"]), str(data["detail"]), tuple(int(c) for c in data["subject"])))
    for client, blame in blames.items():
      report = reports.get(client)
      if report is not None and report.departure and blame.subject:
        reports[client] = report._replace(culprits=blame.subject, detail=blame.detail,
                                          subject=blame.subject)
    return reports

  @property
  def on_its_way_out(self) -> bool:
    """Whether the client said it is ending by itself (a departure, or a
    verdict under policy terminate)."""
    return self.departure or self.leaving

  @property
  def blames_others(self) -> bool:
    """A departure because of other clients (`blame_at_start`): a
    consequence, like a client the heartbeat stopped."""
    return self.departure and self.client not in self.culprits

  @property
  def own_reason(self) -> str | None:
    """Why this client failed, in its own words, when it says more than its
    exit code: its exception, or a verdict it reached on itself."""
    if self.departure or self.culprits == (self.client,):
      return self.detail or None
    return None

  def naming(self, client: int) -> str:
    """This verdict as a summary names `client` by it: its detail, after the
    client's name unless the detail begins with it."""
    if self.subject == (client,):
      return self.detail
    return f"client {client}: {self.detail}"


class ClientEnd(NamedTuple):
  """How one client ended, as the launcher saw it.

  Attributes:
    client: Its id.
    code: Its return code (negative: killed by that signal); None: running.
    ended_at: When the launcher saw it end (``time.time()``).
  """
  client: int
  code: int | None
  ended_at: float | None = None


class RootCause(NamedTuple):
  """The client the run failed because of.

  Attributes:
    client: Its id.
    what: E.g. ``client 1 exited with code 1: ZeroDivisionError: ...``.
    own: Whether it failed by itself (else: named by the others).
    at: When it failed (``time.time()``).
    exit_code: What the launcher exits with.
  """
  client: int
  what: str
  own: bool
  at: float
  exit_code: int


def _exit_code(code: int | None) -> int:
  """The launcher's exit code for a client's return code (128 + signal for a
  killed one; 1 for one whose own code was 0 or unknown)."""
  if code is None or code == 0:
    return 1
  return code if code > 0 else 128 - code


def root_cause(ends: Sequence[ClientEnd], reports: Mapping[int, Report],
               now: float | None = None) -> RootCause | None:
  """The root cause of a failed run, from exit codes, reports and times.

  1. The earliest client that failed by itself (a non-zero code that is not
     a consequence's 75, nor a start-up that failed waiting for others:
     `Report.blames_others`), by its own account of when it left (client 0
     leaves last on purpose), else by when it was seen to end; with its
     reason when it gave one.
  2. Else, where every client is named by every other (a verdict on the
     whole run: a deadlock), that verdict's words alone; else the client the
     reports name most (ties: the one named by the lowest reporter), with
     the first reporter's reason and who named it.
  3. Else, the first client seen to end with a non-zero code.

  Returns:
    None when no client failed.
  """
  now = time.time() if now is None else now
  failed = [e for e in ends if e.code not in (None, 0)]
  if not failed:
    return None

  def failed_at(end: ClientEnd) -> float:
    report = reports.get(end.client)
    if report is not None and report.departure and report.at is not None:
      return report.at
    return end.ended_at if end.ended_at is not None else now
  def consequence(end: ClientEnd) -> bool:
    report = reports.get(end.client)
    return (end.code == PEER_FAILURE_EXIT_CODE
            or (report is not None and report.blames_others))
  own = sorted((e for e in failed if not consequence(e)),
               key=lambda e: (failed_at(e), e.client))
  if own:
    end = own[0]
    what = f"client {end.client} {describe_exit(end.code)}"  # type: ignore[arg-type]
    report = reports.get(end.client)
    reason = report.own_reason if report is not None else None
    if reason:
      what += f": {reason}"
    return RootCause(end.client, what, True, failed_at(end), _exit_code(end.code))
  named: dict[int, list[int]] = {}
  for reporter, report in sorted(reports.items()):
    if not report.departure or report.blames_others:
      for c in report.culprits:
        named.setdefault(c, []).append(reporter)
  clients = {e.client for e in ends}
  if len(clients) > 1 and set(named) == clients and all(
      len(set(by) - {c}) == len(clients) - 1 for c, by in named.items()):
    # Every client named by every other (a deadlock): the verdict is the
    # run's, no one client's; its words, with the lowest client's number.
    client = min(clients)
    code = next((e.code for e in ends if e.client == client), None)
    return RootCause(client, reports[min(reports)].detail, False, now, _exit_code(code))
  if named:
    client = max(named, key=lambda c: (len(named[c]), -min(named[c])))
    why = reports[named[client][0]].naming(client)
    others = [r for r in named[client] if r != client]
    if others:
      why += (f" (named by client{'s' if len(others) > 1 else ''} "
              f"{ids_text(others)})")
    code = next((e.code for e in ends if e.client == client), None)
    return RootCause(client, why, False, now, _exit_code(code))
  end = min(failed, key=lambda e: (e.ended_at if e.ended_at is not None else now,
                                   e.client))
  return RootCause(end.client, f"client {end.client} {describe_exit(end.code)}",  # type: ignore[arg-type]
                   False, end.ended_at if end.ended_at is not None else now,
                   _exit_code(end.code))


def summary(what: str, stopped: Sequence[int] | None = None, *, node: int | None = None,
            also: Sequence[str] = (), killed: Sequence[int] = (),
            grace: float = 0.0, cut_short: str | None = None,
            frozen: Sequence[int] = ()) -> str:
  """Every summary line of the launcher, one node or several.

  ``jdtensor launch[ (node k)]: <what>; stopped clients 0, 2[ (client 2
  frozen (SIGSTOP, or a debugger): killed at once)][ (client 0 ignored
  SIGTERM for 5 s: killed)][ (also: client 3 exited with code 75)]``.
  "Stopped clients" are the ones the launcher's stop ended (the root cause
  too, where it was not on its own way out). `stopped` None leaves the stop
  out (a restart's own line has it inside `what`). `frozen`: the clients
  killed without a grace, being stopped processes that cannot act on
  SIGTERM. `cut_short`: why the grace was cut short (``SIGINT again``): the
  clients still running then were killed at once. A long list of ids is
  written as runs (``0, 2-299``).
  """
  head = "jdtensor launch" + (f" (node {node})" if node is not None else "")
  text = f"{head}: {printable(what)}"
  if stopped is not None:
    text += f"; stopped clients {ids_text(stopped) or 'none'}"
  if frozen:
    text += (f" (client{'s' if len(frozen) > 1 else ''} {ids_text(frozen)} frozen "
             "(SIGSTOP, or a debugger): killed at once)")
  if killed:
    which = f"client{'s' if len(killed) > 1 else ''} {ids_text(killed)}"
    text += (f" ({which} killed at once: {cut_short})" if cut_short else
             f" ({which} ignored SIGTERM for {grace:g} s: killed)")
  if also:
    text += f" (also: {', '.join(also)})"
  return text


class VerdictStack(NamedTuple):
  """Where one client's main thread was when its heartbeat named a verdict
  (`jdtensor.heartbeat`: written beside its report; the launcher shows it
  under the verdict, and `stacks` in the client's log).

  Attributes:
    client: Its id.
    phase: Its main thread's phase then (``own code``, ``collective``, ...).
    where: The main thread's innermost frames, one line.
    stacks: Every thread's stack, whole.
  """
  client: int
  phase: str
  where: str
  stacks: str = ""

  def write(self, directory: str) -> None:
    """Atomically, as ``client-<id>.stack``."""
    _write_record(os.path.join(directory, f"client-{self.client}.stack"), self._asdict())

  @staticmethod
  def answered(directory: str) -> set[int]:
    """The clients that wrote theirs (names only: cheap to poll)."""
    return _clients_with(directory, ".stack")

  @staticmethod
  def read_all(directory: str) -> dict[int, VerdictStack]:
    """Every well-formed record in `directory`, by client."""
    return _read_records(directory, ".stack", lambda data: VerdictStack(
        int(data["client"]), str(data["phase"]), str(data["where"]),
        str(data.get("stacks", ""))))


def stack_lines(clients: Sequence[int], stacks: Mapping[int, VerdictStack],
                ended: Mapping[int, int], node: int | None = None) -> list[str]:
  """The launcher's lines under a verdict: each client's main thread, one
  line per distinct place (clients in the same place share it, so a pod's
  thousand waiters are one line).

  Args:
    clients: The clients to account for, in order.
    stacks: Their `VerdictStack` records, by client.
    ended: The exit codes of those that ended without one.
    node: This node's rank, in a run of several nodes (as `summary`).
  """
  groups: dict[str, list[int]] = {}
  for client in clients:
    record = stacks.get(client)
    if record is not None:
      text = f"{printable(record.where)} ({record.phase})"
    elif client in ended:
      text = f"{describe_exit(ended[client])} (no stack: it ended first)"
    else:
      text = ("did not answer (stopped, or its interpreter held by C code, or no "
              "heartbeat)")
    groups.setdefault(text, []).append(client)
  head = "jdtensor launch" + (f" (node {node})" if node is not None else "")
  lines = [f"{head}: main threads when the verdict was named:"]
  for text, members in groups.items():
    lines.append(f"  client{'s' if len(members) > 1 else ''} {ids_text(members)}: {text}")
  return lines


# faulthandler's dump of one thread (CPython 3.11 to 3.13): a header line,
# then a frame a line, the innermost first.
_DUMP_THREAD = re.compile(r"^(?:Current thread|Thread) 0x([0-9a-fA-F]+)\b.*$", re.M)
_DUMP_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')


class StartupStacks:
  """A client's stacks while it starts, before a heartbeat can answer for
  it (`VerdictStack`): the start-up writes a first line, its pid and the
  thread it runs on (`begin`), then has faulthandler write every thread's
  stack into the same file on SIGUSR1 (the guardian's SIGUSR1 stays ignored
  until then). The launcher asks a client that stays silent at a verdict
  (`waiting`: the pid to signal) and reads that thread's innermost frames
  (`read`): client 0 whose JAX coordination service never came up shows
  where it is."""

  @staticmethod
  def _path(directory: str, client: int) -> str:
    return os.path.join(directory, f"client-{client}.startup")

  @staticmethod
  def begin(directory: str, client: int, pid: int, thread: int) -> IO[str] | None:
    """The file to give faulthandler, its first line written; None where it
    cannot be written (then nobody asks)."""
    try:
      f = open(StartupStacks._path(directory, client), "w")
    except OSError:
      return None
    try:
      f.write(json.dumps({"client": client, "pid": pid, "thread": thread}) + "\n")
      f.flush()
    except OSError:
      f.close()
      return None
    return f

  @staticmethod
  def end(directory: str, client: int, f: IO[str]) -> None:
    """The start-up is over: the file goes (nobody can answer on it now)."""
    f.close()
    try:
      os.remove(StartupStacks._path(directory, client))
    except OSError:
      pass

  @staticmethod
  def _read(directory: str, client: int) -> tuple[dict, str] | None:
    try:
      with open(StartupStacks._path(directory, client)) as f:
        head, body = json.loads(f.readline()), f.read()
    except (OSError, ValueError):
      return None
    if not isinstance(head, dict) or not all(
        isinstance(head.get(k), int) for k in ("pid", "thread")):
      return None
    return head, body

  @staticmethod
  def waiting(directory: str) -> dict[int, tuple[int, int]]:
    """The clients still starting, by id: (their pid, the bytes of stacks
    written so far)."""
    out = {}
    for client in _clients_with(directory, ".startup"):
      got = StartupStacks._read(directory, client)
      if got is not None:
        out[client] = (got[0]["pid"], len(got[1]))
    return out

  @staticmethod
  def read(directory: str, client: int) -> VerdictStack | None:
    """Where the start-up's thread was at the last dump, or None (none yet)."""
    got = StartupStacks._read(directory, client)
    if got is None:
      return None
    head, body = got
    ours = [m for m in _DUMP_THREAD.finditer(body) if int(m.group(1), 16) == head["thread"]]
    if not ours:
      return None
    frames = []
    for line in body[ours[-1].end():].lstrip("\n").splitlines():
      frame = _DUMP_FRAME.match(line)
      if frame is None:
        break
      frames.append(f"{os.path.basename(frame.group(1))}:{frame.group(2)} {frame.group(3)}")
    return VerdictStack(client, "start-up", " <- ".join(frames[:3]) or "(no Python frame)",
                        body.strip())
