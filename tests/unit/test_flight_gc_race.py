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

import gc
import os
import sys

import pytest

from jdtensor.heartbeat import flight
from tests.helpers import REPO, clean_env, run_python

CLIENT = os.path.join(REPO, "tests", "unit", "gc_race_client.py")


@pytest.mark.parametrize("target, reads", [
    ("main_frame", 40), ("stack_top", 20), ("inside_jax", 10), ("calls_into_jax", 10),
    ("format_stacks", 5), ("threads_inside_jax", 10)])
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
