"""`ServiceWaitWatch`: its tool id and what does not count as a meeting (a
real meeting, a barrier between clients: test_hang_triage.py)."""

import sys

import pytest

from jdtensor.heartbeat.meetings import ServiceWaitWatch

needs_monitoring = pytest.mark.skipif(sys.version_info < (3, 12),
                                      reason="sys.monitoring is Python 3.12+")


@needs_monitoring
def test_the_watch_takes_a_free_tool_id_and_gives_it_back():
  watch = ServiceWaitWatch()
  assert watch.start() and watch.active
  tool = watch._tool
  assert sys.monitoring.get_tool(tool) == ServiceWaitWatch.TOOL_NAME
  # Ordinary calls, Python and C, are no meeting.
  sorted([3, 1, 2])
  len("abc")
  assert not watch.has_met()
  watch.stop()
  assert not watch.active and sys.monitoring.get_tool(tool) is None


@needs_monitoring
def test_the_watch_does_not_start_without_a_free_tool_id():
  taken = [t for t in ServiceWaitWatch.TOOL_IDS if sys.monitoring.get_tool(t) is None]
  for t in taken:
    sys.monitoring.use_tool_id(t, "someone else")
  try:
    watch = ServiceWaitWatch()
    assert not watch.start() and not watch.active
  finally:
    for t in taken:
      sys.monitoring.free_tool_id(t)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.11 only")
def test_on_python_3_11_the_watch_does_not_start():
  assert not ServiceWaitWatch().start()
