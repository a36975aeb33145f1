"""One deadline for a whole multi-step wait.

PURE: standard library only.

Start-up is several waits in a row (the handshake, the coordination service,
JAX's registration); each gets what is left of the user's one time-out, so
the steps together never overrun it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["Deadline"]


class Deadline:
  """A point in time `seconds` from now (monotonic clock).

  Args:
    seconds: The whole budget.
    clock: The clock (tests inject one).
  """

  def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
    self.seconds = float(seconds)
    self._clock = clock
    self.at = clock() + self.seconds

  def remaining(self) -> float:
    """Seconds left (negative once passed)."""
    return self.at - self._clock()

  def expired(self) -> bool:
    return self.remaining() <= 0

  def whole_seconds_left(self) -> int:
    """What is left as whole seconds, at least 1 (for APIs that take ints of
    seconds, e.g. JAX's; rounding up by under a second)."""
    return max(1, math.ceil(self.remaining()))

  def __repr__(self) -> str:
    return f"Deadline({self.seconds:g} s, {self.remaining():.3f} s left)"
