"""The clients' processes: each in its own group, under a guardian, stopped
with a grace.

PURE of JAX: standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from jdtensor._report import StartupStacks, VerdictStack
from jdtensor._status import process_alive

__all__ = ["wrapped", "signal_groups", "stop_process_groups", "why_it_cannot_start",
           "stop_escaped", "frozen_groups", "Orphans", "ask_starting_clients"]

_POLL_SECONDS = 0.05
# prctl(2) options (linux/prctl.h).
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
# How often, at most, the children are listed while one of them has ended
# (a zombie the launcher must not reap, a client not yet polled, stays one
# until the launcher's own poll).
_REAP_SCAN_SECONDS = 0.2


# The guardian: the launcher's direct child for each client, in its own
# process group, that runs the command as its child and stays alive as a
# small supervisor. When the launcher dies (even by SIGKILL), the kernel sends
# the guardian SIGUSR2 (PR_SET_PDEATHSIG), and it SIGKILLs its whole process
# group: the client, a wrapper shell and every grandchild. The command itself
# dies with the guardian (its own PR_SET_PDEATHSIG). The launcher's SIGTERM
# and SIGINT reach the whole group; the guardian ignores them (with a Python
# handler, so the command does not inherit an ignored signal) and waits for
# the command, then exits with its code, or dies of its signal. SIGUSR1 is
# ignored: the launcher forwards it, a jdtensor client installs a stack dump
# for it, and any other program must not die of it. Python runs only in this
# fresh, single-threaded process, never in a fork of a multithreaded one.
# It runs once per client: `_signal` (the C module `signal` wraps in enums)
# and no site imports keep its start-up CPU low (benchmarks/RESULTS.md,
# "Start-up scaling").
_GUARDIAN = """\
import _signal as signal, ctypes, os, sys
launcher, command = int(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
def launcher_gone(signum, frame):
  os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGUSR2, launcher_gone)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
  signal.signal(sig, lambda signum, frame: None)
libc.prctl(1, signal.SIGUSR2)
if os.getppid() != launcher:
  os.killpg(0, signal.SIGKILL)
guardian = os.getpid()
child = os.fork()
if child == 0:
  libc.prctl(1, signal.SIGKILL)
  if os.getppid() != guardian:
    os._exit(137)
  try:
    os.execvp(command[0], command)
  except OSError as e:
    os.write(2, f"jdtensor launch: cannot start {command[0]!r}: {e.strerror}\\n".encode())
    os._exit(127)
while True:
  try:
    _, status = os.waitpid(child, 0)
    break
  except InterruptedError:
    continue
if os.WIFSIGNALED(status):
  sig = os.WTERMSIG(status)
  if sig not in (signal.SIGKILL, signal.SIGSTOP):
    signal.signal(sig, signal.SIG_DFL)
  os.kill(guardian, sig)
os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)
"""


def why_it_cannot_start(program: str, env: Mapping[str, str]) -> str | None:
  """Why ``execvp(program)`` would surely fail for the clients, or None.

  Checked once, in the launcher, before any client starts: otherwise every
  client says the same thing and each ends with code 127. Only what is
  certain is refused (no such file, or no execute permission, searched as
  ``execvp`` searches the clients' ``PATH``); anything else, a bad ``#!``
  line for one, is left to the exec itself.
  """
  if os.sep in program:
    candidates = [program]
  else:
    directories = env.get("PATH", os.defpath).split(os.pathsep)
    candidates = [os.path.join(d or os.curdir, program) for d in directories]
  found = [c for c in candidates if os.path.exists(c)]
  if any(os.path.isfile(c) and os.access(c, os.X_OK) for c in found):
    return None
  hint = (f"; to run a Python script, give the interpreter: jdtensor launch ... "
          f"-- python {program}" if program.endswith(".py") else "")
  if found and hint:
    return f"it is not executable{hint}"
  if found:
    what = "a directory" if all(os.path.isdir(c) for c in found) else "not executable"
    return f"it is {what}"
  if os.sep in program:
    return "no such file"
  return f"no such command in the clients' PATH{hint}"


def wrapped(command: Sequence[str]) -> list[str]:
  return [sys.executable, "-S", "-c", _GUARDIAN, str(os.getpid()), *command]


def signal_groups(procs: Sequence[subprocess.Popen], sig: int) -> None:
  for proc in procs:
    if proc.poll() is None:
      try:
        os.killpg(proc.pid, sig)
      except ProcessLookupError:
        pass


def _stat_fields(pid: int | str) -> list[bytes] | None:
  """/proc/PID/stat's fields after the command's name (state, ppid, pgrp,
  ...), or None (gone, or not Linux)."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[1].split()
  except (OSError, IndexError):
    return None


def _processes() -> list[tuple[int, list[bytes]]]:
  """Every process's pid and `_stat_fields` (Linux; elsewhere none)."""
  try:
    names = [name for name in os.listdir("/proc") if name.isdecimal()]
  except OSError:
    return []
  found = []
  for name in names:
    fields = _stat_fields(name)
    if fields is not None and len(fields) > 2:
      found.append((int(name), fields))
  return found


def frozen_groups(procs: Sequence[subprocess.Popen]) -> list[int]:
  """The indices of the running group leaders in `procs` (the clients'
  guardians) that are, or whose child in their group (the client, the
  command) is, a stopped process (state T: SIGSTOP, SIGTSTP; t: held by a
  debugger). A stopped process cannot act on SIGTERM (it stays pending
  until SIGCONT), so a grace spent on it is spent for nothing, and its stack
  cannot be had either. A stopped process the client started does not
  count: the client itself may still save its work."""
  leaders = {p.pid: i for i, p in enumerate(procs) if p.returncode is None}
  if not leaders:
    return []
  frozen = set()
  for pid, fields in _processes():
    # The leader itself, or its child in its group (a guardian's client).
    leader = pid if pid in leaders else int(fields[1])
    if fields[0] in (b"T", b"t") and leader in leaders and int(fields[2]) == leader:
      frozen.add(leaders[leader])
  return sorted(frozen)


def stop_process_groups(procs: Sequence[subprocess.Popen], grace: float,
                        killed: list[int] | None = None,
                        cut_short: Callable[[], bool] | None = None,
                        frozen: list[int] | None = None) -> list[int]:
  """Stops processes that each lead a process group, and everything in them.

  SIGTERM to every group still running, up to `grace` seconds on one shared
  deadline for them to end, then SIGKILL; a group that holds a stopped
  process (`frozen_groups`) is SIGKILLed at once instead. Each is reaped
  (10 s at most), and grandchildren that outlived their leader are killed
  too.

  Args:
    procs: The group leaders.
    grace: Seconds between SIGTERM and SIGKILL.
    killed: Receives the indices of the processes that outlived the grace
      (they ignored SIGTERM, or took longer) and were SIGKILLed.
    cut_short: Polled during the grace: True ends it at once (SIGKILL now).
    frozen: Receives the indices of the processes killed at once, stopped.

  Returns:
    The indices of the processes that were still running.
  """
  running = [i for i, p in enumerate(procs) if p.poll() is None]
  signal_groups(procs, signal.SIGTERM)
  stopped = frozen_groups(procs) if running and grace > 0 else []
  for i in stopped:
    try:
      os.killpg(procs[i].pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  if frozen is not None:
    frozen.extend(stopped)
  deadline = time.monotonic() + grace
  while time.monotonic() < deadline and any(p.poll() is None for p in procs):
    if cut_short is not None and cut_short():
      break
    time.sleep(_POLL_SECONDS)
  if killed is not None:
    killed.extend(i for i, p in enumerate(procs) if p.poll() is None and i not in stopped)
  signal_groups(procs, signal.SIGKILL)
  for proc in procs:
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      pass  # Unkillable (D state); reported by its None return code.
  for proc in procs:  # Grandchildren that outlived their leader.
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
  return running


def _carrying(marker: bytes) -> list[int]:
  """The processes whose environment holds `marker` (a ``NAME=value\\0``
  entry), this one left out (Linux: /proc/PID/environ, readable for this
  user's processes; elsewhere none)."""
  found = []
  try:
    pids = [int(name) for name in os.listdir("/proc") if name.isdecimal()]
  except OSError:
    return found
  me = os.getpid()
  for pid in pids:
    if pid == me:
      continue
    try:
      with open(f"/proc/{pid}/environ", "rb") as f:
        if marker in f.read():
          found.append(pid)
    except OSError:
      continue  # Gone, or another user's.
  return found


def stop_escaped(name: str, value: str, grace: float) -> list[int]:
  """Stops the processes a run's clients left behind outside their process
  groups: a data loader's worker that called ``setsid()``, a daemon. A
  forked child keeps its parent's environment, so each still carries the
  launcher's `name`=`value` (its run folder); SIGTERM, up to `grace`
  seconds, then SIGKILL (a fork of a JAX client inherits JAX's SIGTERM
  handler, which only records the notice).

  Returns:
    The process ids found.
  """
  marker = b"\0" + f"{name}={value}".encode() + b"\0"
  pids = _carrying(marker)
  for sig in (signal.SIGTERM, signal.SIGKILL):
    for pid in pids:
      try:
        os.kill(pid, sig)
      except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 0)
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
      time.sleep(_POLL_SECONDS)
  return pids


def _alive(pid: int) -> bool:
  return process_alive(pid) and not _zombie(pid)


def _zombie(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
  except (OSError, IndexError):
    return False


def _subreaper(on: bool | None = None) -> bool | None:
  """This process's child-subreaper flag (Linux's ``PR_SET_CHILD_SUBREAPER``):
  set to `on` unless None; returns the flag as it was, or None where it
  cannot be read (not Linux)."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    libc = ctypes.CDLL(None, use_errno=True)
    was = ctypes.c_int(0)
    if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0:
      return None
    if on is not None and libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
      return None
    return bool(was.value)
  except (OSError, AttributeError):
    return None


class Orphans:
  """The processes this launcher adopts: its clients' descendants that were
  orphaned (a data loader's worker whose client died, a daemon that forked
  twice and left its session with ``setsid()``). They become the launcher's
  children because it is pid 1 (a container's init), or because it made
  itself a child subreaper (`adopt`): reaped as they end, while the run
  goes on (at pid 1 nobody else would: zombies would pile up), and stopped
  with the run (`stop`), however they changed their session or environment.

  Only the processes that became this process's children after `adopt`
  and are not the launcher's own (the clients' guardians, whose exit status
  `subprocess.Popen` reads: `own`) are ever signalled or reaped.

  Args:
    own: The pids of the launcher's own children still to be reaped by
      their `subprocess.Popen`.
  """

  def __init__(self, own: Callable[[], set[int]] = set):
    self.own = own
    self.adopting = False
    self._was: bool | None = None
    self._before: set[int] = set()
    self._scanned = 0.0

  def adopt(self) -> bool:
    """Makes this process its descendants' reaper (it is already at pid 1),
    and remembers its children now (not the run's); whether it adopts."""
    self._before = set(self._children())
    if os.getpid() == 1:
      self.adopting = True
    else:
      self._was = _subreaper(True)
      self.adopting = self._was is not None
    return self.adopting

  def release(self) -> None:
    """Gives the subreaper flag back as it was."""
    if self._was is False:
      _subreaper(False)
    self._was = None
    self.adopting = False

  @staticmethod
  def _children() -> list[int]:
    me = str(os.getpid()).encode()
    return [pid for pid, fields in _processes() if fields[1] == me]

  def adopted(self) -> list[int]:
    """The adopted processes now (ended ones not yet reaped included)."""
    if not self.adopting:
      return []
    skip = self._before | self.own()
    return [pid for pid in self._children() if pid not in skip]

  def reap(self) -> int:
    """Reaps the adopted processes that have ended; how many. One system
    call while no child has ended (`waitid` that looks, never reaps)."""
    if not self.adopting:
      return 0
    try:
      ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
      return 0
    now = time.monotonic()
    if ended is None or now - self._scanned < _REAP_SCAN_SECONDS:
      return 0
    self._scanned = now
    return self._reap(self.adopted())

  @staticmethod
  def _reap(pids: Sequence[int]) -> int:
    reaped = 0
    for pid in pids:
      try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
          reaped += 1
      except ChildProcessError:
        continue
    return reaped

  def stop(self, grace: float) -> list[int]:
    """The run's end: SIGTERM to every adopted process, up to `grace`
    seconds, then SIGKILL; each reaped. Those adopted meanwhile (the
    children of one that ended) get the same, without a new grace.

    Returns:
      The pids stopped.
    """
    stopped: list[int] = []
    if not self.adopting:
      return stopped
    deadline = time.monotonic() + grace
    cutoff = deadline + 2.0  # Adoptions after the SIGKILL: bounded too.
    while True:
      alive = self.adopted()
      self._reap(alive)
      alive = [pid for pid in alive if process_alive(pid)]
      if not alive or time.monotonic() > cutoff:
        return stopped
      late = time.monotonic() >= deadline
      for pid in alive:
        if pid not in stopped or late:
          try:
            os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
          except ProcessLookupError:
            pass
          if pid not in stopped:
            stopped.append(pid)
      time.sleep(_POLL_SECONDS)


def ask_starting_clients(report_dir: str, groups: Mapping[int, int],
                         wait: float) -> dict[int, VerdictStack]:
  """Where the clients still in their start-up are (no heartbeat answers
  for them yet: `jdtensor._report.StartupStacks`): each is sent SIGUSR1,
  and what it wrote is read within `wait` seconds.

  Args:
    report_dir: The run's report folder.
    groups: The clients to ask, by id: the process group each runs in (its
      guardian's pid); a pid outside it is never signalled.
    wait: Seconds to wait for the answers.

  Returns:
    Each answer, by client.
  """
  asked: dict[int, int] = {}
  for client, (pid, size) in StartupStacks.waiting(report_dir).items():
    try:
      if client not in groups or os.getpgid(pid) != groups[client]:
        continue
      os.kill(pid, signal.SIGUSR1)
    except OSError:
      continue
    asked[client] = size
  got: dict[int, VerdictStack] = {}
  last = dict(asked)
  deadline = time.monotonic() + wait
  while asked and time.monotonic() < deadline:
    time.sleep(_POLL_SECONDS)
    now = StartupStacks.waiting(report_dir)
    for client, size in list(asked.items()):
      written = now.get(client, (0, size))[1]
      # faulthandler writes from its signal handler: read once it wrote
      # something and then nothing more for a poll.
      if written > size and written == last[client]:
        record = StartupStacks.read(report_dir, client)
        if record is not None:
          got[client] = record
          del asked[client]
      last[client] = written
  return got
