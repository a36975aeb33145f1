"""`ServiceWaitWatch`: its tool id and what does not count as a meeting (a
real meeting, a barrier between clients: test_hang_triage.py); and when a
beat asks whether this client has met the others (`JoinedQuestion`)."""

import sys

import pytest

from jdtensor.heartbeat.flight import AT_EXIT, IN_JAX, RUNNING, WAITING
from jdtensor.heartbeat.meetings import JoinedQuestion, ServiceWaitWatch

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


# (main thread's phase, seconds in it, seconds since the last question,
#  whether the beat asks). The shortest stall time-out is 30 s.
ASKS = [
    (IN_JAX, 0, 0.1, True),  # Inside JAX: a collective may just have run.
    (WAITING, 0, 0.1, True),
    (RUNNING, 15, 0.1, True),  # Long enough in its own code to be named soon.
    (RUNNING, 14, 0.1, False),
    (RUNNING, 0, 4.9, False),
    (RUNNING, 0, 5.0, True),  # At most every ASK_SECONDS otherwise.
    (AT_EXIT, 0, 0.1, False),
]


@pytest.mark.parametrize("phase,seconds,since,asks", ASKS,
                         ids=[f"{p}-{s}s-after-{t}s" for p, s, t, _ in ASKS])
def test_a_beat_asks_only_when_the_answer_matters(phase, seconds, since, asks):
  now, asked = [100.0], []
  question = JoinedQuestion(lambda: asked.append(now[0]) or False, lambda: now[0], 30.0)
  assert not question.answer(RUNNING, 0)  # The first beat asks.
  now[0] += since
  assert not question.answer(phase, seconds)
  assert asked == ([100.0, 100.0 + since] if asks else [100.0])


def test_once_joined_a_client_is_never_asked_again():
  answers, now = [False, True], [0.0]
  question = JoinedQuestion(lambda: answers.pop(0), lambda: now[0], 0.0)
  assert not question.answer(RUNNING, 0)
  assert question.answer(WAITING, 0)
  assert question.answer(WAITING, 0) and question.answer(IN_JAX, 0)  # Not asked.
  assert answers == []


def test_without_stall_verdicts_a_long_run_of_own_code_is_no_reason_to_ask():
  now, asked = [0.0], []
  question = JoinedQuestion(lambda: asked.append(1) or False, lambda: now[0], 0.0)
  question.answer(RUNNING, 0)
  now[0] += 1
  question.answer(RUNNING, 10_000)
  assert asked == [1]
