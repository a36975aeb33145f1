"""How a client leaves (exit hooks) and what its main thread is doing (the
flight recorder), with fakes: no JAX; one subprocess ends with os._exit."""

import re
import sys
import threading
import types

import pytest

from jdtensor.heartbeat import departure as departure_mod
from jdtensor.heartbeat import flight
from tests.helpers import run_python


@pytest.fixture
def guard(monkeypatch):
  """An ExitGuard whose hooks are installed, undone after the test."""
  monkeypatch.setattr(sys, "exit", sys.exit)
  monkeypatch.setattr(threading, "excepthook", threading.excepthook)
  monkeypatch.setattr(departure_mod.atexit, "register", lambda fn: None)
  monkeypatch.delattr(sys, "last_value", raising=False)
  left, notices = [], []
  g = departure_mod.ExitGuard(lambda d: left.append(d) or True, lambda: None,
                           notices.append)
  g.install()
  g.left, g.notices = left, notices
  return g


def test_a_normal_end_is_code_0(guard):
  assert guard.departure_now() == departure_mod.Departure(0, "exited (code 0)", False)


@pytest.mark.parametrize("status,code,failed", [
    (None, 0, False), (0, 0, False), (3, 3, True), (256 + 4, 4, True),
    ("bye", 1, True), (True, 1, True), (False, 0, False), (-1, 255, True)],
    ids=["None", "0", "3", "260", "str", "True", "False", "-1"])
def test_sys_exit_records_the_code(guard, status, code, failed):
  with pytest.raises(SystemExit):
    sys.exit(status)
  assert guard.departure_now() == departure_mod.Departure(
      code, f"exited (code {code})", failed)


MONITORING = hasattr(sys, "monitoring")  # Python 3.12+.

# How a script ends -> (the code its departure announces and the process's
# exit code on 3.12+, the same on 3.11, which sees only sys.exit calls).
_ENDINGS = {
    "sys-exit": ("sys.exit(3)", (3, 3), (3, 3)),
    "raise-SystemExit": ("raise SystemExit(3)", (3, 3), (0, 3)),
    "exit-builtin": ("exit(4)", (4, 4), (0, 4)),
    "through-finally-and-with": (
        "import contextlib\n"
        "def inner():\n  raise SystemExit(5)\n"
        "def outer():\n  try:\n    with contextlib.nullcontext():\n      inner()\n"
        "  finally:\n    pass\n"
        "outer()", (5, 5), (0, 5)),
    "sys-exit-caught": (
        "try:\n  sys.exit(7)\nexcept SystemExit:\n  pass", (0, 0), (7, 0)),
    "sys-exit-False": ("sys.exit(False)", (0, 0), (0, 0)),
    "a-later-handler-raises-and-catches": (
        "def handler():\n  try:\n    raise SystemExit(9)\n  except SystemExit:\n"
        "    pass\n"
        "atexit.register(handler)\nraise SystemExit(2)", (2, 2), (0, 2)),
    # A live background thread: the guard ends the process itself, with the
    # departure's code (3.11 cannot see the bare raise: its code is lost).
    "raise-with-a-live-thread": (
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "raise SystemExit(6)", (6, 6), (0, 0)),
    "ends-normally": ("pass", (0, 0), (0, 0)),
}


@pytest.mark.parametrize("ending", list(_ENDINGS))
def test_every_way_a_script_ends_gives_its_exit_code(ending):
  body, modern, old = _ENDINGS[ending]
  announced, rc = modern if MONITORING else old
  res = run_python(
      "import atexit, sys, threading, time\n"
      "from jdtensor.heartbeat import departure\n"
      "g = departure.ExitGuard(lambda d: print('DEPARTURE', d.code, flush=True) or True,\n"
      "                        lambda: None, finalise=lambda: None,\n"
      "                        exit_watch=departure.SystemExitWatch())\n"
      "g.install()\n"
      f"print('WATCHING', g.exit_watch.active, flush=True)\n{body}\n", timeout=30)
  assert res.stdout.splitlines() == [f"WATCHING {MONITORING}",
                                     f"DEPARTURE {announced}"], res
  assert res.returncode == rc, res


def test_the_exit_watch_takes_a_free_tool_id_and_gives_it_back():
  if not MONITORING:
    assert departure_mod.SystemExitWatch().start() is False
    return
  watch = departure_mod.SystemExitWatch()
  assert watch.start() and sys.monitoring.get_tool(3) == "jdtensor exit code"
  other = departure_mod.SystemExitWatch()
  assert other.start() and sys.monitoring.get_tool(4) == "jdtensor exit code"
  assert not departure_mod.SystemExitWatch().start()  # None left: the wrapper serves.
  try:
    raise SystemExit(3)
  except SystemExit:
    pass
  assert watch.ending() is None
  watch.stop(), other.stop()
  assert sys.monitoring.get_tool(3) is None and sys.monitoring.get_tool(4) is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_sys_exit_in_another_thread_is_not_the_process_exit(guard):
  t = threading.Thread(target=lambda: sys.exit(5))
  t.start()
  t.join(5)
  assert guard.departure_now().code == 0


def test_an_uncaught_exception_is_read_from_sys_last_value(guard, monkeypatch):
  try:
    1 / 0
  except ZeroDivisionError as e:
    monkeypatch.setattr(sys, "last_value", e, raising=False)
  departure = guard.departure_now()
  assert departure.failed and departure.code == 1
  assert departure.why.startswith("failed: ZeroDivisionError: division by zero "
                                  "(test_departure_and_flight.py:")
  assert departure.why.endswith(" in test_an_uncaught_exception_is_read_from_sys_"
                                "last_value)")
  monkeypatch.setattr(sys, "last_value", KeyboardInterrupt(), raising=False)
  assert guard.departure_now() == departure_mod.Departure(
      130, "failed: KeyboardInterrupt", True, exception="KeyboardInterrupt")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dying_thread_is_a_notice_not_a_departure(guard):
  def work():
    raise ValueError("loader broke")
  t = threading.Thread(target=work, name="loader")
  t.start()
  t.join(5)
  assert len(guard.notices) == 1, guard.notices
  assert re.fullmatch(r"thread 'loader' died: ValueError: loader broke "
                      r"\(test_departure_and_flight\.py:\d+ in work\)",
                      guard.notices[0]), guard.notices
  assert guard.departure_now().code == 0


def test_run_leaves_once_and_detaches_only_when_unclean(monkeypatch):
  monkeypatch.delattr(sys, "last_value", raising=False)
  detached, exits = [], []
  clean = departure_mod.ExitGuard(lambda d: True, lambda: detached.append(1),
                                  threads_at_exit=lambda: [], finalise=lambda: None)
  clean.run()
  clean.run()
  assert detached == []
  monkeypatch.setattr(departure_mod.ExitGuard, "_exit_now",
                      staticmethod(lambda code: exits.append(code)))
  unclean = departure_mod.ExitGuard(lambda d: False, lambda: detached.append(1))
  unclean.run()
  assert detached == [1] and exits == [0]


class FakeArray:
  def __init__(self, ready, processes):
    self._ready = ready
    devices = [types.SimpleNamespace(process_index=p) for p in processes]
    self.sharding = types.SimpleNamespace(device_set=devices)

  def is_ready(self):
    return self._ready


def test_spans_every_process():
  every = FakeArray(False, [0, 1, 2])
  assert flight.spans_every_process([every], 3)
  assert not flight.spans_every_process([FakeArray(True, [0, 1, 2])], 3)
  assert not flight.spans_every_process([FakeArray(False, [0])], 3)
  assert not flight.spans_every_process([], 3)


def recorder(arrays=(), frame=None, main_cpu=None, jax_dirs=("/site/jax/",)):
  """A recorder over fakes: `now[0]` is the clock, `cpu[0]` the main thread's
  CPU seconds."""
  now, cpu = [10.0], [0.0]
  rec = flight.ProgramThreadRecorder(2, lambda: arrays, lambda: frame[0] if frame else None,
                                   main_cpu=lambda: cpu[0], clock=lambda: now[0])
  rec._jax_dirs = jax_dirs
  return rec, now, cpu


def test_recorder_phases_and_time_in_them():
  arrays = []
  rec, now, cpu = recorder(arrays)
  assert rec.sample(busy=90) == (flight.RUNNING, 0.0)
  now[0] = 15.0
  assert rec.sample(busy=90) == (flight.RUNNING, 5.0)
  now[0] = 16.0  # Still its own code, now idle: the idle clock starts.
  assert rec.sample(busy=1) == (flight.RUNNING, 0.0)
  now[0] = 19.0
  assert rec.sample(busy=1) == (flight.RUNNING, 3.0)
  arrays.append(FakeArray(False, [0, 1]))  # Idle, holding an unfinished global result.
  assert rec.sample(busy=1) == (flight.WAITING, 0.0)
  now[0] = 22.0
  assert rec.sample(busy=1) == (flight.WAITING, 3.0)
  cpu[0] += 3.0  # The main thread computes: not waiting, whatever it holds.
  now[0] = 25.0
  assert rec.sample(busy=100)[0] == flight.RUNNING
  arrays.clear()
  rec.at_exit = True
  assert rec.sample() == (flight.AT_EXIT, 0.0)
  arrays.append(FakeArray(False, [0, 1]))  # A daemon thread's psum: still at exit.
  assert rec.sample()[0] == flight.AT_EXIT


def fake_frame(filename, back=None):
  return types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename=filename),
                               f_back=back, f_lasti=0)


def test_recorder_inside_jax_is_waiting_when_idle_and_busy_when_not():
  frame = [fake_frame("/work/train.py", fake_frame("/site/jax/_src/compiler.py"))]
  rec, now, cpu = recorder(frame=frame)
  now[0], cpu[0] = 11.0, 0.9  # Compiling: the main thread uses a core.
  assert rec.sample(busy=95)[0] == flight.IN_JAX
  now[0] = 12.0  # Blocked inside JAX (a result, a collective): idle.
  assert rec.sample(busy=2)[0] == flight.WAITING
  frame[0] = fake_frame("/work/data.py")
  now[0] = 13.0
  assert rec.sample(busy=2)[0] == flight.RUNNING


def torn_frame():
  """What CPython 3.11 once handed the heartbeat for the main thread under
  Keras 3's fit: a frame whose f_code was a str."""
  return types.SimpleNamespace(f_code="<freed>", f_back=None, f_lasti=0)


def test_an_unreadable_main_stack_keeps_the_phase_and_its_clock():
  frame = [fake_frame("/work/train.py", fake_frame("/site/jax/_src/compiler.py"))]
  rec, now, cpu = recorder(frame=frame)
  assert rec.sample(busy=2)[0] == flight.WAITING
  frame[0] = torn_frame()
  now[0] = 14.0
  assert rec.sample(busy=2) == (flight.WAITING, 4.0)  # No exception, no new phase.
  assert rec.where() == "(the main thread's stack could not be read)"
  frame[0] = fake_frame("/work/data.py")
  now[0] = 15.0
  assert rec.sample(busy=2)[0] == flight.RUNNING


def test_an_unreadable_stack_is_none_and_not_a_thread_inside_jax():
  assert flight.inside_jax(torn_frame(), ("/site/jax/",)) is None
  assert flight.inside_jax(fake_frame("/work/a.py", torn_frame()), ("/site/jax/",)) is None
  assert flight.inside_jax(fake_frame("/site/jax/x.py", torn_frame()), ("/site/jax/",))
  stacks = flight.format_stacks({threading.main_thread().ident: torn_frame()})
  assert "(its stack could not be read)" in stacks


class PjitFunction:
  """Looks like a jitted function: JAX's C++ type, called without a Python frame."""
  __module__ = "jaxlib._jax"
  __call__ = staticmethod(flight.time.sleep)


class ArrayImpl:
  __module__ = "jaxlib._jax"
  block_until_ready = staticmethod(flight.time.sleep)


psum = PjitFunction()
result = ArrayImpl()


def frame_of(target):
  """`target`'s innermost frame while it blocks in a C call (on a thread)."""
  started = threading.Event()

  def run():
    started.set()
    target()
  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  started.wait(5)
  flight.time.sleep(0.1)
  frame = sys._current_frames()[thread.ident]
  return frame, thread


def in_jitted_call():
  y = psum(0.4)  # noqa: F841  The fast path: no Python frame of JAX's.


def in_array_method():
  result.block_until_ready(0.4)


def in_call_of_a_jax_temporary():
  # As in float(np.asarray(f(x).addressable_data(0))): JAX's object is part
  # of an argument, not a name of its own.
  flight.time.sleep(min(0.4, len(psum.__module__)))


def in_own_sleep():
  flight.time.sleep(0.4)


def in_partial_of_jitted():
  import functools
  step = functools.partial(psum)
  step(0.4)


@pytest.mark.parametrize("target, inside", [
    (in_jitted_call, True), (in_array_method, True), (in_partial_of_jitted, True),
    (in_call_of_a_jax_temporary, True), (in_own_sleep, False)],
    ids=["jitted-fast-path", "array-method", "partial", "temporary", "own-sleep"])
def test_a_call_into_jax_s_cpp_code_is_seen_from_the_call_site(target, inside):
  frame, thread = frame_of(target)
  try:
    assert flight.calls_into_jax(frame) is inside
  finally:
    thread.join(5)


def test_a_frame_without_source_is_the_program_s_own_code():
  namespace = {"psum": psum}
  exec(compile("def f():\n  psum(0.4)\n", "<no source>", "exec"), namespace)
  frame, thread = frame_of(namespace["f"])
  try:
    assert flight.calls_into_jax(frame) is False
  finally:
    thread.join(5)


def test_stack_top_names_the_innermost_frames():
  def inner():
    return flight.stack_top(sys._getframe(), depth=2)
  text = inner()
  assert text.startswith("test_departure_and_flight.py:")
  assert " inner <- test_departure_and_flight.py:" in text
  assert text.endswith(" test_stack_top_names_the_innermost_frames")


@pytest.mark.parametrize("message,lost", [
    ("UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:547] "
     "Connection closed by peer [127.0.0.1]:20118", True),
    ("UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:538] "
     "Read error [127.0.0.1]:27542: Connection reset by peer", True),
    ("Gloo all-gather failed: Write error [10.0.0.2]:4000: Broken pipe", True),
    ("Gloo all-reduce failed: Timed out waiting 30000ms for recv", False),
    ("Connection reset by peer", False),  # Not a collective's: the user's own I/O.
    ("division by zero", False),
])
def test_a_collective_error_about_a_lost_peer_is_recognised(message, lost):
  assert departure_mod.lost_a_peer(RuntimeError(message)) is lost


def test_a_lost_peer_failure_asks_whom_to_blame_before_leaving(monkeypatch):
  monkeypatch.setattr(sys, "last_value",
                      RuntimeError("Gloo all-reduce failed: Connection closed by peer"),
                      raising=False)
  left, exits = [], []
  blamed = departure_mod.Departure(75, "failed: ..., after client 1 is gone", True,
                                peer_lost=True, consequence=True)
  g = departure_mod.ExitGuard(lambda d: left.append(d) or False, lambda: None,
                           blame_peer=lambda d: blamed if d.peer_lost else d)
  monkeypatch.setattr(g, "_exit_now", exits.append)
  g.run()
  assert left == [blamed] and exits == [75]
  # Any other failure is asked too (a verdict under "terminate" may have come
  # first); left as it is when nobody else was named.
  monkeypatch.setattr(sys, "last_value", ValueError("bad"), raising=False)
  left.clear()
  asked = []
  g2 = departure_mod.ExitGuard(lambda d: left.append(d) or False, lambda: None,
                            blame_peer=lambda d: asked.append(d) or d)
  monkeypatch.setattr(g2, "_exit_now", exits.append)
  g2.run()
  assert asked == left and left[0].code == 1 and not left[0].peer_lost
  assert exits[-1] == 1
  # A normal end is never asked.
  monkeypatch.setattr(sys, "last_value", None, raising=False)
  left.clear()
  g3 = departure_mod.ExitGuard(lambda d: left.append(d) or True, lambda: None,
                            blame_peer=lambda d: pytest.fail("asked"),
                            threads_at_exit=lambda: [], finalise=lambda: None)
  g3.run()
  assert left == [departure_mod.Departure(0, "exited (code 0)", False)]


@pytest.mark.parametrize("message, waited", [
    ("UNKNOWN: Gloo context initialization failed: DEADLINE_EXCEEDED: GetKeyValue() "
     "timed out with key: cpu:gloo/0,2048/1 and duration: 29.999999909s", 30.0),
    ("Gloo context initialization failed: DEADLINE_EXCEEDED", 30.0),
    ("Gloo all-reduce failed: Connection closed by peer", None),
    ("DEADLINE_EXCEEDED: barrier timed out", None)])
def test_a_collective_that_gave_up_on_a_client_that_never_joined_is_recognised(
    message, waited):
  got = departure_mod.never_joined(RuntimeError(message))
  assert (None if got is None else round(got)) == waited


def test_a_forked_child_says_nothing_and_only_lets_go_of_jax(monkeypatch):
  left, detached = [], []
  g = departure_mod.ExitGuard(lambda d: left.append(d) or True, lambda: detached.append(1))
  monkeypatch.setattr(departure_mod.os, "getpid", lambda: g._pid + 1)
  g.run()
  assert left == [] and detached == [1] and g.departure is None


def test_exit_handlers_registered_after_the_guard_are_not_run_twice(monkeypatch):
  """Python has run the handlers registered after the guard's by the time the
  guard's runs (last in, first out): `_exit_now` takes them and itself out
  before running the rest (Keras' and optree's handlers crash run twice)."""
  import atexit
  monkeypatch.setattr(atexit, "register", atexit.register)
  monkeypatch.setattr(atexit, "unregister", atexit.unregister)
  g = departure_mod.ExitGuard(lambda d: False, lambda: None)
  g.install()
  real_unregister = g._real_unregister

  def later():
    pass

  def dropped():
    pass
  try:
    atexit.register(later)
    atexit.register(dropped)
    atexit.unregister(dropped)
    assert g._registered_after == [later]
    unregistered, ran, exits = [], [], []
    g._real_unregister = unregistered.append
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: ran.append(list(unregistered)))
    monkeypatch.setattr(departure_mod.os, "_exit", exits.append)
    g._exit_now(3)
    assert ran == [[g.run, later]] and exits == [3]
  finally:
    real_unregister(g.run)
    real_unregister(later)


def test_the_background_threads_at_exit_are_the_live_ones_not_jdtensor_s():
  """Whatever they are doing now: one seen in Python may enter JAX's C++
  code the next instant (a psum loop), and Python's finalisation then aborts
  the process when it returns."""
  release = threading.Event()
  threads = [threading.Thread(target=release.wait, args=(10,), name=name, daemon=True)
             for name in ("metrics-sync", "jdtensor-own")]
  for t in threads:
    t.start()
  try:
    found = departure_mod.background_threads()
    assert "metrics-sync" in found and "jdtensor-own" not in found
    assert threading.current_thread().name not in found
  finally:
    release.set()
    for t in threads:
      t.join(5)
  assert "metrics-sync" not in departure_mod.background_threads()


@pytest.mark.parametrize("threads, exits", [(["metrics-sync"], [0]), ([], [])])
def test_a_clean_end_with_a_live_background_thread_skips_python_s_finalisation(
    monkeypatch, threads, exits):
  g = departure_mod.ExitGuard(lambda d: True, lambda: pytest.fail("detached"),
                              threads_at_exit=lambda: threads, finalise=lambda: None)
  ended = []
  monkeypatch.setattr(g, "_exit_now", ended.append)
  g.run()
  assert ended == exits and g.departure == departure_mod.Departure(0, "exited (code 0)", False)


@pytest.mark.parametrize("clean, threads, dropped", [
    (True, [], ["dropped", "frozen"]),  # Python's own exit follows: drop.
    (True, ["metrics-sync"], []),       # os._exit follows: nothing to free.
    (False, [], []),                    # A failure: JAX is detached, kept.
])
def test_what_jdtensor_keeps_of_jax_is_dropped_only_at_a_clean_end(
    monkeypatch, clean, threads, dropped):
  """Then, and only then, Python's finalisation follows, prepared by
  `before_finalisation` (by default)."""
  monkeypatch.delattr(sys, "last_value", raising=False)
  calls = []
  g = departure_mod.ExitGuard(lambda d: clean, lambda: None,
                              threads_at_exit=lambda: threads,
                              at_clean_end=lambda: calls.append("dropped"),
                              finalise=lambda: calls.append("frozen"))
  monkeypatch.setattr(g, "_exit_now", lambda code: None)
  g.run()
  g.run()
  assert calls == dropped


def test_an_error_while_dropping_what_jdtensor_keeps_never_changes_the_exit(monkeypatch):
  monkeypatch.delattr(sys, "last_value", raising=False)

  def fails():
    raise RuntimeError("a cache that would not clear")
  finalised = []
  g = departure_mod.ExitGuard(lambda d: True, lambda: pytest.fail("detached"),
                              threads_at_exit=lambda: [], at_clean_end=fails,
                              finalise=lambda: finalised.append(1))
  monkeypatch.setattr(g, "_exit_now", lambda code: pytest.fail("os._exit"))
  g.run()
  assert g.departure == departure_mod.Departure(0, "exited (code 0)", False)
  assert finalised == [1]


@pytest.mark.parametrize("flush", [True, False])
def test_a_file_never_closed_keeps_its_last_lines_when_the_process_skips_finalisation(
    tmp_path, flush):
  """os._exit loses what Python's finalisation would flush on closing a file
  the program never closed; `flush_open_files` writes it first (the control
  case without it shows the loss is real)."""
  path = tmp_path / "log.txt"
  res = run_python(f"""
      import os
      from jdtensor.heartbeat import departure
      text = open({str(path)!r}, "w")
      text.write("last line\\n")
      reading = open({str(path)!r})  # Open for reading: left alone.
      if {flush}:
        departure.flush_open_files()
      os._exit(0)
      """, timeout=60)
  assert res.returncode == 0, res.stderr
  assert path.read_text() == ("last line\n" if flush else "")


# What Python's finalisation does at a clean end, with and without
# `before_finalisation` (called in an exit handler, as jdtensor's calls it):
# the same, but for objects left in a reference cycle by the module teardown,
# whose ``__del__`` no longer runs (their files are flushed still). A cycle
# that the exit handlers let go is collected as before.
_FINALISATION = """
    import atexit, gc, sys, tempfile, weakref
    from jdtensor.heartbeat import departure

    class Noisy:
      def __init__(self, name):
        self.name = name
      def __del__(self):
        print("del", self.name)

    dropped = Noisy("dropped by an exit handler")
    dropped.me = dropped
    atexit.register(globals().pop, "dropped")  # Runs after jdtensor's.
    if {jdtensor}:
      atexit.register(departure.before_finalisation)
    plain = Noisy("plain")                  # Freed at module teardown.
    cyclic = Noisy("cyclic")
    cyclic.me = cyclic                      # Only a collection frees it.
    log = open({log!r}, "w")
    log.write("global file\\n")           # Never closed.
    holder = Noisy("holder")
    holder.me, holder.file = holder, open({cyclic_log!r}, "w")
    holder.file.write("file in a cycle\\n")
    temp = tempfile.NamedTemporaryFile(dir={tmp!r}, delete=True)
    temp_dir = tempfile.TemporaryDirectory(dir={tmp!r})
    finalized = Noisy("finalized")
    weakref.finalize(finalized, print, "finalize callback")
    sys.stdout.write("buffered stdout\\n")  # A pipe: never flushed by hand.
    """


@pytest.mark.parametrize("jdtensor", [False, True], ids=["python", "jdtensor"])
def test_a_clean_end_finalises_as_python_does_but_for_cycles(tmp_path, jdtensor):
  log, cyclic_log = tmp_path / "log.txt", tmp_path / "cyclic.txt"
  res = run_python(_FINALISATION.format(
      jdtensor=jdtensor, log=str(log), cyclic_log=str(cyclic_log),
      tmp=str(tmp_path)), timeout=60)
  assert res.returncode == 0 and res.stderr == "", res
  expected = {"buffered stdout", "finalize callback", "del plain", "del finalized",
              "del dropped by an exit handler"}
  if not jdtensor:
    expected |= {"del cyclic", "del holder"}
  assert sorted(res.stdout.splitlines()) == sorted(expected), res.stdout
  assert log.read_text() == "global file\n"
  assert cyclic_log.read_text() == "file in a cycle\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["cyclic.txt", "log.txt"]


def test_flushing_at_exit_has_a_deadline_when_another_thread_holds_a_file():
  """A thread blocked writing to a full pipe holds that file's lock: its
  flush would wait for ever, and the process would never end."""
  res = run_python("""
      import os, threading, time
      from jdtensor.heartbeat import departure
      r, w = os.pipe()  # Nobody reads it.
      stuck = os.fdopen(w, "wb")
      threading.Thread(target=stuck.write, args=(b"x" * (1 << 22),), daemon=True).start()
      time.sleep(0.3)
      start = time.monotonic()
      finished = departure.flush_open_files(deadline=1.0)
      print(finished, round(time.monotonic() - start), flush=True)
      os._exit(0)
      """, timeout=60)
  assert res.returncode == 0, res.stderr
  assert res.stdout.split() == ["False", "1"], res.stdout


class _EndingHeartbeat:
  """A heartbeat whose thread ends (sets `stopped`, then exits) at a chosen
  wait: the race between the wait's time-out and the liveness check."""

  def __init__(self, ends_at_wait: int | None):
    self.period, self.cluster, self.waits = 0.01, None, 0
    self._ends_at, self._ended = ends_at_wait, False

  def clients(self, what):
    return None  # No beat decided: whom it waits for is not known.

  class _Stopped:
    def __init__(self, hb):
      self.hb = hb

    def wait(self, timeout):
      self.hb.waits += 1
      ended_before = self.hb._ended
      if self.hb.waits == self.hb._ends_at:
        self.hb._ended = True  # Ends just after this wait timed out.
      return ended_before

    def is_set(self):
      return self.hb._ended

  @property
  def stopped(self):
    return self._Stopped(self)

  def running(self):
    return not self._ended and self._ends_at is not None


@pytest.mark.parametrize("ends_at", [1, 2, 5])
def test_a_heartbeat_that_ends_between_the_wait_and_the_check_has_ended(ends_at):
  """Seen once in CI: the late finisher's agreed end came between a wait's
  time-out and the liveness check; the client took it for a lost heartbeat,
  skipped JAX's shutdown barrier, and the others' barrier aborted them."""
  from jdtensor.heartbeat.leaving import wait_for_the_agreed_end  # pylint: disable=g-import-not-at-top
  assert wait_for_the_agreed_end(_EndingHeartbeat(ends_at), 0.0, 1) is True


def test_a_heartbeat_thread_gone_without_its_end_is_not_an_agreed_end():
  from jdtensor.heartbeat.leaving import wait_for_the_agreed_end  # pylint: disable=g-import-not-at-top
  assert wait_for_the_agreed_end(_EndingHeartbeat(None), 0.0, 1) is False
