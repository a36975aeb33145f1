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

from jdtensor._status import process_alive

__all__ = ["wrapped", "signal_groups", "stop_process_groups", "why_it_cannot_start",
           "stop_escaped"]

_POLL_SECONDS = 0.05


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


def stop_process_groups(procs: Sequence[subprocess.Popen], grace: float,
                        killed: list[int] | None = None,
                        cut_short: Callable[[], bool] | None = None) -> list[int]:
  """Stops processes that each lead a process group, and everything in them.

  SIGTERM to every group still running, up to `grace` seconds on one shared
  deadline for them to end, then SIGKILL; each is reaped (10 s at most), and
  grandchildren that outlived their leader are killed too.

  Args:
    procs: The group leaders.
    grace: Seconds between SIGTERM and SIGKILL.
    killed: Receives the indices of the processes that outlived the grace
      (they ignored SIGTERM, or took longer) and were SIGKILLed.
    cut_short: Polled during the grace: True ends it at once (SIGKILL now).

  Returns:
    The indices of the processes that were still running.
  """
  running = [i for i, p in enumerate(procs) if p.poll() is None]
  signal_groups(procs, signal.SIGTERM)
  deadline = time.monotonic() + grace
  while time.monotonic() < deadline and any(p.poll() is None for p in procs):
    if cut_short is not None and cut_short():
      break
    time.sleep(_POLL_SECONDS)
  if killed is not None:
    killed.extend(i for i, p in enumerate(procs) if p.poll() is None)
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
