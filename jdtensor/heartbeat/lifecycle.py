"""One client's heartbeat, from start to end: one phase under one lock.

Four threads act on a heartbeat (the beat thread, the watchdog, the liveness
links' and the main thread on its way out); what each may do depends on where
the heartbeat is, and two of them may race (a verdict on the links' thread
while the main thread leaves with a failure). So the heartbeat's state is one
`Phase`, changed only by an event of `EVENTS` under one lock, and every
change is a row of `MOVES`; the rest of the table says which events leave a
phase as it is (`STAYS`: a second verdict after the first, a stop after a
verdict) and which cannot happen at all (`ILLEGAL`: raised where `STRICT`,
as the tests run it; ignored in a run, where a wrong guess must not crash the
way out).

The first verdict is the failure (`record`): recorded with the phase it came
in, so that its words and its policy are decided once, under the lock, and a
client leaving with a failure (`abandon`) either sees it or makes it ignored.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

from jdtensor.errors import PeerFailureError

__all__ = ["Phase", "Lifecycle", "IllegalMove", "WakingEvent", "EVENTS", "MOVES", "STAYS", "ILLEGAL",
           "STRICT"]


class Phase(enum.Enum):
  """Where a heartbeat is."""
  RUNNING = "running"  # The script runs; the heartbeat beats and judges.
  FINISHING = "finishing"  # The script ended normally: beats at exit until the agreed end.
  ABANDONED = "abandoned"  # The script leaves with a failure: reacts to nothing more.
  FAILED = "failed"  # A verdict under policy log or raise: beats no more.
  TERMINATING = "terminating"  # A verdict under "terminate": its thread ends the process.
  ENDED = "ended"  # The beat thread ended without a verdict (the agreed end, a stop).


RUNNING, FINISHING, ABANDONED, FAILED, TERMINATING, ENDED = Phase

# What happens to a heartbeat: the script ends normally (finish) or with a
# failure (abandon); a verdict under policy log or raise (fail) or under
# "terminate" (terminate); the beat thread ends (end).
EVENTS = ("finish", "abandon", "fail", "terminate", "end")

# Every change of phase, listed once.
MOVES: dict[tuple[Phase, str], Phase] = {
    (RUNNING, "finish"): FINISHING,
    (RUNNING, "abandon"): ABANDONED,
    (FINISHING, "abandon"): ABANDONED,
    (RUNNING, "fail"): FAILED,
    (RUNNING, "terminate"): TERMINATING,
    # A client at exit only says what happens to the others (no exit of its
    # own under "terminate": it is ending already).
    (FINISHING, "fail"): FAILED,
    (FINISHING, "terminate"): FAILED,
    # After a stop by agreement, a collective's error can still name a
    # client that never joined it (`Heartbeat.late_for_collective`).
    (ENDED, "fail"): FAILED,
    (ENDED, "terminate"): TERMINATING,
    (RUNNING, "end"): ENDED,
    (FINISHING, "end"): ENDED,
}
# Events that cannot happen: the way out runs once, and a client leaving with
# a failure never finishes.
ILLEGAL = {(ABANDONED, "finish")}
# Every other event leaves the phase as it is: the first verdict wins, a
# leaving client reacts to nothing, a thread ending after a verdict changes
# nothing, and a script that ends while a verdict ends the process or after
# the heartbeat ended is too late to change either.
STAYS = {(phase, event) for phase in Phase for event in EVENTS} - set(MOVES) - ILLEGAL

# Whether an illegal event raises (the tests set it); in a run it is ignored.
STRICT = False


class WakingEvent(threading.Event):
  """The user's stop event (the agreed stop, `Heartbeat.event`); setting it
  also wakes the beat thread (`wake`), which then beats at once."""

  def __init__(self, wake: threading.Event):
    super().__init__()
    self._wake = wake

  def set(self) -> None:
    super().set()
    self._wake.set()


class IllegalMove(RuntimeError):
  """An event that `ILLEGAL` says cannot happen in this phase."""


class Lifecycle:
  """One heartbeat's phase, its failure, and the two moments other threads
  wait for.

  Attributes:
    stopped: Set once the heartbeat does nothing more: its thread ended, a
      verdict under log or raise, or the script leaving with a failure.
    said: Set once a verdict under "terminate" has been said (whoever leaves
      first must not end the process before).
    closed_cleanly: Whether the teardown after the agreed end succeeded
      (None: none ran).
  """

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._phase = RUNNING
    self._failure: PeerFailureError | None = None
    self.stopped = threading.Event()
    self.said = threading.Event()
    self.closed_cleanly: bool | None = None

  @property
  def phase(self) -> Phase:
    return self._phase

  @property
  def failure(self) -> PeerFailureError | None:
    """The first verdict, if any."""
    return self._failure

  def _move(self, event: str) -> Phase | None:
    """Applies `event` (under the lock); the phase before if it moved."""
    key = (self._phase, event)
    if key in MOVES:
      before, self._phase = self._phase, MOVES[key]
      return before
    if key in ILLEGAL and STRICT:
      raise IllegalMove(f"the heartbeat cannot {event} while {self._phase.value}")
    return None

  def move(self, event: str) -> bool:
    """Applies `event`; whether the phase changed."""
    with self._lock:
      return self._move(event) is not None

  def record(self, error_for: Callable[[Phase], PeerFailureError],
             terminate: bool) -> tuple[PeerFailureError, Phase] | None:
    """A verdict: the first one is this heartbeat's failure.

    Args:
      error_for: The failure, worded for the phase it comes in.
      terminate: Whether the policy is "terminate".

    Returns:
      (the failure, the phase it came in), or None when it is not recorded
      (a failure is already, or the script is leaving with one).
    """
    with self._lock:
      before = self._move("terminate" if terminate else "fail")
      if before is None:
        return None
      self._failure = error_for(before)
      return self._failure, before

  def abandon(self) -> PeerFailureError | None:
    """The script leaves with a failure: the failure recorded before it, if
    any; a verdict after it is not recorded."""
    with self._lock:
      self._move("abandon")
      return self._failure
