"""The liveness links' messages: each crosses the wire as it was, the sender
stands in for a missing reporter, and a malformed one is refused
(`jdtensor.runtime.link_messages`)."""

import pytest

from jdtensor._wire import Frames, encode
from jdtensor.runtime import link_messages as m

MESSAGES = [m.Failed((1, 2), "client 1 stalled", (1,), 0),
            m.Left(3, 1, "failed: ValueError: bad", True, raised=True),
            m.Left(2, 0, "exited (code 0)", False),
            m.Notice("thread 'loader' died: OSError", 4), m.Ended(5), m.Bye(),
            m.ServiceUp()]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda x: type(x).__name__)
def test_each_message_crosses_the_wire_as_it_was(message):
  frames = Frames()
  (frame,) = list(frames.feed(encode(message.to_frame())))
  assert m.read(frame, sender=9) == message


def test_a_report_without_its_reporter_is_the_senders():
  assert m.read({"failed": [1], "why": "w"}, sender=4) == m.Failed((1,), "w", (), 4)
  assert m.read({"notice": "n"}, sender=2) == m.Notice("n", 2)
  assert m.Failed((1,), "w", (1,), 4).reason.reporter == 4


@pytest.mark.parametrize("frame", [{"failed": "x1"}, {"left": "one"}, {"ended": None},
                                   {"notice": "n", "by": "zero"}, {"failed": [1], "by": []}])
def test_a_malformed_message_is_refused(frame):
  with pytest.raises((KeyError, TypeError, ValueError)):
    m.read(frame, sender=1)


def test_an_unknown_message_is_none():
  assert m.read({"future": 1}, sender=1) is None
