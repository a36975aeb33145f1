"""Reads the main thread's stack from another thread the way the heartbeat
does, while every allocation may start a garbage collection that releases
the GIL (a finaliser that does, as a JAX array's does, stood in for by a
collection callback): on CPython 3.11 the main thread can then return from
a frame whose frame object is half made (test_flight_gc_race.py). Prints
``bad=N reads=M``.

TARGET picks the reader: main_frame, inside_jax, stack_top, format_stacks,
calls_into_jax.
"""
import gc
import os
import sys
import threading
import time
import types

from jdtensor.heartbeat import flight

READS = int(os.environ.get("READS", "40"))
TARGET = os.environ.get("TARGET", "main_frame")
MAIN = threading.main_thread().ident


def release_the_gil_in_the_reader(phase, info):
  del phase, info
  if threading.current_thread().name == "reader":
    time.sleep(0)


gc.callbacks.append(release_the_gil_in_the_reader)
gc.set_threshold(1)  # Nearly every allocation collects.


def frame_ok(frame):
  return frame is None or (isinstance(frame, types.FrameType)
                           and isinstance(frame.f_code, types.CodeType))


def read():
  if TARGET == "main_frame":
    return frame_ok(flight._main_frame())
  frame = flight.current_frames().get(MAIN)
  if TARGET == "inside_jax":
    return flight.inside_jax(frame, ("/nowhere/",)) in (False, None)
  if TARGET == "calls_into_jax":
    return flight.calls_into_jax(frame) is False
  if TARGET == "stack_top":
    return "gc_race_client.py" in flight.stack_top(frame, depth=50)
  if TARGET == "format_stacks":
    return "gc_race_client.py" in flight.format_stacks()
  raise SystemExit(f"unknown TARGET {TARGET!r}")


bad = reads = 0
done = threading.Event()


def reader():
  global bad, reads
  try:
    for _ in range(READS):
      try:
        ok = read()
      except Exception as e:  # pylint: disable=broad-except
        print(f"read failed: {type(e).__name__}: {e}", flush=True)
        ok = False
      bad += not ok
      reads += 1
      time.sleep(0.001)
  finally:
    done.set()


# The main thread: calls of different depths and frame sizes, so a freed
# frame's memory is soon reused by a different frame.
def leaf(n):
  return n + 1


def wide(n):
  a, b, c, d, e, f, g, h = "a", "b", "c", "d", "e", "f", "g", "h"
  return n + len(a + b + c + d + e + f + g + h) - 8


def middle(n):
  return sum(leaf(i) for i in range(n)) if n % 2 else wide(n)


threading.Thread(target=reader, daemon=True, name="reader").start()
deadline = time.monotonic() + 60
while not done.is_set() and time.monotonic() < deadline:
  for i in range(20):
    middle(i) if i % 3 else wide(i)
print(f"bad={bad} reads={reads}", flush=True)
# The reads are what is under test, not this exit: with a collection at
# nearly every allocation, CPython 3.13's finalisation can collect without
# end (its main thread in threading's __del__, "Garbage-collecting").
os._exit(0)
