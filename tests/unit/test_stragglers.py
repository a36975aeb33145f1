"""Stragglers: the waiting ledger, the heartbeat naming a straggler on every
client, and the waits it records at the end (`jdtensor.heartbeat.stragglers`).

The files `jdtensor status` reads: tests/unit/test_status.py; the
multi-client test (real processes, `jdtensor launch`, `jdtensor status`):
tests/multiprocess/test_status.py.
"""

import logging
import time

import numpy as np
import pytest

from jdtensor import _env, heartbeat
from jdtensor.heartbeat.flight import AT_EXIT, IN_JAX, RUNNING, WAITING
from jdtensor.heartbeat.stragglers import WaitLedger
from tests.unit.test_heartbeat_protocol import (Hooks, Recorder, Store, SumExchange,
                                                ThreadExchange, first_exchanges,
                                                wait_for)

W, R, J, X = WAITING, RUNNING, IN_JAX, AT_EXIT


def feed(ledger, beats):
  """Adds one beat per phase vector; the new stragglers."""
  return [c for phases in beats for c in ledger.add(np.array(phases))]


def test_the_others_waiting_for_one_client_is_its_share():
  ledger = WaitLedger(4, window=10, threshold=30, period=1.0)
  named = feed(ledger, [[W, W, W, R]] * 10)
  assert named == [3]  # Named once, when the window is full.
  assert ledger.waited_for().tolist() == [0, 0, 0, 100]
  assert ledger.waiting().tolist() == [100, 100, 100, 0]
  assert feed(ledger, [[W, W, W, R]] * 5) == []  # Not again while it stays one.


def test_waiting_is_split_among_the_clients_waited_for_and_exit_takes_no_part():
  ledger = WaitLedger(4, window=4, threshold=30, period=1.0)
  # Two clients in their own code (one busy in JAX): each gets half of the
  # two waiters' time; a client at exit neither waits nor is waited for.
  feed(ledger, [[W, W, R, J], [W, X, R, J], [W, W, R, J], [W, W, R, J]])
  shares = ledger.waited_for()
  assert shares[0] == shares[1] == 0
  assert shares[2] == shares[3] == pytest.approx(100 * (3.5 * 2 / 2) / (3 * 4))
  assert ledger.run_shares() == pytest.approx(shares.tolist())


def test_the_window_is_counted_in_beats():
  assert WaitLedger(2, window=60, threshold=30, period=2.0).window_beats == 30
  assert WaitLedger(2, window=1, threshold=30, period=2.0).window_beats == 2


def test_below_the_threshold_or_switched_off_nobody_is_named():
  assert feed(WaitLedger(3, 10, 30, 1.0), [[W, R, R]] * 6 + [[R, R, R]] * 4) == []
  assert feed(WaitLedger(3, 10, 0, 1.0), [[W, W, R]] * 20) == []  # 0: off.
  # Before the window is full (set-up, a first compile), nobody either.
  assert feed(WaitLedger(3, 10, 30, 1.0), [[W, W, R]] * 9) == []


def test_a_straggler_is_named_again_only_after_it_recovered():
  # 100%, then 3 beats of 4 without waiting (25%, below half of 60): re-armed.
  assert feed(WaitLedger(2, 4, 60, 1.0), [[W, R]] * 4 + [[R, R]] * 3 + [[W, R]] * 4
              ) == [1, 1]
  # Only down to 50% (not below 30): still the same episode.
  assert feed(WaitLedger(2, 4, 60, 1.0), [[W, R]] * 4 + [[R, R]] * 2 + [[W, R]] * 4
              ) == [1]


def cluster(n, phases, window, threshold=30.0, period=0.02, wanted=False):
  ex = SumExchange(n)
  store = Store(ex)
  recorders, hooks = [], []
  for c in range(n):
    r = Recorder(f"client{c}.py:{10 + c} work")
    r.phase = phases[c]
    recorders.append(r)
    hooks.append(StatusHooks(wanted))
  hbs = [heartbeat.Heartbeat(
      _env.HeartbeatSettings(period=period, policy="log", stuck_timeout=3.0,
                             straggler_threshold=threshold, straggler_window=window),
      c, n, exchange=ThreadExchange(ex, store, c), process=hooks[c],
      recorder=recorders[c]) for c in range(n)]
  first_exchanges(hbs)
  return hbs, recorders, hooks


class StatusHooks(Hooks):
  """Records what the heartbeat publishes for `jdtensor status` and the launcher."""

  def __init__(self, wanted):
    super().__init__()
    self.wanted, self.statuses, self.waits = wanted, [], []

  def status_wanted(self):
    return self.wanted

  def publish_status(self, record):
    self.statuses.append(record)

  def publish_waits(self, shares, seconds, period):
    self.waits.append((shares, seconds))


def test_every_client_names_the_straggler_once_with_where_it_is(caplog):
  caplog.set_level(logging.WARNING, logger="jdtensor")
  hbs, recorders, _ = cluster(4, [W, W, W, R], window=0.3)
  for h in hbs:
    h.start_threads()
  said = None
  try:
    assert wait_for(lambda: sum("is a straggler" in r.getMessage()
                                for r in caplog.records) >= 4, 10), caplog.text
    time.sleep(0.3)  # Many beats more: still said once per client.
    said = [r.getMessage() for r in caplog.records if "is a straggler" in r.getMessage()]
  finally:
    for h in hbs:
      h.event.set()
    assert all(h.stopped.wait(5) for h in hbs)
  assert len(said) == 4, said
  # The straggler says it itself; the others fetch where it was.
  for text in said:
    assert text == ("heartbeat: client 3 is a straggler: the others waited for it "
                    "100% of the last 0.3 s (main thread in client3.py:13 work)"), text
  assert all(h.failure is None for h in hbs)  # Never a verdict.


def test_status_is_published_only_when_asked_and_the_waits_at_the_end():
  hbs, recorders, hooks = cluster(2, [W, R], window=0.2, wanted=True)
  quiet_hbs, quiet_recorders, quiet_hooks = cluster(2, [W, R], window=0.2, wanted=False)
  for h in hbs + quiet_hbs:
    h.start_threads()
  assert wait_for(lambda: len(hooks[0].statuses) > 20, 10)
  for r in recorders + quiet_recorders:
    r.phase, r.at_exit = R, True
  for h in hbs + quiet_hbs:
    h.finish()
  assert all(h.stopped.wait(5) for h in hbs + quiet_hbs)
  assert not quiet_hooks[0].statuses and not quiet_hooks[1].statuses
  last = hooks[0].statuses[-1]
  assert last["client"] == 0 and last["where"] == "client0.py:10 work"
  assert last["phases"] == [W, R] and last["window"] == 0.2
  assert last["waiting"][0] == pytest.approx(100, abs=1)
  assert last["waited_for"][1] == pytest.approx(100, abs=1)
  # Every client's record of the run: the same shares, said at the agreed end.
  (shares0, seconds0), = hooks[0].waits
  (shares1, _), = hooks[1].waits
  assert shares0 == pytest.approx(shares1, abs=5) and shares0[1] > 90 and seconds0 > 0
