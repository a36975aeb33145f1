"""Heartbeat protocol logic with an in-process exchange (threads as clients).

The real psum over the reserved devices is tested in
tests/multiprocess/test_heartbeat.py; here the exchange is a thread barrier
that sums rows, so that stop agreement, token checks, deadlines and policies
are tested fast and deterministically.
"""

import threading
import time

import numpy as np
import pytest

from jdtensor import heartbeat
from jdtensor.errors import ConfigError


class SumExchange:
  """Sums one row per thread-client; `stuck` clients never arrive."""

  def __init__(self, n):
    self.n = n
    self.rows = {}
    self.cond = threading.Condition()
    self.round = 0
    self.result = None
    self.stuck = set()

  def freeze_if_stuck(self, c):
    while c in self.stuck:  # A frozen process (e.g. SIGSTOP) does nothing.
      time.sleep(0.05)

  def for_client(self, c):
    def exchange(row):
      with self.cond:
        my_round = self.round
        self.rows[c] = row.copy()
        if len(self.rows) == self.n:
          self.result = sum(self.rows.values())
          self.rows = {}
          self.round += 1
          self.cond.notify_all()
        else:
          self.cond.wait_for(lambda: self.round > my_round)
        return self.result.copy()
    return exchange


def make_cluster(n, period=0.02, policy="log", token_seed=None):
  ex = SumExchange(n)
  beats = {}
  exits = []
  hbs = [heartbeat.Heartbeat(
      period, policy, ex.for_client(c), c, n,
      record_beat=lambda client, beat, wall: (ex.freeze_if_stuck(client),
                                              beats.__setitem__(client, (beat, wall))),
      read_beats=lambda: dict(beats), terminate=exits.append) for c in range(n)]
  threads = [threading.Thread(target=h.first_exchange) for h in hbs]
  for t in threads:
    t.start()
  for t in threads:
    t.join(10)
  return ex, hbs, exits


def test_first_exchange_spreads_client_0_token():
  _, hbs, _ = make_cluster(3)
  assert len({h.token for h in hbs}) == 1 and all(h.failure is None for h in hbs)


def test_agreed_stop_gives_equal_beat_counts():
  _, hbs, _ = make_cluster(3)
  for h in hbs:
    h.start_threads()
  time.sleep(0.3)
  hbs[1].event.set()  # One client asks; every client stops after the same beat.
  assert all(h.stopped.wait(5) for h in hbs)
  assert len({h.beats for h in hbs}) == 1 and hbs[0].beats > 3
  assert all(h.failure is None for h in hbs)


def test_out_of_sync_token_majority_names_the_culprit():
  _, hbs, _ = make_cluster(3)
  hbs[2].token ^= 0x1234
  for h in hbs:
    h.start_threads()
  assert all(h.stopped.wait(5) for h in hbs)
  assert hbs[0].failure.client_ids == (2,) and hbs[1].failure.client_ids == (2,)
  assert str(hbs[0].failure).startswith("heartbeat: client 2 sent token ")
  assert str(hbs[2].failure).startswith("heartbeat: this client (2) is out of sync")


def test_stuck_client_is_named_after_the_deadline_and_terminated():
  ex, hbs, exits = make_cluster(2, period=0.05, policy="terminate")
  for h in hbs:
    h.start_threads()
  time.sleep(0.3)
  ex.stuck.add(1)  # Client 1 freezes (alive but stuck) before its next beat.
  start = time.monotonic()
  while not exits and time.monotonic() - start < 10:
    time.sleep(0.05)
  assert exits[0] == heartbeat.EXIT_CODE
  assert 2.5 < time.monotonic() - start < 6  # The 3 s deadline, then the report.
  assert hbs[0].failure.client_ids == (1,)
  assert str(hbs[0].failure).startswith("heartbeat: client 1 missed beat ")
  assert str(hbs[0].failure).endswith("s ago); stopping this client")


def test_peer_died_after_agreed_stop_is_not_a_failure():
  _, hbs, _ = make_cluster(2)
  for h in hbs:
    h.start_threads()
  hbs[0].event.set()
  assert all(h.stopped.wait(5) for h in hbs)
  hbs[0].peer_died(1, "its process ended without saying goodbye")
  assert hbs[0].failure is None


def test_configuration_checks():
  assert heartbeat.deadline_for(0.1) == 3.0 and heartbeat.deadline_for(10) == 20.0
  assert heartbeat.read_period({}) == heartbeat.DEFAULT_PERIOD
  assert heartbeat.read_period({"JDTENSOR_HEARTBEAT_PERIOD": "0.5"}) == 0.5
  with pytest.raises(ConfigError, match="^JDTENSOR_HEARTBEAT_PERIOD='0' must be"):
    heartbeat.read_period({"JDTENSOR_HEARTBEAT_PERIOD": "0"})
  assert heartbeat.read_policy({"JDTENSOR_HEARTBEAT_POLICY": " Raise "}) == "raise"
  with pytest.raises(ConfigError) as e:
    heartbeat.read_policy({"JDTENSOR_HEARTBEAT_POLICY": "abort"})
  assert str(e.value) == ("JDTENSOR_HEARTBEAT_POLICY='abort' is not one of "
                          "terminate, raise, log.")
  with pytest.raises(ConfigError, match="period=-1 must be a finite number"):
    heartbeat.Heartbeat(-1, "log", lambda r: r, 0, 2)
  with pytest.raises(ConfigError, match="policy='loud' is not one of"):
    heartbeat.Heartbeat(1, "loud", lambda r: r, 0, 2)
  assert np.array_equal(heartbeat.Heartbeat(1, "log", lambda r: r, 0, 2)._row(
      np.array([5, 5]), True), [5, 5, 1])


def test_beat_stuck_after_every_client_started_it():
  ex, hbs, exits = make_cluster(2, period=0.05, policy="raise")
  hbs[1].start_threads = lambda: None  # Client 1 never beats again...
  hbs[1]._record(1, 10**6, time.time())  # ...although it claims it started.
  hbs[0].start_threads()
  assert hbs[0].stopped.wait(10)
  assert str(hbs[0].failure).startswith("heartbeat: beat 1 did not complete within 3 s "
                                        "although every client started it; raising ")
  assert not exits
