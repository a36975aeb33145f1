"""The heartbeat's lifecycle as a table: every (phase, event) is a move, a
stay or illegal, and the failure is the first verdict, worded for the phase
it came in (`jdtensor.heartbeat.lifecycle`)."""

import threading

import pytest

from jdtensor.errors import PeerFailureError
from jdtensor.heartbeat import lifecycle
from jdtensor.heartbeat.lifecycle import (ABANDONED, ENDED, EVENTS, FAILED, FINISHING,
                                          ILLEGAL, MOVES, RUNNING, STAYS, TERMINATING,
                                          IllegalMove, Lifecycle, Phase)

# The whole table, written out: (phase, event) -> the phase after, or
# "illegal". A change to `lifecycle.MOVES` must change this too.
EXPECTED = {
    (RUNNING, "finish"): FINISHING, (RUNNING, "abandon"): ABANDONED,
    (RUNNING, "fail"): FAILED, (RUNNING, "terminate"): TERMINATING,
    (RUNNING, "end"): ENDED,
    (FINISHING, "finish"): FINISHING, (FINISHING, "abandon"): ABANDONED,
    (FINISHING, "fail"): FAILED, (FINISHING, "terminate"): FAILED,
    (FINISHING, "end"): ENDED,
    (ABANDONED, "finish"): "illegal", (ABANDONED, "abandon"): ABANDONED,
    (ABANDONED, "fail"): ABANDONED, (ABANDONED, "terminate"): ABANDONED,
    (ABANDONED, "end"): ABANDONED,
    (FAILED, "finish"): FAILED, (FAILED, "abandon"): FAILED, (FAILED, "fail"): FAILED,
    (FAILED, "terminate"): FAILED, (FAILED, "end"): FAILED,
    (TERMINATING, "finish"): TERMINATING, (TERMINATING, "abandon"): TERMINATING,
    (TERMINATING, "fail"): TERMINATING, (TERMINATING, "terminate"): TERMINATING,
    (TERMINATING, "end"): TERMINATING,
    (ENDED, "finish"): ENDED, (ENDED, "abandon"): ENDED, (ENDED, "fail"): FAILED,
    (ENDED, "terminate"): TERMINATING, (ENDED, "end"): ENDED,
}


def _at(phase):
  """A lifecycle in `phase`, reached by legal moves."""
  life = Lifecycle()
  path = {RUNNING: [], FINISHING: ["finish"], ABANDONED: ["abandon"], FAILED: ["fail"],
          TERMINATING: ["terminate"], ENDED: ["end"]}[phase]
  for event in path:
    assert life.move(event)
  assert life.phase is phase
  return life


def test_every_phase_and_event_is_listed_once():
  every = {(p, e) for p in Phase for e in EVENTS}
  assert set(MOVES) | STAYS | ILLEGAL == every
  assert not set(MOVES) & STAYS and not set(MOVES) & ILLEGAL and not STAYS & ILLEGAL
  assert set(EXPECTED) == every


@pytest.mark.parametrize("phase,event", sorted(EXPECTED, key=lambda k: (k[0].value, k[1])),
                         ids=lambda v: getattr(v, "value", v))
def test_the_table(phase, event, monkeypatch):
  monkeypatch.setattr(lifecycle, "STRICT", True)
  life = _at(phase)
  want = EXPECTED[(phase, event)]
  if want == "illegal":
    with pytest.raises(IllegalMove, match=f"cannot {event} while {phase.value}"):
      life.move(event)
    monkeypatch.setattr(lifecycle, "STRICT", False)
    assert not life.move(event) and life.phase is phase  # In a run: ignored.
    return
  assert life.move(event) == (want is not phase)
  assert life.phase is want


def test_the_first_verdict_is_the_failure_worded_for_its_phase():
  life = _at(FINISHING)
  seen = []

  def error_for(before):
    seen.append(before)
    return PeerFailureError(f"first, while {before.value}", (1,))
  error, before = life.record(error_for, terminate=True)
  assert before is FINISHING and life.phase is FAILED  # At exit: no exit of its own.
  assert str(error) == "first, while finishing" and life.failure is error
  assert life.record(lambda b: PeerFailureError("second"), terminate=False) is None
  assert life.failure is error and seen == [FINISHING]
  assert life.abandon() is error and life.phase is FAILED


def test_a_verdict_after_the_script_left_with_a_failure_is_not_recorded():
  life = Lifecycle()
  assert life.abandon() is None and life.phase is ABANDONED
  assert life.record(lambda b: PeerFailureError("late"), terminate=True) is None
  assert life.failure is None


def test_a_verdict_and_a_failing_exit_race_and_exactly_one_wins():
  """Both ways round, many times: either the verdict is recorded and the exit
  sees it, or the exit comes first and the verdict is ignored."""
  for _ in range(200):
    life, seen = Lifecycle(), []
    go = threading.Barrier(2)

    def verdict():
      go.wait()
      life.record(lambda b: PeerFailureError("verdict"), terminate=True)

    def leave():
      go.wait()
      seen.append(life.abandon())
    threads = [threading.Thread(target=verdict), threading.Thread(target=leave)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(5)
    if seen[0] is None:
      assert life.phase is ABANDONED and life.failure is None
    else:
      assert life.phase is TERMINATING and seen[0] is life.failure
