"""The heartbeat's messages on the links: a row's binary frame, and the
exchange's questions and answers, each read back as it was sent
(`jdtensor.heartbeat.wire`)."""

import json

import pytest

from jdtensor.heartbeat import wire
from jdtensor.heartbeat.flight import AT_EXIT, RUNNING

N = 300


@pytest.mark.parametrize("row", [
    wire.Row(0, 4242, False, RUNNING, 12.7, 35.2, moved=10_000.5),
    wire.Row(7, 0, True, AT_EXIT, 2**40, 10**9, joined=False, active=False)],
    ids=["running", "clamped-at-exit"])
def test_a_rows_frame_reads_back(row):
  frame = wire.row_frame(17, row)
  assert frame[:1] == bytes((wire.ROW,)) and len(frame) == wire.ROW_FRAME.size
  beat, token, stop, phase, seconds, busy, moved = wire.read_row_frame(frame)
  assert (beat, token, stop, phase) == (17, row.token, int(row.stop), row.phase_code)
  assert (seconds, busy) == row.clamped and moved == row.moved_slot
  assert phase & wire.PHASE_BITS == row.phase


def test_a_short_row_frame_is_refused():
  with pytest.raises(ValueError, match="a row of 3 bytes"):
    wire.read_row_frame(b"R\x00\x01")


@pytest.mark.parametrize("message", [
    wire.RollCall(5, 3), wire.Present(3, (1, 2, 3, 299)), wire.Present(4, ()),
    wire.Ask("unjoined", 9), wire.Answer(9, (0, 7)), wire.Answer(10, None),
    wire.Shared("stall/12", "train.py:3 step"),
    wire.Outcome(8, 4242, True, stragglers=((2, 90.0),))],
    ids=lambda m: type(m).__name__)
def test_each_exchange_message_reads_back(message):
  frame = message.to_wire() if isinstance(message, wire.Outcome) else message.to_frame()
  assert wire.read_exchange(json.loads(json.dumps(frame)), N) == message


@pytest.mark.parametrize("frame", [{"hb": "roll"}, {"hb": "present", "q": 1, "m": [[5, 400]]},
                                   {"hb": "answer", "q": "x", "c": None},
                                   {"hb": "ask", "w": "x"}, {"nohb": 1}])
def test_a_malformed_exchange_message_is_refused(frame):
  with pytest.raises((KeyError, TypeError, ValueError)):
    wire.read_exchange(frame, N)


def test_an_unknown_kind_is_none():
  assert wire.read_exchange({"hb": "future"}, N) is None
