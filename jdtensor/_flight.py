"""The flight recorder: what this client's main thread is doing, sampled by
the heartbeat thread once a beat.

Each beat carries every client's phase and how long it has been in it, so
every client can tell the same story about a run that stopped moving:

* `WAITING` -- the process holds a result of a computation that spans every
  client and is not ready yet: it has issued a collective and waits for the
  others to join it (or for it to finish);
* `IN_JAX` -- no such result, but the main thread is inside JAX's own Python
  code (tracing, compiling, transferring): busy, never a staller;
* `RUNNING` -- neither: the main thread runs (or is blocked in) the
  program's own Python or C code: a data loader, a file system, a lock;
* `AT_EXIT` -- the script has ended normally and the client waits for the
  others to end too.

Whether a computation spans every client is read from the arrays JAX holds
(``jax.live_arrays()``: not ready, and placed on devices of every process),
not from the main thread's stack: a blocking read of a result happens in C++
with no JAX frame on the stack. The stack is used only to tell `IN_JAX`, and
to say where a client is (``data.py:88 next_batch``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["RUNNING", "IN_JAX", "WAITING", "AT_EXIT", "PHASE_NAMES",
           "MainThreadRecorder", "spans_every_process", "stack_top",
           "format_stacks"]

RUNNING, IN_JAX, WAITING, AT_EXIT = 1, 2, 3, 4
PHASE_NAMES = {RUNNING: "running its own code", IN_JAX: "in JAX",
               WAITING: "waiting in a collective", AT_EXIT: "at exit"}


def spans_every_process(arrays: Iterable[Any], num_processes: int) -> bool:
  """Whether some array is not ready and has devices on every process."""
  seen: dict[int, bool] = {}  # id(sharding) -> spans every process
  for array in arrays:
    try:
      if array.is_ready():
        continue
      sharding = array.sharding
      key = id(sharding)
      if key not in seen:
        seen[key] = len({d.process_index for d in sharding.device_set}) >= (
            num_processes)
      if seen[key]:
        return True
    except Exception:  # pylint: disable=broad-except
      continue  # Deleted or donated under us.
  return False


def _package_dirs() -> tuple[str, ...]:
  dirs = []
  for name in ("jax", "jaxlib"):
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None):
      dirs.append(os.path.dirname(os.path.abspath(module.__file__)) + os.sep)
  return tuple(dirs)


def stack_top(frame: Any, depth: int = 3) -> str:
  """The innermost `depth` frames: ``data.py:88 next_batch <- train.py:40 main``."""
  entries = traceback.extract_stack(frame)[-depth:]
  return " <- ".join(f"{os.path.basename(e.filename)}:{e.lineno} {e.name}"
                     for e in reversed(entries)) or "(no Python frame)"


def format_stacks(frames: dict[int, Any] | None = None) -> str:
  """Every thread's Python stack, the main thread first."""
  frames = sys._current_frames() if frames is None else frames  # pylint: disable=protected-access
  names = {t.ident: t.name for t in threading.enumerate()}
  main = threading.main_thread().ident
  out = []
  for ident in sorted(frames, key=lambda i: (i != main, names.get(i, ""))):
    out.append(f"Thread {names.get(ident, ident)!r} (most recent call last):\n"
               + "".join(traceback.format_stack(frames[ident])).rstrip())
  return "\n".join(out)


class MainThreadRecorder:
  """Samples the main thread's phase; tracks since when it has been in it.

  Args:
    num_processes: Number of clients.
    live_arrays: Returns the arrays JAX holds (``jax.live_arrays``).
    main_frame: Returns the main thread's current frame (None if gone).
    clock: Monotonic seconds.
  """

  def __init__(self, num_processes: int,
               live_arrays: Callable[[], Iterable[Any]],
               main_frame: Callable[[], Any] | None = None,
               clock: Callable[[], float] = time.monotonic):
    self.num_processes = num_processes
    self._live_arrays = live_arrays
    self._main_frame = main_frame or _main_frame
    self._clock = clock
    self._jax_dirs: tuple[str, ...] | None = None
    self.at_exit = False  # Set by the exit hook once the script has ended.
    self.phase = RUNNING
    self.since = clock()

  def _in_jax(self, frame: Any) -> bool:
    if self._jax_dirs is None:
      self._jax_dirs = _package_dirs()
    while frame is not None:
      if frame.f_code.co_filename.startswith(self._jax_dirs or ("\0",)):
        return True
      frame = frame.f_back
    return False

  def sample(self) -> tuple[int, float]:
    """(phase, seconds in it) now."""
    if spans_every_process(self._live_arrays(), self.num_processes):
      phase = WAITING
    elif self.at_exit:
      phase = AT_EXIT
    elif self._in_jax(self._main_frame()):
      phase = IN_JAX
    else:
      phase = RUNNING
    now = self._clock()
    if phase != self.phase:
      self.phase, self.since = phase, now
    return phase, now - self.since

  def where(self) -> str:
    """Where the main thread is: its innermost frames."""
    frame = self._main_frame()
    return "(the main thread has ended)" if frame is None else stack_top(frame)


def _main_frame() -> Any:
  return sys._current_frames().get(threading.main_thread().ident)  # pylint: disable=protected-access
