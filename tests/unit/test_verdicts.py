"""The heartbeat's decisions as tables: `judge`, `Decider`, `Outcome` on the
wire. No threads, no sockets (the threaded protocol: test_heartbeat_protocol.py;
the links: test_link_exchange.py)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jdtensor._wire import Frames, encode, encode_binary
from jdtensor.heartbeat.flight import AT_EXIT, IN_JAX, RUNNING, WAITING
from jdtensor.heartbeat.stragglers import WaitLedger
from jdtensor.heartbeat.verdicts import (ALL_WAITING, DEADLOCK, EARLY_EXIT, FIRST_TOKENS,
                                         MOVING_BYTES_PER_SECOND,
                                         OUT_OF_SYNC, STALLED, BeatLayout, Decider,
                                         Outcome, Row, StallTimeout, Verdict, from_ranges, judge,
                                         to_ranges, verdict_due)

W, R, J, X = WAITING, RUNNING, IN_JAX, AT_EXIT


def _judge(states, joined=None, exit_grace=3.0, stall=300.0):
  phases, seconds, busy = (np.array(v) for v in zip(*states))
  joined = np.ones(len(states), bool) if joined is None else np.array(joined)
  return judge(phases, seconds, busy, joined, exit_grace, stall)


@pytest.mark.parametrize("states, joined, stall, expected", [
    # Early exit: one idle waiter proves it; every waiter is named.
    ([(W, 4, 60), (X, 3, 0), (W, 4, 0)], None, 300, Verdict(EARLY_EXIT, (1,), waiting=(0, 2))),
    ([(W, 4, 1), (X, 2, 0)], None, 300, None),  # At exit for less than the grace.
    ([(W, 9, 80), (X, 9, 0)], None, 300, None),  # The waiter computes.
    # A stall: one idle runner past set-up, everyone else blocked as long.
    ([(W, 301, 1), (R, 301, 0), (W, 305, 2)], None, 300, Verdict(STALLED, (1,), seconds=301, timeout=300)),
    ([(W, 301, 1), (R, 301, 0), (W, 305, 2)], [True, False, True], 300, None),
    ([(W, 301, 1), (R, 301, 0), (W, 305, 2)], None, 0, None),  # Switched off.
    ([(W, 301, 1), (R, 301, 90), (W, 305, 2)], None, 300, None),  # Busy: slow.
    ([(W, 301, 1), (J, 301, 0), (W, 305, 2)], None, 300, None),  # Compiling.
    ([(W, 301, 1), (R, 301, 0), (R, 305, 2)], None, 300, None),  # Two runners.
    ([(W, 301, 1), (R, 299, 0), (W, 305, 2)], None, 300, None),  # Not yet.
    ([(W, 400, 1), (W, 301, 0)], None, 300, Verdict(ALL_WAITING, (0, 1))),
], ids=["early-exit", "exit-short", "waiter-busy", "stall", "stall-in-set-up",
        "stall-off", "runner-busy", "compiling", "two-runners", "stall-short",
        "all-waiting"])
def test_judge(states, joined, stall, expected):
  assert _judge(states, joined, stall=stall) == expected


@pytest.mark.parametrize("states, stall, expected", [
    # Every client idle in a collective for the deadlock time-out (600 s).
    ([(W, 600, 1), (W, 605, 0), (W, 700, 2)], 300,
     Verdict(DEADLOCK, (0, 1, 2), seconds=600, timeout=600)),
    ([(W, 600, 1), (W, 605, 0)], 0, Verdict(DEADLOCK, (0, 1), seconds=600, timeout=600)),
    # Before it: the warning at the stall time-out's ceiling, no failure.
    ([(W, 599, 1), (W, 605, 0)], 300, Verdict(ALL_WAITING, (0, 1))),
    ([(W, 599, 1), (W, 605, 0)], 0, None),
    # A long computation: XLA's threads keep the waiter's process busy (CPU),
    # or the main thread computes inline (inside JAX, busy): never a deadlock.
    ([(W, 9000, 90), (W, 9000, 100)], 300, None),
    ([(W, 9000, 1), (W, 9000, 100)], 300, None),
    ([(J, 9000, 100), (J, 9000, 100)], 300, None),
    # One client in its own code: a stall (its own verdict), not a deadlock.
    ([(W, 9000, 1), (R, 9000, 90)], 300, None),
], ids=["deadlock", "deadlock-stall-off", "warned-first", "stall-off-no-warning",
        "computing", "one-computing", "computing-inline", "one-runs-its-code"])
def test_every_client_idle_in_a_collective_for_the_deadlock_time_out(states, stall,
                                                                      expected):
  """A deadlock and a long computation are told apart by the process's CPU:
  a waiter whose process computes (on CPU, XLA's threads) is not blocked."""
  phases, seconds, busy = (np.array(v) for v in zip(*states))
  assert judge(phases, seconds, busy, np.ones(len(states), bool), 3.0, stall,
               deadlock_timeout=600.0) == expected


def test_every_client_waiting_while_one_moves_bytes_is_no_deadlock():
  """An async checkpoint's upload on a background thread while every main
  thread waits (orbax's wait): slow storage, not a deadlock."""
  phases, seconds, busy = np.array([W, W]), np.array([900, 900]), np.array([1, 1])
  joined = np.ones(2, bool)
  moving = np.array([0, 2 * MOVING_BYTES_PER_SECOND])
  assert judge(phases, seconds, busy, joined, 3.0, 300, moved=moving,
               deadlock_timeout=600.0) == Verdict(ALL_WAITING, (0, 1))
  assert judge(phases, seconds, busy, joined, 3.0, 300, moved=np.zeros(2),
               deadlock_timeout=600.0) == Verdict(DEADLOCK, (0, 1), seconds=900,
                                                  timeout=600.0)


@pytest.mark.parametrize("states, stall, due", [
    # A stall in view: the time-out less the pattern's length (its shortest).
    ([(W, 3.4, 1), (R, 2.9, 0), (W, 3.1, 2)], 4.0, 1.1),
    ([(W, 3.9, 1), (R, 3.95, 0), (W, 3.95, 2)], 4.0, 0.1),
    ([(W, 3.4, 1), (R, 2.9, 0), (W, 3.1, 2)], 4.05, 1.2),  # Up to the rows' tenths.
    ([(W, 3.4, 1), (R, 2.9, 0), (W, 3.1, 2)], 0.0, None),  # Stalls switched off.
    ([(W, 3.4, 1), (R, 2.9, 90), (W, 3.1, 2)], 4.0, None),  # Busy: never a staller.
    ([(W, 3.4, 1), (R, 2.9, 0), (R, 3.1, 2)], 4.0, None),  # Two runners.
    ([(W, 3.4, 1), (J, 2.9, 0), (W, 3.1, 2)], 4.0, None),  # Compiling.
    # An early exit in view: the later of the client at exit's and a blocked
    # waiter's grace (3 s).
    ([(W, 2.5, 1), (X, 1.0, 0), (W, 0.5, 2)], 300.0, 2.0),
    ([(W, 0.2, 1), (X, 2.6, 0)], 300.0, 2.8),
    ([(W, 2.5, 80), (X, 1.0, 0)], 300.0, None),  # The waiter computes.
    # Nothing in view.
    ([(W, 2.5, 1), (W, 1.0, 0), (W, 0.5, 2)], 4.0, None),
    ([(R, 2.5, 1), (R, 1.0, 0)], 4.0, None),
])
def test_a_verdict_in_view_says_when_its_time_out_ends(states, stall, due):
  """`verdict_due`: where a stall or an early exit would be named if every
  client stays as it is, the seconds until its time-out ends (client 0
  calls that beat then, not at the next beat's time)."""
  phases, seconds, busy = (np.array(v) for v in zip(*states))
  joined = np.ones(len(states), bool)
  assert verdict_due(phases, seconds, busy, joined, 3.0, stall) == due


def test_the_called_beat_is_never_early_for_the_rule():
  """Rows are sampled before they come in: the decider counts each row's
  age, so that once `due` has passed, the called beat's rows (each sampled
  later still) reach the time-out."""
  decider = Decider(3, 3.0, StallTimeout(4.0), WaitLedger(3, 60.0, 30.0, 1.0), lambda: 0.0)
  layout = BeatLayout(3)
  merged = sum(layout.row(c, 7, False, phase, seconds, 0)
               for c, (phase, seconds) in enumerate([(W, 2.5), (W, 2.6), (R, 2.0)]))
  decider.first(sum(layout.row(c, 7 if c == 0 else 0, False, R, 0, 0) for c in range(3)))
  assert decider.decide(merged).verdict is None and decider.due == 2.0
  decider.decide(merged, ages=np.array([0.4, 0.0, 0.6]))
  assert decider.due == 1.4  # The shortest of 2.9, 2.6 and 2.6.
  called = sum(layout.row(c, 7, False, phase, seconds, 0)
               for c, (phase, seconds) in enumerate([(W, 4.5), (W, 4.6), (R, 4.0)]))
  outcome = decider.decide(called)  # The called beat: the stall is named.
  assert outcome.verdict == Verdict(STALLED, (2,), seconds=4, timeout=4.0)
  assert decider.due is None


def test_a_row_carries_its_seconds_to_a_tenth():
  layout = BeatLayout(2)
  merged = layout.row(0, 1, False, W, 2.37, 0) + layout.row(1, 0, False, R, 0.3, 0)
  assert layout.states(merged)[1].tolist() == [2.3, 0.3]


def test_judge_at_pod_scale_names_one_staller_among_4096():
  n = 4096
  states = [(W, 301, 1)] * n
  states[1234] = (R, 302, 0)
  assert _judge(states) == Verdict(STALLED, (1234,), seconds=302, timeout=300)


def decider(n, threshold=30.0, window=4.0):
  now = [100.0]
  d = Decider(n, 3.0, 300.0, WaitLedger(n, window, threshold, 1.0), lambda: now[0])
  return d, now


def merged(rows, n):
  return np.sum([r.vector(n) for r in rows], axis=0).astype(np.int32)


def first(n, token=77, others=0):
  return merged([Row(0, token, False, R, 0, 0, first=True)]
                + [Row(c, others, False, R, 0, 0, first=True) for c in range(1, n)], n)


def test_the_first_beat_spreads_client_0s_token():
  d, _ = decider(3)
  assert d.first(first(3)) == Outcome(0, 77)
  assert d.token == 77


def test_a_first_beat_with_another_token_names_its_slots():
  d, _ = decider(3)
  outcome = d.first(first(3, others=5))
  assert outcome.verdict == Verdict(FIRST_TOKENS, (1, 2), tokens=(77, 82, 82),
                                    cluster_token=77)


def states_beat(n, states, token=77, stop=()):
  return merged([Row(c, token, c in stop, p, s, b) for c, (p, s, b) in enumerate(states)], n)


def test_a_restarted_client_blames_itself_by_majority():
  d, _ = decider(4)
  d.first(first(4))
  beat = states_beat(4, [(R, 1, 0)] * 4)
  beat[2] = 999
  assert d.decide(beat).verdict == Verdict(OUT_OF_SYNC, (2,), tokens=(999,),
                                           cluster_token=77)


def test_a_tie_keeps_client_0s_token():
  d, _ = decider(2)
  d.first(first(2))
  beat = states_beat(2, [(R, 1, 0)] * 2)
  beat[1] = 5
  verdict = d.decide(beat).verdict
  assert (verdict.culprits, verdict.cluster_token) == ((1,), 77)
  assert verdict.token_of(1) == 5 and verdict.token_of(0) == 77


@pytest.mark.parametrize("states, stop", [
    ([(X, 0, 0), (X, 4, 0)], ()), ([(R, 1, 0), (W, 1, 0)], (1,))],
    ids=["all-at-exit", "stop-request"])
def test_the_agreed_end(states, stop):
  d, _ = decider(2)
  d.first(first(2))
  assert d.decide(states_beat(2, states, stop=stop)) == Outcome(1, 77, end=True)


def test_every_client_waiting_is_said_once():
  d, _ = decider(2)
  d.first(first(2))
  beat = states_beat(2, [(W, 400, 1), (W, 301, 0)])
  assert d.decide(beat).verdict == Verdict(ALL_WAITING, (0, 1))
  assert d.decide(beat).verdict is None


def test_a_straggler_is_named_once_with_its_share():
  d, now = decider(3, threshold=50.0, window=4.0)
  d.first(first(3))
  named = []
  for _ in range(6):
    now[0] += 1.0
    named += list(d.decide(states_beat(3, [(W, 1, 0), (W, 1, 0), (R, 1, 90)])).stragglers)
  assert named == [(2, 100.0)]
  assert d.run_seconds() == pytest.approx(5.0)
  assert d.waits.run_shares() == [0.0, 0.0, 100.0]


def test_the_decider_answers_who_is_in_set_up_and_who_runs():
  d, _ = decider(3)
  assert d.clients("unjoined") is None and d.status() == {}
  d.first(first(3))
  rows = [Row(0, 77, False, W, 1, 0), Row(1, 77, False, R, 9, 5, joined=False),
          Row(2, 77, False, X, 2, 0)]
  d.decide(merged(rows, 3))
  assert d.clients("unjoined") == [1] and d.clients("running") == [0, 1]
  assert d.status()["phases"] == [W, R, X] and d.status()["seconds"] == [1, 9, 2]


def test_the_layout_and_the_row_agree():
  layout = BeatLayout(3)
  row = Row(1, 9, True, IN_JAX, 2**40, 10**9, joined=False)
  vector = row.vector(3)
  assert vector.tolist() == layout.row(1, 9, True, IN_JAX, 2**40, 10**9, joined=False).tolist()
  assert layout.states(vector)[0].tolist() == [0, IN_JAX, 0]
  assert layout.joined(vector).tolist() == [True, False, True]
  assert vector[2 * 3 + 2] == 2**31 - 1 and vector[3 * 3 + 2] == 10**6


@pytest.mark.parametrize("outcome", [
    Outcome(0, 77), Outcome(2**32 - 1, -5, end=True),
    Outcome(3, 77, verdict=Verdict(STALLED, (1234,), seconds=301)),
    Outcome(3, 77, verdict=Verdict(EARLY_EXIT, (5,), waiting=tuple(range(5)) + tuple(range(6, 4096)))),
    Outcome(3, 77, verdict=Verdict(OUT_OF_SYNC, (1, 2), tokens=(5, 6), cluster_token=77)),
    Outcome(3, 77, end=True, stragglers=((2, 61.5),)),
], ids=["first", "plain-end", "stalled", "early-exit-4096", "out-of-sync", "straggler"])
def test_an_outcome_survives_the_wire(outcome):
  wire = outcome.to_wire()
  assert Outcome.from_wire(wire, 4096) == outcome
  # Small whatever the cluster: runs of clients, not lists.
  assert len(encode_binary(wire) if isinstance(wire, bytes) else encode(wire)) < 200


@pytest.mark.parametrize("wire", [
    b"X" + bytes(9), b"D", {"b": 1}, {"hb": "done", "b": 1, "t": 1, "v": {"k": "boom"}},
    {"hb": "done", "b": 1, "t": 1, "v": {"k": STALLED, "c": [[5, 9999]]}},
    {"hb": "done", "b": 1, "t": 1, "v": {"k": OUT_OF_SYNC, "c": [[1, 2]], "t": [1]}},
    {"hb": "done", "b": 1, "t": 1, "s": [[-1, 5.0]]},
])
def test_a_malformed_outcome_is_refused(wire):
  with pytest.raises((ValueError, KeyError, TypeError)):
    Outcome.from_wire(wire, 16)


def test_ranges_round_trip():
  assert to_ranges([5, 0, 1, 2, 7, 6, 2]) == [[0, 2], [5, 7]]
  assert from_ranges([[0, 2], [5, 7]], 8) == [0, 1, 2, 5, 6, 7]
  with pytest.raises(ValueError):
    from_ranges([[3, 1]], 8)


def _runs_one_id_at_a_time(clients):
  out = []
  for c in sorted(set(clients)):
    if out and c == out[-1][1] + 1:
      out[-1][1] = c
    else:
      out.append([c, c])
  return out


@given(st.lists(st.integers(0, 300), max_size=200))
def test_ranges_are_the_runs_of_the_sorted_distinct_ids(clients):
  assert to_ranges(clients) == _runs_one_id_at_a_time(clients)


def test_frames_mix_json_lines_and_binary_beats_across_reads():
  stream = (encode({"hb": "share", "k": "a", "v": "b"}) + encode_binary(b"R" * 19)
            + encode_binary(b"") + encode({"bye": True}))
  for cut in range(len(stream) + 1):
    frames = Frames(lenient=True, binary=True)
    out = frames.feed(stream[:cut]) + frames.feed(stream[cut:])
    assert out == [{"hb": "share", "k": "a", "v": "b"}, b"R" * 19, b"", {"bye": True}]
  # The handshake's frames take no binary frame.
  with pytest.raises(ValueError):
    Frames().feed(encode_binary(b"R") + b"\n")


# -- the learnt stall time-out ----------------------------------------------------

def _beats(pattern):
  """(phases, seconds, busy, joined, active) of 2 clients per beat: "w"
  client 1 waits while client 0 runs idle for the given seconds (neither
  main thread runs); "s" both step (one computes while the other waits, by
  turns; both main threads run); "u" client 0 is still in its set-up (never
  met the others) while client 1 waits; "i" both have met the others but
  neither main thread runs (a set-up's long load on one, a collective on
  the other: no step)."""
  for i, (kind, secs) in enumerate(pattern):
    if kind == "w":
      yield (np.array([R, W]), np.array([secs, secs + 1]), np.array([0, 1]),
             np.ones(2, bool), np.zeros(2, bool))
    elif kind == "u":
      yield (np.array([R, W]), np.array([i, i]), np.array([0, 1]),
             np.array([False, True]), np.zeros(2, bool))
    elif kind == "i":
      yield (np.array([J, W]), np.array([i, i]), np.array([90, 1]), np.ones(2, bool),
             np.zeros(2, bool))
    else:
      phases = [J, W] if i % 2 else [W, J]
      yield (np.array(phases), np.array([0, 0]), np.array([90, 1]), np.ones(2, bool),
             np.ones(2, bool))


def _learnt(pattern, ceiling=300.0, floor=30.0, learn=True):
  stall = StallTimeout(ceiling, floor, learn)
  for beat in _beats(pattern):
    stall.observe(*beat)
  return stall


STEADY = [("s", 0)] * 10  # The rhythm: 10 beats, 10 steps.


@pytest.mark.parametrize("pattern, value, current, longest", [
    # Before the rhythm (10 steps): the ceiling.
    (STEADY[:9], 300.0, 300.0, None),
    # The rhythm shown, no idle pause seen: the floor.
    (STEADY, 30.0, 30.0, None),
    # A pause of 4 s, over, after the rhythm: 5 x 4 = 20 s, below the floor.
    (STEADY + [("w", 2), ("w", 4), ("s", 0)], 30.0, 30.0, 4.0),
    # A pause of 10 s: 50 s.
    (STEADY + [("w", 4), ("w", 10), ("s", 0)], 50.0, 50.0, 10.0),
    # A pause of 100 s: 500 s, held at the ceiling.
    (STEADY + [("w", 100), ("s", 0)], 300.0, 300.0, 100.0),
    # A pause still going on teaches nothing (a stall must not raise its own
    # time-out), and is judged by the learnt time-out.
    (STEADY + [("w", 10), ("w", 20), ("w", 40)], 30.0, 30.0, None),
    # A pause before the rhythm teaches nothing (compilation, first steps).
    ([("w", 20), ("s", 0)] + STEADY, 30.0, 30.0, None),
    # The same runner's pause restarting shorter: the first one was over.
    (STEADY + [("w", 8), ("w", 1), ("s", 0)], 40.0, 40.0, 8.0),
    # A pause that began before the rhythm (a set-up after a barrier: three
    # steps, then one client loads for minutes) is judged by the ceiling,
    # however many beats it lasts: beats are not steps.
    ([("s", 0)] * 3 + [("w", k) for k in range(2, 200, 2)], 300.0, 300.0, None),
    # Beats in which no main thread runs are no rhythm.
    ([("i", 0)] * 100, 300.0, 300.0, None),
    # Once it is over and the run steps, the rhythm is shown.
    ([("s", 0)] * 3 + [("w", 60), ("s", 0)] + STEADY, 30.0, 30.0, None),
    # A client still in its set-up (a slow first step): no rhythm at all,
    # however long; counting starts once the client met the others.
    ([("u", 0)] * 100, 300.0, 300.0, None),
    ([("u", 0)] * 100 + STEADY[:9], 300.0, 300.0, None),
    ([("u", 0)] * 100 + STEADY, 30.0, 30.0, None),
], ids=["warming-up", "no-pause", "short-pause", "pause", "long-pause", "in-progress",
        "during-warm-up", "restarted", "began-before-the-rhythm", "no-steps",
        "after-the-early-pause", "in-set-up", "after-set-up", "after-set-up-warm"])
def test_the_stall_time_out_is_learnt_from_the_runs_pauses(pattern, value, current,
                                                           longest):
  stall = _learnt(pattern)
  assert (stall.value, stall.current, stall.longest) == (value, current, longest)


def test_learning_off_keeps_the_set_time_out():
  pattern = [("s", 0)] * 40
  assert _learnt(pattern, learn=False).value == 300.0
  assert not _learnt(pattern, learn=False).learnt
  # A floor at the ceiling (a short JDTENSOR_STALL_TIMEOUT): nothing to learn.
  assert _learnt(pattern, ceiling=5.0, floor=30.0).value == 5.0
  assert _learnt(pattern, ceiling=0.0).value == 0.0


def test_a_stall_under_a_learnt_time_out_says_so():
  d = Decider(2, 3.0, StallTimeout(300.0, 5.0, True),
              WaitLedger(2, 4.0, 30.0, 1.0), lambda: 100.0)
  d.first(merged([Row(0, 7, False, R, 0, 0, first=True), Row(1, 0, False, R, 0, 0, first=True)], 2))

  def beat(r0, r1):
    return d.decide(merged([Row(0, 7, False, *r0), Row(1, 7, False, *r1)], 2))
  for i in range(10):  # Steps: one computes while the other waits, by turns.
    rows = [(J, 0, 90), (W, 0, 1)]
    assert beat(*(rows if i % 2 else rows[::-1])).verdict is None
  assert beat((R, 1, 0), (W, 1, 1)).verdict is None  # A 1 s pause, then over.
  assert beat((J, 0, 90), (W, 0, 1)).verdict is None
  assert d.stall.value == 5.0  # 5 x 1 s, at the floor.
  assert beat((R, 4, 0), (W, 4, 1)).verdict is None
  assert beat((R, 6, 0), (W, 6, 1)).verdict == Verdict(STALLED, (0,), seconds=6,
                                                       timeout=5.0, learnt=1.0)
  # Every client reads the same verdict off the wire.
  outcome = Outcome(13, 7, verdict=Verdict(STALLED, (0,), seconds=6, timeout=5.0,
                                           learnt=1.0))
  assert Outcome.from_wire(outcome.to_wire(), 2) == outcome
  # An every-client wait still needs the set time-out, not the learnt one.
  assert beat((W, 60, 0), (W, 60, 1)).verdict is None


@pytest.mark.parametrize("moved, stalled", [
    (0, True), (MOVING_BYTES_PER_SECOND - 1, True),  # A hang moves nothing.
    (MOVING_BYTES_PER_SECOND, False), (64 * 1024, False),  # An upload, a slow read.
])
def test_a_client_that_moves_bytes_is_not_idle(moved, stalled):
  phases, seconds = np.array([R, W, W]), np.array([100, 100, 100])
  busy, joined = np.array([1, 1, 1]), np.ones(3, bool)
  verdict = judge(phases, seconds, busy, joined, 3.0, 60.0,
                  moved=np.array([moved, 10**6, 0]))  # A waiter's bytes say nothing.
  if stalled:
    assert verdict == Verdict(STALLED, (0,), seconds=100, timeout=60.0, busy=1,
                              moved=moved)
  else:
    assert verdict is None


def test_a_pause_that_began_before_the_rhythm_is_named_at_the_ceiling_and_says_so():
  d = Decider(2, 3.0, StallTimeout(40.0, 5.0, True),
              WaitLedger(2, 4.0, 30.0, 1.0), lambda: 100.0)
  d.first(merged([Row(0, 7, False, R, 0, 0, first=True),
                  Row(1, 7, False, R, 0, 0, first=True)], 2))

  def beat(secs, active=False):
    return d.decide(merged([Row(0, 7, False, R, secs, 0, active=active),
                            Row(1, 7, False, W, secs, 1, active=active)], 2)).verdict
  # Two steps after the barrier, then client 0 loads: the floor (5 s) never
  # applies to this pause, the ceiling (40 s) does.
  assert beat(0, True) is None and beat(0, True) is None
  for secs in range(1, 40, 1):
    assert beat(secs) is None, secs
  verdict = beat(40)
  assert verdict == Verdict(STALLED, (0,), seconds=40, timeout=40.0, early=True)
  assert Verdict.from_json(verdict.to_json(), 2) == verdict
