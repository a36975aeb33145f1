"""The thread that runs the user's program: the one the heartbeat watches.

Most programs run on the main thread. Some hosts run them elsewhere: Ray
Train calls the training function on a ``TrainingThread`` while the main
thread serves Ray's own loop; a notebook kernel or a service may run a job
on a worker thread. Sampling the main thread there would show Ray's loop
(never a stall, never the program's stack). So the heartbeat watches the
thread that called `jdtensor.initialize_accelerator_system` (or
`jdtensor.heartbeat.start`), and `jdtensor.watch_thread` names another.
This module owns the choice: one `ProgramThread` per process.

Its phases, stalls, stacks, status and trace all read this one
`ProgramThread`. When a watched thread other than the main one ends, the
main thread is watched again: a thread that only initialised must not read
as the program's end (the others would name it an early exit while its
program runs on); a Ray actor's training function that returned early is
then named as a stall, later but never wrongly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ProgramThread", "watch_thread", "program_thread", "program_ident"]


def _cpu_clock(ident: int | None) -> Callable[[], float] | None:
  """Thread `ident`'s own CPU seconds, where the platform has a clock for it."""
  try:
    clock = time.pthread_getcpuclockid(ident)  # type: ignore[arg-type]
    time.clock_gettime(clock)
  except (AttributeError, OSError, TypeError, OverflowError):
    return None
  return lambda: time.clock_gettime(clock)


class ProgramThread:
  """The thread that runs the user's program, and what can be read of it.

  Args:
    thread: The thread; default: the calling one.

  Its state is one tuple, replaced whole by `watch`: the beat thread reads
  it while the program's thread may name another.
  """

  def __init__(self, thread: threading.Thread | None = None):
    self._state: tuple[threading.Thread, Callable[[], float] | None] = (
        threading.main_thread(), None)
    self.watch(thread)

  def watch(self, thread: threading.Thread | None = None) -> None:
    """Watches `thread` (default: the calling one) from now on.

    Raises:
      TypeError: If `thread` is not a ``threading.Thread``.
      ValueError: If it has not started or has already ended.
    """
    if thread is None:
      thread = threading.current_thread()
    if not isinstance(thread, threading.Thread):
      raise TypeError("The thread to watch must be a threading.Thread (or None for "
                      f"the calling thread); got {thread!r} of type "
                      f"{type(thread).__name__}.")
    if thread is not threading.main_thread() and (thread.ident is None
                                                  or not thread.is_alive()):
      state = "has not started" if thread.ident is None else "has already ended"
      raise ValueError(f"Cannot watch thread {thread.name!r}: it {state}. Call "
                       "jdtensor.watch_thread from the thread that runs the program "
                       "(with no argument), or pass a running thread.")
    self._state = (thread, _cpu_clock(thread.ident))

  @property
  def thread(self) -> threading.Thread:
    """The thread watched."""
    return self._state[0]

  @property
  def ident(self) -> int | None:
    """Its ``threading.get_ident()`` value."""
    return self._state[0].ident

  @property
  def is_main(self) -> bool:
    """Whether it is the main thread."""
    return self._state[0] is threading.main_thread()

  @property
  def label(self) -> str:
    """How people read it: ``main thread``, or ``thread 'TrainingThread'``."""
    thread = self._state[0]
    return "main thread" if thread is threading.main_thread() else f"thread {thread.name!r}"

  def ended(self) -> bool:
    """Whether a watched thread other than the main one has ended (the
    main thread's end is the interpreter's exit, which the exit guard sees)."""
    thread = self._state[0]
    return thread is not threading.main_thread() and not thread.is_alive()

  def frame(self, frames: dict[int, Any]) -> Any:
    """Its innermost frame in `frames` (``sys._current_frames()``, read
    safely: `jdtensor.heartbeat.flight.current_frames`); None once it has
    ended."""
    return frames.get(self.ident)

  def cpu_seconds(self) -> float | None:
    """Its own CPU seconds; None where the platform has no clock for it."""
    clock = self._state[1]
    if clock is None:
      return None
    try:
      return clock()
    except OSError:  # The thread ended: its clock is gone.
      return None

  def has_cpu_clock(self) -> bool:
    """Whether its own CPU time can be read (`cpu_seconds`)."""
    return self._state[1] is not None


_lock = threading.Lock()
_program: ProgramThread | None = None  # Named by the program, or the heartbeat's.


def watch_thread(thread: threading.Thread | None = None) -> None:
  """Names the thread that runs this client's program, for the heartbeat.

  The heartbeat samples one thread of each client for its phases (in its
  own code, inside JAX, waiting in a collective), its stall verdicts, the
  stacks shown under a verdict, `jdtensor status` and the trace: by
  default the thread that called `jdtensor.initialize_accelerator_system`,
  which is the main thread in most programs and the worker thread where a
  host runs the program on one (Ray Train's training function). Name
  another where the program initialises on one thread and runs on another.
  When a watched thread other than the main one ends, the main thread is
  watched again. Each client names its own.

  Example::

    jdtensor.initialize_accelerator_system()
    worker = threading.Thread(target=train)
    worker.start()
    jdtensor.watch_thread(worker)
    worker.join()

  Args:
    thread: The thread (a ``threading.Thread``, running); None: the calling
      thread. Named before `initialize_accelerator_system`, it is kept for
      the heartbeat that starts there.

  Raises:
    TypeError: If `thread` is not a ``threading.Thread``.
    ValueError: If it has not started or has already ended.
  """
  global _program
  chosen = ProgramThread(thread)  # Checks it first.
  with _lock:
    if _program is None:
      _program = chosen
    else:
      _program.watch(chosen.thread)  # The heartbeat's recorder holds this one.


def program_thread() -> ProgramThread:
  """The process's program thread, for a heartbeat that starts now: the one
  the program named (while it runs), else the calling thread."""
  global _program
  with _lock:
    if _program is None or _program.ended():
      _program = ProgramThread()
    return _program


def program_ident() -> int | None:
  """The program thread's id (None: none named and no heartbeat started)."""
  program = _program
  return None if program is None else program.ident
