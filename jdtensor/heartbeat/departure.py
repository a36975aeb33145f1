"""How this client leaves a multi-client run, announced to the others.

PURE: standard library only; what to do is injected.

A client can stop taking part in many ways; each must reach every other
client at once, with its reason, or they hang in their next collective:

* an unhandled exception ends the script: seen at exit in ``sys.last_value``
  (Python sets it before the exception hook runs, so a replaced hook does not
  hide it): a failure, code 1;
* ``sys.exit(n)``: the code is recorded by a thin wrapper of ``sys.exit``
  (Python keeps no record of it for exit handlers). Non-zero: a failure;
* the script ends normally (or ``sys.exit(0)``): the client is finished and
  waits for the others to finish too (the agreed end). If the others are
  still waiting for it in a collective, it has left early; the heartbeat
  names it.

An exception from a collective whose connection to another client went away
(gloo's "Connection reset by peer" when that client's process ended) is
flagged ``peer_lost``: before it is announced as this client's own failure,
the heartbeat is given a moment to name the client that went away, and if it
does, this client leaves as a consequence (the other client is the root
cause, named everywhere), not as a failure of its own.

An exception that ends a background thread (``threading.excepthook``) does
not end the client (Python's rule), so it is only announced as a notice; if
the client then stalls, the stall report shows it.

Unless every client ends together with no background thread left, the
process ends with ``os._exit`` after the remaining exit handlers have run and
its open files are flushed (see `ExitGuard.run`), with the client's own exit
code. When they do, Python finalises the process as usual, but for the
garbage collections of its module teardown (see `before_finalisation`).

Python 3.12 and newer: `SystemExitWatch` reads the code of any
``SystemExit`` that ends the script (``raise SystemExit(n)``, the ``exit()``
and ``quit()`` builtins, ``sys.exit`` from C) with ``sys.monitoring``, and a
``sys.exit(n)`` caught and survived is not taken for the process's end.

Limits: on Python 3.11, ``raise SystemExit(n)`` written directly, without
``sys.exit``, is seen as code 0 (3.11 keeps no record of it for exit
handlers); ``os._exit`` and signals run no exit handler (the liveness links
see the process end).
"""

from __future__ import annotations

import _io
import atexit
import gc
import itertools
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any, NamedTuple

from jdtensor import _jaxlib_texts
from jdtensor._monitoring import claim_tool, release_tool
from jdtensor._report import printable
from jdtensor._threads import start_daemon

__all__ = ["AFTER_EXIT_HANDLERS", "Departure", "ExitGuard", "FLUSH_DEADLINE",
           "SystemExitWatch",
           "background_threads", "before_finalisation", "describe_exception",
           "flush_open_files", "lost_a_peer", "never_joined"]

class Departure(NamedTuple):
  """How this client is leaving.

  Attributes:
    code: The exit code.
    why: What to tell the others, e.g. ``failed: ZeroDivisionError: division
      by zero (train.py:42 in step)`` or ``exited (code 3)``.
    failed: Whether this is a failure (an exception or a non-zero code).
    peer_lost: The failure is a collective's error about a connection to
      another client that went away (see `lost_a_peer`).
    consequence: This client leaves because of another client, which the
      heartbeat has already named to everyone (and to the launcher).
    join_wait: Seconds a collective's set-up waited for another client that
      never joined it (see `never_joined`); None otherwise.
    exception: The exception it leaves with (`describe_exception`); '' when
      it leaves by an exit code.
  """
  code: int
  why: str
  failed: bool
  peer_lost: bool = False
  consequence: bool = False
  join_wait: float | None = None
  exception: str = ""


# Characters of an exception's first line a departure shows: jdtensor's own
# messages (what happened, the value, the fix) fit whole.
EXCEPTION_SHOWN = 1000


def describe_exception(error: BaseException) -> str:
  """``Type: first line of the message (file:line in function)``."""
  lines = str(error).strip().splitlines()
  first = printable(lines[0]) if lines else ""
  if len(first) > EXCEPTION_SHOWN:  # Cut between words: it travels in one frame.
    first = first[:EXCEPTION_SHOWN].rsplit(" ", 1)[0] + " ..."
  text = f"{type(error).__name__}: {first}" if first else type(error).__name__
  tb = error.__traceback__
  while tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
  if tb is not None:
    code = tb.tb_frame.f_code
    text += printable(f" ({code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno} in "
                      f"{code.co_name})")
  return text


def lost_a_peer(error: BaseException) -> bool:
  """Whether `error` is gloo's error about a connection to another client
  that went away (its process ended): a consequence of that client."""
  text = str(error)
  return "gloo" in text.lower() and _jaxlib_texts.GLOO_PEER_LOST.search(text) is not None


def never_joined(error: BaseException) -> float | None:
  """Seconds a collective's set-up waited for a client that never joined it,
  if `error` is that failure (a consequence of the late client); else None."""
  match = _jaxlib_texts.GLOO_NEVER_JOINED.search(str(error))
  if match is None:
    return None
  return float(match.group(1)) if match.group(1) else 30.0


def background_threads() -> list[str]:
  """Names of the live threads other than the main one and jdtensor's own
  (at exit: the daemon threads Python's finalisation would stop abruptly)."""
  me = threading.current_thread()
  return [t.name for t in threading.enumerate()
          if t is not threading.main_thread() and t is not me and t.is_alive()
          and not t.name.startswith("jdtensor")]


FLUSH_DEADLINE = 5.0


def flush_open_files(deadline: float = FLUSH_DEADLINE) -> bool:
  """Flushes every open file object written to, ``sys.stdout`` and
  ``sys.stderr`` first: ``os._exit`` ends the process without Python's
  finalisation, which would flush a file the program never closed as it
  closes it (its last lines would be lost).

  Returns whether it finished within `deadline` seconds: a file whose lock
  another thread holds while blocked writing to a full pipe would block its
  flush for ever, so the flushing runs on a thread of its own.
  """
  done = threading.Event()

  def flush_all() -> None:
    for stream in (sys.stdout, sys.stderr, *_file_objects()):
      _flush(stream)
    done.set()
  if start_daemon(flush_all, "jdtensor-flush") is None:
    flush_all()  # No new thread at this point of the exit (3.12).
  return done.wait(deadline)


def _flush(stream: Any) -> None:
  try:
    if not stream.closed and stream.writable():
      stream.flush()
  except Exception:  # pylint: disable=broad-except
    pass  # Detached, a broken pipe, a full disk: nothing more can be done.


def _file_objects() -> list[Any]:
  """Every file object the garbage collector tracks (every buffered or text
  one is), found by its type: an instance's own ``__class__`` could run code,
  and asking the ``io.IOBase`` ABC about each of JAX's ~100,000 objects took
  75 ms (this takes about 15)."""
  file_types: set[type] = set()
  bases = [_io._IOBase]  # pylint: disable=protected-access  # The C base of io.IOBase too.
  while bases:
    for kind in type.__subclasses__(bases.pop()):
      if kind not in file_types:
        file_types.add(kind)
        bases.append(kind)
  objects = gc.get_objects()
  return list(itertools.compress(objects, map(file_types.__contains__,
                                              map(type, objects))))


# The name in ``sys.modules`` of `_AfterTheExitHandlers`.
AFTER_EXIT_HANDLERS = "jdtensor._after_the_exit_handlers"


class _AfterTheExitHandlers(types.ModuleType):
  """A module that only ``sys.modules`` holds, so that Python's finalisation
  ends it, calling its ``__del__``, as it takes the modules out of
  ``sys.modules``: after every exit handler (JAX's shutdown included) and the
  full garbage collection that follows them, before the module teardown."""

  def __init__(self, modules: list[Any]):
    super().__init__(AFTER_EXIT_HANDLERS)
    self.modules = modules

  def __del__(self) -> None:
    try:
      _before_module_teardown(self.modules)
    except Exception:  # pylint: disable=broad-except
      pass  # The finalisation goes on as Python's own: slower, no different.


def before_finalisation() -> None:
  """At a clean end (every client finishing, no background thread left):
  makes Python's finalisation skip the garbage collections of its module
  teardown, which find nothing to free in a JAX program but cost the most.

  Python's finalisation runs three full collections of every tracked object
  (about 100,000 once JAX is imported): one after the exit handlers, two
  while it tears the modules down. They cost 0.12 s of a clean exit's 0.2 s
  of CPU a client. The first is kept: what is garbage once the
  exit handlers ran is collected as without jdtensor (JAX's CPU client, once
  JAX's exit handler let it go). Right after it the objects still alive are
  frozen out of the collector (`gc.freeze`), and the teardown is otherwise
  Python's own: it clears every module's globals, freeing by reference count
  what they held (its ``__del__`` runs, files close, a
  ``NamedTemporaryFile`` deletes its file). What that leaves in reference
  cycles is no longer collected, so their ``__del__`` does not run (Python
  does not promise that it does); the open files among them are flushed
  first.
  """
  modules = sys.modules
  modules[AFTER_EXIT_HANDLERS] = _AfterTheExitHandlers(list(modules.values()))


def _before_module_teardown(modules: list[Any]) -> None:
  """The objects alive now are frozen out of the garbage collector, the
  modules among them kept alive so that Python clears their globals, the
  open files flushed (the standard streams are Python's to flush: a failure
  there is its to report, with exit code 120). On this thread: one started
  now would never run (``Thread.start`` would wait for it for ever), and no
  other thread runs Python code any more, so none holds a file's lock."""
  standard = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
  for stream in _file_objects():
    if not any(stream is s for s in standard):
      _flush(stream)
  # A frozen cycle is never collected: every module alive at the exit lives
  # on, and Python clears each one's globals as it does for any module it
  # finds alive. Without this, a module that only ``sys.modules`` held
  # (``__main__``) is gone, and its globals, kept alive by its functions'
  # references, would never be cleared.
  keeper: list[Any] = [modules, [m for m in sys.modules.values() if m is not None]]
  keeper.append(keeper)
  gc.freeze()


def _status_code(status: Any) -> int:
  """The process exit code `sys.exit(status)` gives, by Python's rules: None
  is 0, an int (a bool too: ``sys.exit(False)``, as ``absltest.main()`` ends,
  is 0) is itself modulo 256, anything else is printed and gives 1."""
  if status is None:
    return 0
  if isinstance(status, int):
    return int(status) & 0xFF
  return 1


class SystemExitWatch:
  """The ``SystemExit`` ending the main thread, seen by ``sys.monitoring``
  (Python 3.12+), however it was raised.

  Python runs the exit handlers after a ``SystemExit`` ended the script, and
  keeps no record of it for them; ``sys.exit`` can be wrapped, but not
  ``raise SystemExit(n)`` or the ``exit()`` builtin. ``sys.monitoring``
  reports each exception raised (again in each frame it passes through),
  re-raised after a ``finally`` or ``with``, and handled. The watch keeps the
  main thread's ``SystemExit`` objects raised and not yet handled; at exit,
  the oldest of them is the one that ended the script (one an exit handler
  raises and catches later comes and goes).

  The callbacks run only when an exception is raised or handled (no code is
  instrumented), in a free tool id (3 or 4; none of the ids Python names for
  debuggers, coverage, profilers and optimisers). Where none is free, or on
  Python 3.11, `start` returns False and `ExitGuard` falls back to its
  ``sys.exit`` wrapper.
  """

  TOOL_IDS = (3, 4)
  TOOL_NAME = "jdtensor exit code"

  def __init__(self) -> None:
    self._outstanding: dict[int, BaseException] = {}
    self._tool: int | None = None

  @property
  def active(self) -> bool:
    return self._tool is not None

  def start(self) -> bool:
    """Starts watching; False where ``sys.monitoring`` is absent or no tool
    id is free."""
    if self._tool is not None:
      return True
    claimed = claim_tool(self.TOOL_IDS, self.TOOL_NAME)
    if claimed is None:
      return False
    monitoring, tool = claimed
    outstanding = self._outstanding
    main = threading.main_thread().ident

    def raised(code: Any, offset: int, error: BaseException) -> None:
      del code, offset
      if isinstance(error, SystemExit) and threading.get_ident() == main:
        outstanding[id(error)] = error  # Re-raised: back in, in its old place.

    def handled(code: Any, offset: int, error: BaseException) -> None:
      del code, offset
      if isinstance(error, SystemExit):
        outstanding.pop(id(error), None)
    events = monitoring.events
    monitoring.register_callback(tool, events.RAISE, raised)
    monitoring.register_callback(tool, events.RERAISE, raised)
    monitoring.register_callback(tool, events.EXCEPTION_HANDLED, handled)
    monitoring.set_events(tool, events.RAISE | events.RERAISE | events.EXCEPTION_HANDLED)
    self._tool = tool
    return True

  def stop(self) -> None:
    """Gives the tool id back (tests; a process keeps watching to its end)."""
    if self._tool is None:
      return
    events = sys.monitoring.events  # type: ignore[attr-defined]
    release_tool(self._tool, (events.RAISE, events.RERAISE, events.EXCEPTION_HANDLED))
    self._tool = None
    self._outstanding.clear()

  def ending(self) -> SystemExit | None:
    """The ``SystemExit`` ending the main thread, or None (the script ended
    normally, or a ``SystemExit`` it raised was caught)."""
    for error in self._outstanding.values():
      return error  # type: ignore[return-value]
    return None


class ExitGuard:
  """Installs the exit hooks of one client and runs its way out.

  Args:
    on_leave: Called once, in the exit handler, with this client's
      `Departure`. It announces the departure and, for a normal end, waits
      for the agreed end; it returns whether JAX's own shutdown barrier can
      still succeed (every client is finishing normally).
    detach_jax: Keeps JAX's exit handler from entering its shutdown barrier
      (which would wait for a client that is gone, then abort the process).
    on_thread_exception: Called with a notice when a background thread dies
      of an exception.
    blame_peer: Called, before `on_leave`, with every failure; returns the
      departure to leave with (a consequence when another client was named
      in time: the one that went away, for a failure flagged ``peer_lost``).
    threads_at_exit: Returns the names of the background threads (not
      jdtensor's) still alive at exit; `background_threads` by default.
      When there are any, the process ends with ``os._exit`` after the exit
      handlers, its open files flushed: Python's finalisation would stop
      them abruptly, and one that then returns from a call into C++ code
      (JAX's, on a psum loop) aborts the whole process ("FATAL: exception
      not rethrown"). Whether a thread is inside such a call at that moment
      cannot be known beforehand: a thread seen in Python code may enter
      JAX the next instant (a psum loop was seen outside JAX in 1 of 200
      looks, and then aborted the process every time).
    at_clean_end: Called at a clean end that Python's finalisation follows
      (every client finishing, no background thread left): drops what
      jdtensor keeps of JAX.
    finalise: Called after `at_clean_end`; `before_finalisation` by default.
    exit_watch: Reads how the script ended where ``sys.monitoring`` exists
      (`SystemExitWatch`, started by `install`); without one, or where it
      cannot start, the ``sys.exit`` wrapper's record is used.
  """

  def __init__(self, on_leave: Callable[[Departure], bool],
               detach_jax: Callable[[], None],
               on_thread_exception: Callable[[str], None] | None = None,
               blame_peer: Callable[[Departure], Departure] | None = None,
               threads_at_exit: Callable[[], list[str]] = background_threads,
               at_clean_end: Callable[[], None] | None = None,
               finalise: Callable[[], None] | None = None,
               exit_watch: SystemExitWatch | None = None):
    self._on_leave = on_leave
    self.exit_watch = exit_watch
    self._at_clean_end = at_clean_end
    self._finalise = finalise
    self._threads_at_exit = threads_at_exit
    self._pid = os.getpid()
    # Exit handlers registered after ours: Python has run them by the time
    # ours runs, so `_exit_now` must not run them again.
    self._registered_after: list[Callable[..., Any]] = []
    self._real_unregister: Callable[..., Any] = atexit.unregister
    self._blame_peer = blame_peer
    self._detach_jax = detach_jax
    self._on_thread_exception = on_thread_exception
    self.exit_status: Any = None
    self.exit_called = False
    self.departure: Departure | None = None
    # The main thread's uncaught exception when it is a collective's error
    # about a peer that went away: its traceback is shown at exit only if it
    # is not a consequence of a client the heartbeat names (then that
    # verdict's one line says it all).
    self._held_traceback: tuple[Any, Any, Any] | None = None
    self._real_excepthook: Callable[..., Any] | None = None
    self._installed = False
    self._real_exit: Callable[..., Any] | None = None
    self._real_thread_hook: Callable[..., Any] | None = None

  def install(self) -> None:
    """Wraps ``sys.exit``, chains ``threading.excepthook``, registers the
    exit handler (after JAX's, so it runs first)."""
    if self._installed:
      return
    self._installed = True
    self._real_exit = sys.exit
    real_exit = self._real_exit

    def exit(status: Any = None) -> None:  # pylint: disable=redefined-builtin
      if threading.current_thread() is threading.main_thread():
        self.exit_status, self.exit_called = status, True
      real_exit(status)
    exit.__doc__ = real_exit.__doc__
    exit.__wrapped__ = real_exit  # type: ignore[attr-defined]
    sys.exit = exit
    self._real_thread_hook = threading.excepthook
    threading.excepthook = self._thread_exception
    self._real_excepthook = sys.excepthook
    sys.excepthook = self._main_exception
    if self.exit_watch is not None:
      self.exit_watch.start()
    atexit.register(self.run)
    real_register, real_unregister = atexit.register, atexit.unregister
    self._real_unregister = real_unregister
    after = self._registered_after

    def register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
      after.append(func)
      return real_register(func, *args, **kwargs)

    def unregister(func: Callable[..., Any]) -> None:
      after[:] = [f for f in after if f != func]
      real_unregister(func)
    register.__doc__, unregister.__doc__ = real_register.__doc__, real_unregister.__doc__
    register.__wrapped__ = real_register  # type: ignore[attr-defined]
    unregister.__wrapped__ = real_unregister  # type: ignore[attr-defined]
    atexit.register, atexit.unregister = register, unregister

  def _main_exception(self, exc_type: Any, exc: Any, tb: Any) -> None:
    """``sys.excepthook``: holds back a peer-lost collective error's
    traceback until the exit handler knows whether it is a consequence."""
    if (self._blame_peer is not None and isinstance(exc, Exception)
        and os.getpid() == self._pid and lost_a_peer(exc)):
      self._held_traceback = (exc_type, exc, tb)
      return
    if self._real_excepthook is not None:
      self._real_excepthook(exc_type, exc, tb)

  def _show_held_traceback(self) -> None:
    held, self._held_traceback = self._held_traceback, None
    if held is not None and self._real_excepthook is not None:
      try:
        self._real_excepthook(*held)
      except Exception:  # pylint: disable=broad-except
        pass

  def _thread_exception(self, args: Any) -> None:
    if self.departure is not None or os.getpid() != self._pid:
      # After the script's end Python ends background threads silently;
      # one that dies of its peers' exit (a collective cut short) is not news.
      return
    if self._real_thread_hook is not None:
      self._real_thread_hook(args)
    if self._on_thread_exception is not None and args.exc_value is not None:
      name = args.thread.name if args.thread is not None else "?"
      self._on_thread_exception(
          f"thread {name!r} died: {describe_exception(args.exc_value)}")

  def departure_now(self) -> Departure:
    """How this client is leaving, read at exit."""
    error = getattr(sys, "last_value", None)
    if error is not None and not isinstance(error, SystemExit):
      code = 130 if isinstance(error, KeyboardInterrupt) else 1
      join_wait = never_joined(error)
      exception = describe_exception(error)
      return Departure(code, f"failed: {exception}", True,
                       peer_lost=lost_a_peer(error) or join_wait is not None,
                       join_wait=join_wait, exception=exception)
    if self.exit_watch is not None and self.exit_watch.active:
      ending = self.exit_watch.ending()
      code = 0 if ending is None else _status_code(ending.code)
    else:
      code = _status_code(self.exit_status) if self.exit_called else 0
    return Departure(code, f"exited (code {code})", code != 0)

  def run(self) -> None:
    """The exit handler: announce, then agree or detach.

    After a clean end Python exits as usual (see `before_finalisation`),
    unless a background thread is still alive (see `threads_at_exit`).
    Otherwise this client detaches
    from JAX's shutdown barrier, runs the remaining exit handlers itself, and
    ends the process with its exit code: Python's own finalisation would wake
    threads still blocked in C++ collectives with the departed clients, and
    such a thread aborts the process when it finds the interpreter gone.
    """
    if self.departure is not None:
      return
    if os.getpid() != self._pid:
      # A forked child never speaks for its parent: it only lets go of the
      # parent's JAX runtime (whose shutdown would act as the parent).
      self._detach_jax()
      return
    self.departure = self.departure_now()
    clean = False
    try:
      if self.departure.failed and self._blame_peer is not None:
        self.departure = self._blame_peer(self.departure)
      if not self.departure.consequence:
        self._show_held_traceback()
      self._held_traceback = None
      clean = self._on_leave(self.departure)
    finally:
      if not clean:
        self._detach_jax()
        self._exit_now(self.departure.code)
      elif self._threads_at_exit():
        self._exit_now(self.departure.code)
      else:
        finalise = self._finalise or before_finalisation  # Read now: patchable.
        for step in (self._at_clean_end, finalise):
          try:
            if step is not None:
              step()
          except Exception:  # pylint: disable=broad-except
            pass  # Costs time at exit at most, never the exit itself.

  def _exit_now(self, code: int) -> None:
    """Runs the exit handlers Python has not run yet (each runs once), then
    ends the process with `code`, skipping Python's finalisation."""
    try:
      for func in [self.run, *self._registered_after]:
        self._real_unregister(func)
      atexit._run_exitfuncs()  # pylint: disable=protected-access
    finally:
      flush_open_files()
      os._exit(code)
