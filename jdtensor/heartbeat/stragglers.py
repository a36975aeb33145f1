"""Who the others wait for: each client's share of the time the other clients
spent waiting in collectives for it, over a sliding window and over the run.

Read from the merged beats alone (every client has the same ones), so every
client names the same straggler at the same beat, with no traffic of its own.
Each beat counts as one period: the clients waiting in a collective
(`WAITING`) wait for the clients that are not (running their own code, or
busy inside JAX); each waiter's time is split evenly among those it
waits for. Clients at exit take no part (leaving early has its own verdict).
A beat samples each main thread once, so over a window of many beats the
shares estimate the time fractions.

A straggler is named once (a warning, never a kill); every client publishes
its status while `jdtensor status` asks (`jdtensor._status`), and records the
run's shares at its normal end for the launcher's summary.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from jdtensor.heartbeat.flight import AT_EXIT, WAITING

__all__ = ["WaitLedger"]


class WaitLedger:
  """Waiting per client, over a sliding window and over the whole run.

  Counted in beats, not in each client's own clock, so that every client
  holds exactly the same numbers and names the same straggler at the same
  beat (the beats of a run are a period apart: the exchange aligns them).

  Args:
    num_clients: Number of clients.
    window: The sliding window, seconds (a whole number of periods).
    threshold: A client the others wait for more than this share (percent)
      of a full window becomes a straggler; 0: never.
    period: Seconds between beats.
  """

  def __init__(self, num_clients: int, window: float, threshold: float,
               period: float):
    self.num_clients, self.window, self.threshold = num_clients, window, threshold
    self.window_beats = max(2, round(window / period))
    # Per beat: (waited for each client, waiting of each client), in beats.
    self._beats: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=self.window_beats)
    self._flagged: set[int] = set()
    self.run_beats = 0
    self.run_waited_for = np.zeros(num_clients)

  def add(self, phases: np.ndarray) -> list[int]:
    """Adds one beat's phases; returns the clients that have just become
    stragglers."""
    n = self.num_clients
    active = phases != AT_EXIT
    waiting = (phases == WAITING) & active
    waited_on = active & ~waiting
    blame = np.zeros(n)
    if waiting.any() and waited_on.any():
      blame[waited_on] = waiting.sum() / waited_on.sum()
    self._beats.append((blame, waiting.astype(float)))
    self.run_beats += 1
    self.run_waited_for += blame
    if self.threshold <= 0 or len(self._beats) < self.window_beats:
      return []
    shares = self.waited_for()
    new = [c for c in range(n) if shares[c] > self.threshold and c not in self._flagged]
    # Named again only after it has clearly recovered (below half the threshold).
    self._flagged = {c for c in self._flagged if shares[c] >= self.threshold / 2}
    self._flagged.update(new)
    return new

  def waited_for(self) -> np.ndarray:
    """Per client: percent of the window the other clients (on average)
    spent waiting for it in collectives."""
    if not self._beats or self.num_clients < 2:
      return np.zeros(self.num_clients)
    total = sum(b[0] for b in self._beats)
    return 100.0 * total / ((self.num_clients - 1) * len(self._beats))

  def waiting(self) -> np.ndarray:
    """Per client: percent of the window it spent waiting in collectives."""
    if not self._beats:
      return np.zeros(self.num_clients)
    return 100.0 * sum(b[1] for b in self._beats) / len(self._beats)

  def run_shares(self) -> list[float]:
    """Per client: percent of the run the others spent waiting for it."""
    if self.run_beats <= 0 or self.num_clients < 2:
      return [0.0] * self.num_clients
    return [float(v) for v in
            100.0 * self.run_waited_for / ((self.num_clients - 1) * self.run_beats)]
