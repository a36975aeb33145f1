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
      self.freeze_if_stuck(c)
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


class RollCall:
  """The key-value roll call: who said "I am in beat N"."""

  def __init__(self, ex):
    self.ex = ex
    self.present = {}
    self.lock = threading.Lock()

  def for_client(self, c):
    def roll_call(beat, grace):
      self.ex.freeze_if_stuck(c)  # A frozen process answers nothing.
      with self.lock:
        self.present.setdefault(beat, set()).add(c)
      deadline = time.monotonic() + grace
      while time.monotonic() < deadline and len(self.present[beat]) < self.ex.n:
        time.sleep(0.01)
      with self.lock:
        return set(self.present[beat])
    return roll_call


def make_cluster(n, period=0.02, policy="log", token_seed=None):
  ex = SumExchange(n)
  calls = RollCall(ex)
  exits = []
  hbs = [heartbeat.Heartbeat(
      period, policy, ex.for_client(c), c, n, roll_call=calls.for_client(c),
      terminate=exits.append) for c in range(n)]
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
  # The 3 s deadline, then the roll call's grace, then the report.
  assert 2.5 < time.monotonic() - start < 3 + heartbeat.ROLL_CALL_GRACE + 2
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
  threading.Thread(target=hbs[1]._roll_call, args=(1, 5.0), daemon=True).start()
  hbs[0].start_threads()  # ...although it answers beat 1's roll call.
  assert hbs[0].stopped.wait(10)
  assert str(hbs[0].failure).startswith("heartbeat: beat 1 did not complete within 3 s "
                                        "although every client started it; raising ")
  assert not exits


def test_an_exception_in_the_heartbeats_own_code_is_this_clients_failure():
  ex, hbs, exits = make_cluster(2, period=0.02, policy="terminate")
  announced = []
  hbs[1]._announce = lambda clients, why: announced.append((clients, why))

  def broken_row(signal, stop, real=hbs[1]._row):
    if hbs[1].beats == 3:
      raise TypeError("a bug in the record code")
    return real(signal, stop)
  hbs[1]._row = broken_row
  hbs[1].start_threads()
  hbs[0]._terminate = lambda code: None  # Client 0 waits; only 1 is checked.
  hbs[0].start_threads()
  deadline = time.monotonic() + 10
  while not exits and time.monotonic() < deadline:
    time.sleep(0.02)
  assert exits == [heartbeat.OWN_FAILURE_EXIT_CODE]  # A root cause, not 75.
  message = str(hbs[1].failure)
  assert hbs[1].failure.client_ids == (1,)
  assert message.startswith("heartbeat: this client's (1) heartbeat failed in its "
                            "own code: TypeError: a bug in the record code\n"
                            "Traceback (most recent call last):\n")
  assert message.endswith("TypeError: a bug in the record code\n; stopping this client")
  assert "missed beat" not in message  # Never blamed on a peer.
  assert announced and announced[0][0] == [1]
  hbs[0].event.set()


def test_a_wrong_sum_is_not_reported_as_a_contradiction():
  """Seen before the private runtime: 'it sent token 12927, the cluster's is
  12927'. A slot only its owner writes that comes back wrong means the
  exchange itself is broken, and the message says so."""
  hb = heartbeat.Heartbeat(1, "log", lambda r: r, 2, 3)
  hb.token = 12927
  hb.beats = 5
  hb._token_mismatch(np.array([12927, 12927, 4242]))
  assert str(hb.failure) == (
      "heartbeat: beat 5 returned a wrong sum: this client (2) sent token 12927 "
      "but its slot holds 4242 (all slots: [12927, 12927, 4242]); carrying on "
      "(policy 'log')")
  assert hb.failure.client_ids == (2,)


def test_links_only_heartbeat_stops_and_names_a_dead_client():
  """Without the private runtime: no beats; the liveness links still work."""
  hb = heartbeat.Heartbeat(0.05, "log", None, 0, 3)
  hb.start_threads()
  assert hb.ready.wait(1)
  hb.peer_died(2, "its process ended without saying goodbye")
  assert str(hb.failure) == ("heartbeat: client 2 is gone (its process ended "
                             "without saying goodbye); carrying on (policy 'log')")
  assert hb.stop(timeout=1)
  quiet = heartbeat.Heartbeat(0.05, "log", None, 0, 3)
  quiet.start_threads()
  assert quiet.stop(timeout=1) and quiet.failure is None and quiet.beats == 0


def test_agreed_stop_runs_the_collective_teardown_on_every_client():
  ex = SumExchange(2)
  closed = []
  hbs = [heartbeat.Heartbeat(0.02, "log", ex.for_client(c), c, 2,
                             close_exchange=lambda t, c=c: closed.append(c) or True)
         for c in range(2)]
  for h in hbs:
    h.start_threads()
  time.sleep(0.2)
  hbs[0].event.set()
  assert all(h.stopped.wait(5) for h in hbs)
  assert sorted(closed) == [0, 1] and all(h.closed_cleanly for h in hbs)
