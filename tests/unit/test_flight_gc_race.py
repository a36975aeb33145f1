"""The flight recorder reads the main thread's stack from the heartbeat
thread. On CPython 3.11 a garbage collection that starts while a frame object
for another thread's frame is being made, and releases the GIL (a JAX array's
finaliser does), left that frame object pointing at freed stack memory: a
client under Keras 3's ``fit`` died of SIGSEGV in CI, and once read a str
where its frame should be. gc_race_client.py makes that collection happen at
nearly every allocation; before `flight.reading_other_threads` it died of
SIGSEGV within 40 reads of the main thread's frame (2 runs of 2, 1 of 3 with
10 reads; same for ``stack_top``).
"""

import contextlib
import gc
import os
import sys
import threading
import time
import weakref

import pytest

from jdtensor.heartbeat import flight
from tests.helpers import REPO, clean_env, run_python

CLIENT = os.path.join(REPO, "tests", "unit", "gc_race_client.py")


@pytest.mark.parametrize("target, reads", [
    ("main_frame", 40), ("stack_top", 20), ("inside_jax", 10), ("calls_into_jax", 10),
    ("format_stacks", 5)])
def test_reading_the_main_thread_s_stack_survives_a_collection_that_releases_the_gil(
    target, reads):
  res = run_python(f"import runpy; runpy.run_path({CLIENT!r}, run_name='__main__')",
                   env=clean_env(TARGET=target, READS=str(reads)), timeout=90)
  assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
  assert res.stdout.strip().splitlines()[-1] == f"bad=0 reads={reads}", res.stdout


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 collects only between bytecodes")
def test_collection_is_paused_while_reading_and_then_restored():
  assert gc.isenabled()
  with flight.reading_other_threads():
    assert not gc.isenabled()
  assert gc.isenabled()
  with pytest.raises(ZeroDivisionError):
    with flight.reading_other_threads():
      1 / 0  # pylint: disable=pointless-statement
  assert gc.isenabled()


def test_a_program_that_turned_collection_off_keeps_it_off():
  gc.disable()
  try:
    with flight.reading_other_threads():
      assert not gc.isenabled()
    assert not gc.isenabled()
  finally:
    gc.enable()


class _Blocked:
  """A thread stopped inside `body` (a function with local ``a``), with its
  frame; `advance()` lets it rebind ``a`` and stop again, `end()` ends it."""

  def __init__(self, make):
    self.go, self.stopped, self.make = threading.Event(), threading.Event(), make
    self.ending = False
    self.thread = threading.Thread(target=self.body, daemon=True)
    self.thread.start()
    assert self.stopped.wait(5)
    frame = sys._current_frames()[self.thread.ident]  # pylint: disable=protected-access
    while frame.f_code.co_name != "body":
      frame = frame.f_back
    self.frame = frame

  def body(self):
    a = self.make()  # noqa: F841  Read from the other thread.
    while True:
      self.stopped.set()
      self.go.wait(5)
      if self.ending:
        return
      self.go.clear()
      self.stopped.clear()
      a = self.make()  # noqa: F841

  def advance(self):
    self.go.set()
    time.sleep(0.05)
    assert self.stopped.wait(5)

  def end(self):
    self.ending = True
    self.go.set()
    self.thread.join(5)
    assert not self.thread.is_alive()


def test_a_frame_s_locals_are_read_again_without_freeing_a_value_inside_the_copy(
    monkeypatch):
  # Before 3.13 f_locals copies into a dict the frame keeps; a value only
  # that dict held is freed when it is copied again: inside CPython's copy,
  # where a JAX array's finaliser releases the GIL.
  copying = [False]
  freed_while_copying = []

  @contextlib.contextmanager
  def marked():
    copying[0] = True
    try:
      yield
    finally:
      copying[0] = False
  monkeypatch.setattr(flight, "reading_other_threads", marked)

  class Value:
    def __del__(self):
      freed_while_copying.append(copying[0])

  blocked = _Blocked(Value)
  sites = flight._CallSites()  # pylint: disable=protected-access
  try:
    first = sites.locals_of(blocked.frame)
    assert isinstance(first["a"], Value)
    del first
    blocked.advance()  # The frame's `a` is a new Value; the old one is only in the copy.
    again = sites.locals_of(blocked.frame)
    assert again is not None and isinstance(again["a"], Value)
    del again
    assert freed_while_copying == [False], freed_while_copying  # Freed after the copy.
  finally:
    blocked.end()


def test_a_frame_whose_values_are_no_longer_held_is_not_read_again():
  frames = [_Blocked(object) for _ in range(4)]
  sites = flight._CallSites()  # pylint: disable=protected-access
  try:
    for blocked in frames:
      assert sites.locals_of(blocked.frame) is not None
    # Only the last two frames' values are held (3.13's f_locals is no copy).
    for blocked in frames[:2]:
      local = sites.locals_of(blocked.frame)
      assert (local is None) == (sys.version_info < (3, 13))
    for blocked in frames[2:]:
      assert sites.locals_of(blocked.frame) is not None
  finally:
    for blocked in frames:
      blocked.end()


def test_a_frame_that_copies_its_own_locals_is_not_read():
  # Its own copy (locals()) may hold values this reader does not hold.
  blocked = _Blocked(object)
  sites = flight._CallSites()  # pylint: disable=protected-access
  try:
    assert sites.locals_of(blocked.frame) is not None
  finally:
    blocked.end()

  class CopiesItsLocals(_Blocked):
    def body(self):
      a = locals()  # noqa: F841
      self.stopped.set()
      self.go.wait(5)
  copying = CopiesItsLocals(object)
  try:
    local = sites.locals_of(copying.frame)
    assert (local is None) == (sys.version_info < (3, 13))
  finally:
    copying.end()


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="3.13's f_locals is no copy")
def test_a_function_s_values_are_let_go_once_it_has_returned():
  # Else a program checking jax.live_arrays() after a step would see them.
  class Value:
    pass
  blocked = _Blocked(Value)
  sites = flight._CallSites()  # pylint: disable=protected-access
  value = weakref.ref(sites.locals_of(blocked.frame)["a"])
  sites.let_go(blocked.frame)  # Still on its thread's stack: held.
  assert value() is not None
  blocked.frame = None
  blocked.end()  # The function returns.
  gc.collect()
  assert value() is not None  # Held by the reader alone.
  sites.let_go(None)
  gc.collect()
  assert value() is None
