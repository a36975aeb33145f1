"""The heartbeat's watchdog: an overdue beat, and a process that was frozen.

A thread of its own, apart from the beat thread it watches: a beat that
blocks (a peer stopped, the network cut) cannot time itself out. It wakes
every second; a beat running past the stuck time-out ends the watch
(`on_overdue`), and a wake-up far later than asked means the whole process
did not run for that long (SIGSTOP, swap): `on_frozen` with the seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Watchdog", "PAUSE_TOLERANCE"]

# Seconds the watchdog may be late before it concludes its process was frozen.
PAUSE_TOLERANCE = 2.0
_TICK = 1.0


class Watchdog:
  """Watches one client's beats.

  Args:
    clock: Monotonic seconds.
    stuck_timeout: Seconds a beat may take.
    done: Set once the watched beats are over (the watch ends with it).
    on_overdue: Called once when a beat passes the stuck time-out.
    on_frozen: Called with the seconds this process did not run, when more
      than `PAUSE_TOLERANCE`.
    on_error: Called with an exception of the callbacks (this client's own).
  """

  def __init__(self, clock: Callable[[], float], stuck_timeout: float,
               done: threading.Event, on_overdue: Callable[[], None],
               on_frozen: Callable[[float], None],
               on_error: Callable[[BaseException], None]):
    self._clock, self._stuck_timeout, self._done = clock, stuck_timeout, done
    self._on_overdue, self._on_frozen, self._on_error = on_overdue, on_frozen, on_error
    self._changed = threading.Condition()
    self._beat_started: float | None = None

  # A beat's start and end are noted, not signalled: the watch reads them at
  # its next tick (an overdue beat is seconds late, never a tick), and
  # waking it twice a beat would cost every client two thread switches a
  # beat for nothing (a worker of the pod simulation, a thousand).
  def beat_started(self, when: float) -> None:
    self._beat_started = when  # One attribute store: atomic.

  def beat_ended(self) -> None:
    self._beat_started = None

  def wake(self) -> None:
    """Wakes the watch at once (to see `done`)."""
    with self._changed:
      self._changed.notify_all()

  def run(self) -> None:
    """The watchdog thread's body."""
    try:
      tick = self._clock()
      with self._changed:
        while not self._done.is_set():
          self._changed.wait(_TICK)
          now = self._clock()
          frozen = now - tick - _TICK
          tick = now
          if frozen > PAUSE_TOLERANCE:
            self._on_frozen(frozen)
          started = self._beat_started
          if started is not None and now - started > self._stuck_timeout:
            break
      if not self._done.is_set():
        self._on_overdue()
    except BaseException as e:  # pylint: disable=broad-except
      self._on_error(e)
