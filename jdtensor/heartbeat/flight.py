"""The flight recorder: what the thread that runs this client's program (the
main thread, or the one `jdtensor.heartbeat.watched` names) is doing,
sampled by the heartbeat thread once a beat. "The main thread" below is
that thread.

Each beat carries every client's phase and how long it has been in it, so
every client can tell the same story about a run that stopped moving:

* `WAITING` -- the main thread is inside JAX and idle: blocked on a result,
  a dispatch or a collective (it may be waiting for the others to join);
* `IN_JAX` -- inside JAX and busy (tracing, compiling, computing inline on
  its own devices): never a staller;
* `RUNNING` -- neither: the main thread runs (or is blocked in) the
  program's own Python or C code: a data loader, a file system, a lock.
  The beat says whether the process was idle too (a staller is idle);
* `AT_EXIT` -- the script has ended normally and the client waits for the
  others to end too (whatever its background threads are doing).

"Inside JAX" is read from the main thread's stack, however the wait happens:

* a frame of JAX's (or orbax's) own Python code anywhere on the stack
  (``np.asarray``/``float`` of a result, ``jax.device_get``,
  ``multihost_utils``, an orbax save); or
* the call the innermost frame is making is into JAX's C++ code with no
  Python frame of its own: the fast path of a jitted function (which, with
  one device per client, blocks inside the call until the collective is
  done), a method of a JAX array (``y.block_until_ready()``), or any call
  with a JAX array as an argument. The call is found from the frame's
  current instruction and its source position (``co_positions``), parsed
  once per call site, and its names looked up without running any code.

"Idle" is the main thread's own CPU time over the beat (below
`MAIN_IDLE_SHARE` of a core): a blocked wait uses none; a compile or an
inline computation uses a whole core. When the stack says nothing, an
unfinished result spanning every process (``jax.live_arrays()``) held by an
idle main thread still reads as waiting.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import functools
import gc
import inspect
import linecache
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jdtensor import _jaxlib_texts
from jdtensor.heartbeat.watched import ProgramThread

__all__ = ["RUNNING", "IN_JAX", "WAITING", "AT_EXIT", "MAIN_IDLE_SHARE",
           "Recorder", "ProgramThreadRecorder", "spans_every_process", "calls_into_jax",
           "inside_jax", "at_service_wait",
           "stack_top", "program_stack_top", "format_stacks"]

RUNNING, IN_JAX, WAITING, AT_EXIT = 1, 2, 3, 4
# The main thread counts as idle (blocked) below this share of one core.
MAIN_IDLE_SHARE = 0.1
# The main thread ran over a beat (`Recorder.active`) once its own CPU time
# moved by this much: a step's Python and dispatch cost far more; a thread
# blocked in a sleep, a lock, a read or a collective for the whole beat
# costs nothing.
ACTIVE_CPU_SECONDS = 0.0002
# Packages whose code is "inside JAX" (a save in orbax waits like JAX does).
_JAX_PACKAGES = ("jax", "jaxlib", "orbax.checkpoint")
_JAX_MODULE_ROOTS = ("jax", "jaxlib", "orbax")
_MISSING = object()
_CALL_SITES_MAX = 4096
# CPython 3.11 may collect garbage inside any allocation; 3.12 collects only
# between bytecodes, where a frame object is never half made.
_COLLECTS_IN_ALLOCATION = sys.version_info < (3, 12)
# Before 3.13 (PEP 667) ``frame.f_locals`` is a copy the frame keeps.
_SNAPSHOT_LOCALS = sys.version_info < (3, 13)
_HELD_FRAMES = 2  # Typically the loop's frame and the step's.
# Names whose call copies the calling frame's variables (before 3.13).
_COPIES_ITS_LOCALS = frozenset({"locals", "vars", "dir", "eval", "exec"})


@contextlib.contextmanager
def reading_other_threads() -> Iterator[None]:
  """Pauses automatic garbage collection while this thread reads another
  thread's frames (CPython 3.11 only; elsewhere a no-op).

  Reading another thread's stack makes frame objects for its frames
  (``sys._current_frames()``, ``f_back``). On CPython 3.11 making one
  allocates, an allocation may start a collection, and a finaliser it runs
  may release the GIL (a JAX array's does). The other thread then returns
  from that frame while its frame object is half made, and the frame object
  is left pointing at freed stack memory: ``sys._current_frames()`` handed
  back a str, or the process died of SIGSEGV (both seen under Keras 3's
  ``fit``; reproduced in tests/unit/test_flight_gc_race.py). With collection
  paused, making a frame object runs no other code, so the GIL stays with
  this thread until the frame object is whole. The pause lasts a few
  attribute reads (no file reads, no parsing inside it); a collection due
  meanwhile runs at the next allocation after it.
  """
  if not _COLLECTS_IN_ALLOCATION or not gc.isenabled():
    yield
    return
  gc.disable()
  try:
    yield
  finally:
    gc.enable()


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
  for name in _JAX_PACKAGES:
    module = sys.modules.get(name)
    for path in getattr(module, "__path__", None) or ():
      dirs.append(os.path.abspath(path) + os.sep)
  return tuple(dirs)


def _is_jax_object(obj: Any) -> bool:
  """Whether `obj` is JAX's: a jitted or pmapped function, an array, one of
  their C++ methods, or a function of JAX's modules."""
  while isinstance(obj, functools.partial):
    obj = obj.func
  for owner in (type(obj), getattr(obj, "__objclass__", None),
                getattr(obj, "__self__", None)):
    module = getattr(owner, "__module__", None) if owner is not None else None
    if isinstance(module, str) and module.split(".")[0] in _JAX_MODULE_ROOTS:
      return True
  module = getattr(obj, "__module__", None)
  return isinstance(module, str) and module.split(".")[0] in _JAX_MODULE_ROOTS


def _call_site(code: Any, lasti: int, globals_: dict[str, Any]) -> ast.Call | None:
  """The call expression at instruction `lasti` of `code`, parsed from its
  source position; None when there is no source or it is not a call."""
  try:
    positions = list(code.co_positions())
    line, end_line, col, end_col = positions[lasti // 2]
  except (AttributeError, IndexError, ValueError):
    return None
  if None in (line, end_line, col, end_col):
    return None
  lines = [linecache.getline(code.co_filename, n, globals_).encode()
           for n in range(line, end_line + 1)]
  if not all(lines):
    return None
  if len(lines) == 1:
    text = lines[0][col:end_col]
  else:
    text = lines[0][col:] + b"".join(lines[1:-1]) + lines[-1][:end_col]
  try:
    node = ast.parse(text.decode(), mode="eval").body
  except (SyntaxError, ValueError, UnicodeDecodeError):
    return None
  return node if isinstance(node, ast.Call) else None


def _local_names(code: Any) -> frozenset[str]:
  return frozenset(code.co_varnames + code.co_cellvars + code.co_freevars)


def _lookup(node: ast.expr, frame: Any, sites: _CallSites) -> Any:
  """The value of a name or attribute chain in `frame`, read without running
  code (no properties, no ``__getattr__``); `_MISSING` otherwise."""
  if isinstance(node, ast.Name):
    code = frame.f_code
    if code.co_flags & inspect.CO_OPTIMIZED and node.id in _local_names(code):
      local = sites.locals_of(frame)
      return _MISSING if local is None else local.get(node.id, _MISSING)
    # A module's own names are its globals (a class body's, unread: rare).
    for scope in (frame.f_globals, frame.f_builtins):
      value = scope.get(node.id, _MISSING)
      if value is not _MISSING:
        return value
    return _MISSING
  if isinstance(node, ast.Attribute):
    owner = _lookup(node.value, frame, sites)
    if owner is _MISSING:
      return _MISSING
    try:
      value = inspect.getattr_static(owner, node.attr, _MISSING)
    except Exception:  # pylint: disable=broad-except
      return _MISSING
    return getattr(value, "__func__", value) if isinstance(
        value, (staticmethod, classmethod)) else value
  return _MISSING


class _CallSites:
  """The names and attribute chains of each call site's expression, by
  (code, instruction): each source line is parsed once. Also reads a
  frame's local variables (see `locals_of`)."""

  def __init__(self) -> None:
    self._parsed: dict[tuple[Any, int], tuple[ast.expr, ...] | None] = {}
    self._locals_read: set[int] = set()
    self._held: collections.OrderedDict[int, list[Any]] = collections.OrderedDict()
    # The last decision of `calls_into_jax`: a main thread blocked in one
    # call for many beats is looked at once.
    self.decided: tuple[tuple[int, Any, int], bool] | None = None

  def get(self, frame: Any) -> tuple[ast.expr, ...] | None:
    key = (frame.f_code, frame.f_lasti)
    if key not in self._parsed:
      if len(self._parsed) >= _CALL_SITES_MAX:
        self._parsed.clear()
      call = _call_site(frame.f_code, frame.f_lasti, frame.f_globals)
      self._parsed[key] = None if call is None else tuple(
          node for node in ast.walk(call)
          if isinstance(node, (ast.Name, ast.Attribute)))
    return self._parsed[key]

  def locals_of(self, frame: Any) -> Any:
    """`frame`'s local variables (``f_locals``); None when not read.

    Before Python 3.13 ``f_locals`` copies the frame's variables into a dict
    the frame keeps, replacing the last copy's values; a value whose last
    reference that copy held is freed inside CPython's copying, and a JAX
    array's finaliser releases the GIL there (measured: 8 of 332 reads), so
    the main thread may return from the frame being copied. A first copy
    only inserts; a later one is made while this reader still holds the
    values of the one before (the last `_HELD_FRAMES` frames read), so
    nothing is freed inside it. A frame read before whose values are no
    longer held is not read again, nor is one whose code may copy its own
    variables (``locals()``, ``vars()``, ``dir()``, ``eval``, ``exec``):
    its names are not looked up, which can only make a wait read as the
    program's own code (never a false verdict).
    """
    if not _SNAPSHOT_LOCALS:
      with reading_other_threads():
        return frame.f_locals
    key = id(frame)
    if key in self._locals_read and key not in self._held:
      return None
    if not _COPIES_ITS_LOCALS.isdisjoint(frame.f_code.co_names):
      return None  # Its own copy may hold values this reader does not.
    with reading_other_threads():
      local = frame.f_locals
      values = list(local.values())
    if len(self._locals_read) >= _CALL_SITES_MAX:
      self._locals_read = set(self._held)
    self._locals_read.add(key)
    # The values held before are let go here, outside CPython's copying.
    self._held[key] = values
    self._held.move_to_end(key)
    while len(self._held) > _HELD_FRAMES:
      self._held.popitem(last=False)
    return local

  def let_go(self, innermost: Any) -> None:
    """Lets go of the values held for frames no longer on the stack whose
    innermost frame is `innermost` (None: every one): a function's values
    are not kept alive after it returns (``jax.live_arrays()`` would show
    them)."""
    if not self._held:
      return
    on_stack = set()
    try:
      with reading_other_threads():
        while innermost is not None:
          on_stack.add(id(innermost))
          innermost = innermost.f_back
    except (AttributeError, TypeError):  # Torn down under us (see inside_jax).
      pass
    for key in [key for key in self._held if key not in on_stack]:
      del self._held[key]


_SITES = _CallSites()


def calls_into_jax(frame: Any, sites: _CallSites = _SITES) -> bool:
  """Whether the call `frame` is making goes into JAX's C++ code directly:
  some name in the call expression (the callee, the object whose method it
  is, an argument, or part of one: ``np.asarray(f(x).addressable_data(0))``)
  is JAX's."""
  key = (id(frame), frame.f_code, frame.f_lasti)
  if sites.decided is not None and sites.decided[0] == key:
    return sites.decided[1]
  names = sites.get(frame)
  found = False
  for node in names or ():
    value = _lookup(node, frame, sites)
    if value is not _MISSING and _is_jax_object(value):
      found = True
      break
  sites.decided = (key, found)
  return found


def inside_jax(frame: Any, jax_dirs: tuple[str, ...] | None = None,
               sites: _CallSites = _SITES) -> bool | None:
  """Whether a thread whose innermost frame is `frame` is inside JAX: a frame
  of JAX's (or orbax's) code on its stack, or a call into JAX's C++ code.

  None when its stack cannot be read now. CPython 3.11 can hand another
  thread a frame that is being torn down (seen under Keras 3's ``fit``: a
  frame whose ``f_code`` was a str); the caller keeps what it knew.
  """
  if frame is None:
    return False
  # Read each time: orbax may be imported after the heartbeat started.
  dirs = (jax_dirs if jax_dirs is not None else _package_dirs()) or ("\0",)
  innermost = frame
  try:
    with reading_other_threads():
      while frame is not None:
        if frame.f_code.co_filename.startswith(dirs):
          return True
        frame = frame.f_back
  except (AttributeError, TypeError):
    return None
  try:
    return calls_into_jax(innermost, sites)
  except Exception:  # pylint: disable=broad-except
    return False  # A frame we cannot read is the program's own code.


# The coordination service's waits, by the method's name (a barrier, a
# blocking key-value get): C++ calls, made from the innermost Python frame.
_SERVICE_WAITS = frozenset(name.rsplit(".", 1)[1]
                           for name in _jaxlib_texts.SERVICE_WAIT_CALLS.split())


def at_service_wait(frame: Any, sites: _CallSites = _SITES) -> bool:
  """Whether the call `frame` is making is a wait on JAX's coordination
  service (``client.wait_at_barrier(...)``, a blocking key-value get), read
  from its call site (parsed once)."""
  if frame is None:
    return False
  try:
    with reading_other_threads():
      names = sites.get(frame)
  except Exception:  # pylint: disable=broad-except
    return False  # A frame torn down under us (see `inside_jax`).
  return any(isinstance(n, ast.Attribute) and n.attr in _SERVICE_WAITS
             for n in names or ())


def current_frames() -> dict[int, Any]:
  """``sys._current_frames()``, made safely (see `reading_other_threads`)."""
  with reading_other_threads():
    return sys._current_frames()  # pylint: disable=protected-access


def _extract(frame: Any) -> traceback.StackSummary:
  """`frame`'s stack, outermost first (``traceback.extract_stack``): the
  frames are walked with collection paused, their source read after."""
  walked = []
  with reading_other_threads():
    while frame is not None:
      walked.append((frame, frame.f_lineno))
      frame = frame.f_back
  summary = traceback.StackSummary.extract(iter(walked))
  summary.reverse()
  return summary


def stack_top(frame: Any, depth: int = 3) -> str:
  """The innermost `depth` frames: ``data.py:88 next_batch <- train.py:40 main``."""
  entries = _extract(frame)[-depth:] if frame is not None else []
  return " <- ".join(f"{os.path.basename(e.filename)}:{e.lineno} {e.name}"
                     for e in reversed(entries)) or "(no Python frame)"


# jdtensor's own files, and the threading module its waits go through.
_JDTENSOR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_THREADING_FILE = threading.__file__


def program_stack_top(frame: Any, depth: int = 3) -> str | None:
  """`stack_top` of the program's own frames: jdtensor's innermost ones (its
  exit handling, its waits) left out; None when nothing else is left (the
  script has ended)."""
  entries = list(_extract(frame)) if frame is not None else []
  while entries and (entries[-1].filename.startswith(_JDTENSOR_DIR)
                     or entries[-1].filename == _THREADING_FILE):
    entries.pop()
  if not entries:
    return None
  return " <- ".join(f"{os.path.basename(e.filename)}:{e.lineno} {e.name}"
                     for e in reversed(entries[-depth:]))


def format_stacks(frames: dict[int, Any] | None = None, first: int | None = None) -> str:
  """Every thread's Python stack: thread `first` first (default: the main
  thread; the program's thread where it runs elsewhere), then the main one."""
  frames = current_frames() if frames is None else frames
  names = {t.ident: t.name for t in threading.enumerate()}
  main = threading.main_thread().ident
  first = main if first is None else first
  out = []
  for ident in sorted(frames, key=lambda i: (i != first, i != main, names.get(i, ""))):
    try:
      stack = "".join(_extract(frames[ident]).format()).rstrip()
    except (AttributeError, TypeError):  # Torn down under us (see inside_jax).
      stack = "  (its stack could not be read)"
    out.append(f"Thread {names.get(ident, ident)!r} (most recent call last):\n" + stack)
  return "\n".join(out)


class Recorder:
  """What this client's program thread is doing, as the heartbeat asks it
  (the production one is `ProgramThreadRecorder`); by default, running its
  own code, or at exit once `at_exit` is set.

  Attributes:
    at_exit: Set once the script has ended normally.
    active: Whether the thread ran since the last sample (its CPU time
      moved), rather than blocked for the whole of it.
    program: The thread watched (`jdtensor.heartbeat.watched.ProgramThread`).
  """
  at_exit = False
  active = True
  program: ProgramThread | None = None

  @property
  def label(self) -> str:
    """The watched thread, for people: ``main thread``, ``thread 'X'``."""
    return "main thread" if self.program is None else self.program.label

  def stacks(self) -> str:
    """Every thread's stack, the watched thread's first."""
    return format_stacks(first=None if self.program is None else self.program.ident)

  def said_where(self) -> str:
    """Where the thread is, for a verdict's words: ``main thread in
    train.py:40 main`` (``thread 'TrainingThread' in ...`` elsewhere)."""
    return f"{self.label} in {self.where()}"

  def sample(self, busy: float = 0.0, idle_percent: float = 0.0,
             moving: bool = False) -> tuple[int, float]:
    """(phase, seconds in it) at this beat; `busy`: the process's percent of
    a core since the last beat, under `idle_percent` a wait counts as idle;
    `moving`: the process moved bytes (not idle either)."""
    return (AT_EXIT if self.at_exit else RUNNING), 0.0

  def where(self) -> str:
    """The main thread's innermost frames, for people."""
    return "(not recorded)"

  def at_service_wait(self) -> bool:
    """Whether the main thread's wait is on the coordination service (asked
    of a `WAITING` thread, for the trace)."""
    return False

  def where_in_program(self) -> str | None:
    """The main thread's innermost frames of the user's program (not
    jdtensor's exit handling); None once only jdtensor's frames are left."""
    return None if self.at_exit else "(not recorded)"


class ProgramThreadRecorder(Recorder):
  """Samples the program thread's phase; tracks since when it has been in it.

  Args:
    num_processes: Number of clients.
    live_arrays: Returns the arrays JAX holds (``jax.live_arrays``).
    main_frame: Returns the thread's current frame (None if gone); default:
      `program`'s.
    main_cpu: The thread's CPU seconds (None: `program`'s thread clock;
      where there is none, the process's share decides idleness).
    clock: Monotonic seconds.
    program: The thread to watch (default: the main thread).
  """

  def __init__(self, num_processes: int,
               live_arrays: Callable[[], Iterable[Any]],
               main_frame: Callable[[], Any] | None = None,
               main_cpu: Callable[[], float] | None = None,
               clock: Callable[[], float] = time.monotonic,
               program: ProgramThread | None = None):
    self.num_processes = num_processes
    self._live_arrays = live_arrays
    self.program = program if program is not None else ProgramThread(
        threading.main_thread())
    watched = self.program
    self._main_frame = main_frame or (lambda: watched.frame(current_frames()))
    if main_cpu is None and watched.has_cpu_clock():
      main_cpu = lambda: watched.cpu_seconds() or 0.0  # pylint: disable=unnecessary-lambda-assignment
    self._main_cpu = main_cpu
    self._clock = clock
    self._jax_dirs: tuple[str, ...] | None = None
    self._sites = _CallSites()
    self.at_exit = False  # Set by the exit hook once the script has ended.
    self.phase = RUNNING
    self._state: tuple[int, bool] = (RUNNING, False)
    self.since = clock()
    self._last = (self.since, self._main_cpu() if self._main_cpu else 0.0)

  def in_jax(self, frame: Any) -> bool | None:
    """Whether the main thread (innermost `frame`) is inside JAX (None: its
    stack cannot be read now; see `inside_jax`)."""
    return inside_jax(frame, self._jax_dirs, self._sites)

  def _main_idle(self, now: float, process_idle: bool) -> bool:
    if self._main_cpu is None:
      return process_idle
    cpu = self._main_cpu()
    wall0, cpu0 = self._last
    self._last = (now, cpu)
    self.active = cpu - cpu0 >= ACTIVE_CPU_SECONDS
    return cpu - cpu0 < MAIN_IDLE_SHARE * max(now - wall0, 1e-3)

  def sample(self, busy: float = 0.0, idle_percent: float = 25.0,
             moving: bool = False) -> tuple[int, float]:
    """(phase, seconds in it) now.

    Args:
      busy: The process's CPU use over the last beat, percent of one core.
      idle_percent: Below this the process is idle; a change between idle
        and busy while running restarts the phase's clock (a staller is
        idle for the whole stall time-out).
      moving: The process read or wrote bytes over the last beat (an
        upload, a slow read): not idle either.
    """
    now = self._clock()
    process_idle = busy < idle_percent and not moving
    main_idle = self._main_idle(now, process_idle)
    if self.program is not None and self.program.ended():
      # Its thread returned (a set-up on a helper thread, or a training
      # function that is done): the main thread is the program's again. Never
      # read as the script's end: a thread that only initialised would be
      # named an early exit while its program runs on.
      self.program.watch(threading.main_thread())
    frame = self._main_frame()
    inside = None if self.at_exit else self.in_jax(frame)
    self._sites.let_go(None if self.at_exit else frame)
    if self.at_exit:
      # Whatever its background threads still hold: its script is done.
      phase = AT_EXIT
    elif inside is None:
      # An unreadable stack says nothing: keep the phase and its clock.
      return self.phase, now - self.since
    elif inside:
      phase = WAITING if main_idle else IN_JAX
    elif main_idle and spans_every_process(self._live_arrays(), self.num_processes):
      phase = WAITING
    else:
      phase = RUNNING
    state = (phase, phase == RUNNING and process_idle)
    if self._main_cpu is None:  # No clock of its own: a change shows it ran.
      self.active = state != self._state
    if state != self._state:
      self._state, self.since = state, now
    self.phase = phase
    return phase, now - self.since

  def at_service_wait(self) -> bool:
    return at_service_wait(self._main_frame(), self._sites)

  def where_in_program(self) -> str | None:
    """Where the thread is in the program (`program_stack_top`, the thread
    named after it where it is not the main one); None once its script has
    ended."""
    frame = self._main_frame()
    try:
      where = program_stack_top(frame)
      return where if where is None or self.label == "main thread" else (
          f"{where} ({self.label})")
    except (AttributeError, TypeError):  # Torn down under us (see inside_jax).
      return f"(the {self.label}'s stack could not be read)"

  def where(self) -> str:
    """Where the thread is: its innermost frames."""
    frame = self._main_frame()
    if frame is None:
      return f"(the {self.label} has ended)"
    try:
      return stack_top(frame)
    except (AttributeError, TypeError):  # Torn down under us (see inside_jax).
      return f"(the {self.label}'s stack could not be read)"


def _main_frame() -> Any:
  return current_frames().get(threading.main_thread().ident)
