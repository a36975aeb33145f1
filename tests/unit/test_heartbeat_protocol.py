"""Heartbeat protocol logic with an in-process exchange (threads as clients).

The real all-reduce on the liveness links is tested in
tests/unit/test_link_exchange.py and tests/multiprocess/; here the exchange is a thread barrier that sums rows, the
roll call and the shared texts are dictionaries, the process's hooks record
what they are asked, and each client's main-thread recorder is scripted, so that stop agreement, token checks, deadlines,
verdicts and policies are tested fast and deterministically.
"""

import threading
import time

import numpy as np
import pytest

from jdtensor import _env, heartbeat
from jdtensor._report import Reason
from jdtensor.heartbeat import flight, protocol, verdicts
from jdtensor.heartbeat.failures import Failure
from jdtensor.heartbeat.interfaces import Exchange, Peers, ProcessHooks
from jdtensor.heartbeat.leaving import WayOut
from jdtensor.heartbeat.flight import AT_EXIT, IN_JAX, RUNNING, WAITING
from jdtensor.errors import OWN_FAILURE_EXIT_CODE, PEER_FAILURE_EXIT_CODE
from jdtensor.heartbeat import lifecycle


@pytest.fixture(autouse=True)
def _strict_lifecycle(monkeypatch):
  """Every heartbeat here runs with illegal moves raised (`lifecycle.STRICT`)."""
  monkeypatch.setattr(lifecycle, "STRICT", True)


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

  def all_reduce(self, c, row):
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


class Store:
  """The key-value store: roll calls and shared texts."""

  def __init__(self, ex):
    self.ex = ex
    self.present = {}
    self.texts = {}
    self.lock = threading.Condition()

  def roll_call(self, c, beat, grace):
    self.ex.freeze_if_stuck(c)  # A frozen process answers nothing.
    with self.lock:
      self.present.setdefault(beat, set()).add(c)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and len(self.present[beat]) < self.ex.n:
      time.sleep(0.01)
    with self.lock:
      return set(self.present[beat])

  def share(self, key, value):
    with self.lock:
      self.texts[key] = value
      self.lock.notify_all()

  def fetch(self, key, timeout):
    with self.lock:
      self.lock.wait_for(lambda: key in self.texts, timeout)
      return self.texts.get(key)


class ThreadExchange(Exchange):
  """Client `c`'s end of the in-process exchange and store."""

  def __init__(self, ex, store, c, closed=None):
    self.ex, self.store, self.c, self.closed = ex, store, c, closed

  def all_reduce(self, row):
    return self.ex.all_reduce(self.c, row)

  def roll_call(self, beat, grace):
    return self.store.roll_call(self.c, beat, grace)

  def share(self, key, value):
    self.store.share(key, value)

  def fetch(self, key, timeout):
    return self.store.fetch(key, timeout)

  def close(self, timeout):
    if self.closed is not None:
      self.closed.append(self.c)
    return True


class Echo(Exchange):
  """One client's view of a sum it alone takes part in; `store` shares texts."""

  def __init__(self, store=None):
    self.store = store

  def all_reduce(self, row):
    return row

  def share(self, key, value):
    if self.store is not None:
      self.store.share(key, value)

  def fetch(self, key, timeout):
    return self.store.fetch(key, timeout) if self.store is not None else None


class Hooks(ProcessHooks):
  """The process: exits and reports recorded, CPU time 0, a settable clock."""

  def __init__(self, exits=None, reported=None, now=None):
    self.exits = exits if exits is not None else []
    self.reported = reported if reported is not None else []
    self.leaving = []
    self.now = now

  def terminate(self, code):
    self.exits.append(code)

  def tell_launcher(self, clients, reason, leaving):
    self.reported.append((clients, reason.heartbeat_line()))
    self.leaving.append(leaving)

  def cpu_seconds(self):
    return 0.0

  def clock(self):
    return self.now[0] if self.now is not None else time.monotonic()


class WaitingPeers(Peers):
  """Records whom client 0 would wait for before it exits."""

  def __init__(self):
    self.ignored = []

  def wait_peers_gone(self, timeout, ignore=()):
    self.ignored.append(list(ignore))


def settings(period=1.0, policy="log", stuck_timeout=None, stall_timeout=300.0,
             stall_kill_all_waiting=False):
  return _env.HeartbeatSettings(
      period=period, policy=policy,
      stuck_timeout=max(60.0, 2 * period) if stuck_timeout is None else stuck_timeout,
      stall_timeout=stall_timeout, stall_kill_all_waiting=stall_kill_all_waiting)


def beat(period, policy, me, n, exchange=None, **kwargs):
  """One client's Heartbeat with `Echo` as its exchange by default."""
  setting_names = ("stuck_timeout", "stall_timeout", "stall_kill_all_waiting")
  chosen = {k: kwargs.pop(k) for k in setting_names if k in kwargs}
  return heartbeat.Heartbeat(settings(period, policy, **chosen), me, n,
                             exchange=Echo() if exchange is None else exchange,
                             **kwargs)


class Recorder(flight.Recorder):
  """A scripted main thread: `phase` and `seconds` are what the beat says."""
  active = True  # Its main thread ran (each beat is a step).

  def __init__(self, where="train.py:10 step"):
    self.phase, self.seconds, self.at_exit, self._where = RUNNING, 0.0, False, where

  def sample(self, busy=0.0, idle_percent=25.0, moving=False):
    if self.at_exit and self.phase != WAITING:
      return AT_EXIT, self.seconds
    return self.phase, self.seconds

  def where(self):
    return self._where

  def where_in_program(self):
    return None if self.at_exit else self._where


def first_exchanges(hbs):
  """Runs every client's first exchange together (it is collective)."""
  threads = [threading.Thread(target=h.first_exchange) for h in hbs]
  for t in threads:
    t.start()
  for t in threads:
    t.join(10)


def make_cluster(n, period=0.02, policy="log", stuck_timeout=3.0, **kwargs):
  ex = SumExchange(n)
  store = Store(ex)
  exits = []
  recorders = [Recorder(f"client{c}.py:{10 + c} work") for c in range(n)]
  hbs = [heartbeat.Heartbeat(
      settings(period, policy, stuck_timeout=stuck_timeout, **kwargs), c, n,
      exchange=ThreadExchange(ex, store, c), process=Hooks(exits),
      recorder=recorders[c]) for c in range(n)]
  first_exchanges(hbs)
  return ex, hbs, exits, recorders


def wait_for(predicate, timeout=10.0):
  deadline = time.monotonic() + timeout
  while not predicate() and time.monotonic() < deadline:
    time.sleep(0.01)
  return predicate()


def test_first_exchange_spreads_client_0_token():
  _, hbs, _, _ = make_cluster(3)
  assert len({h.token for h in hbs}) == 1 and all(h.failure is None for h in hbs)


def test_agreed_stop_gives_equal_beat_counts():
  _, hbs, _, _ = make_cluster(3)
  for h in hbs:
    h.start_threads()
  time.sleep(0.3)
  hbs[1].event.set()  # One client asks; every client stops after the same beat.
  assert all(h.stopped.wait(5) for h in hbs)
  assert len({h.beats for h in hbs}) == 1 and hbs[0].beats > 3
  assert all(h.failure is None for h in hbs)


def test_every_client_at_exit_is_the_agreed_end_with_a_teardown():
  ex = SumExchange(2)
  closed = []
  recorders = [Recorder(), Recorder()]
  hbs = [heartbeat.Heartbeat(settings(0.02, "terminate"), c, 2,
                             exchange=ThreadExchange(ex, Store(ex), c, closed),
                             process=Hooks(), recorder=recorders[c])
         for c in range(2)]
  for h in hbs:
    h.start_threads()
  time.sleep(0.2)
  hbs[0].finish()  # Client 0's script ended: it beats "at exit"...
  time.sleep(0.2)
  assert not any(h.stopped.is_set() for h in hbs)  # ...and waits for client 1.
  hbs[1].finish()
  assert all(h.stopped.wait(5) for h in hbs)
  assert sorted(closed) == [0, 1] and all(h.closed_cleanly for h in hbs)
  assert len({h.beats for h in hbs}) == 1 and all(h.failure is None for h in hbs)


def test_the_agreed_end_comes_at_once_after_the_last_client_finishes():
  """A client at exit beats again at once (the exchange waits for the
  others): its exit is not held up to a period after the last one ended."""
  ex = SumExchange(2)
  recorders = [Recorder(), Recorder()]
  hbs = [heartbeat.Heartbeat(settings(1.0, "terminate"), c, 2,
                             exchange=ThreadExchange(ex, Store(ex), c),
                             process=Hooks(), recorder=recorders[c]) for c in range(2)]
  first_exchanges(hbs)
  for h in hbs:
    h.start_threads()
  recorders[0].at_exit = True
  hbs[0].finish()  # Its beat is answered by client 1's next timed beat (running)...
  assert wait_for(lambda: hbs[1].beats >= 1, 5)
  recorders[1].at_exit = True
  finished = time.monotonic()
  hbs[1].finish()  # ...and the last client's end is agreed on in its next beat.
  assert all(h.stopped.wait(5) for h in hbs)
  assert time.monotonic() - finished < 0.5  # Not a period (1 s) later.
  assert all(h.failure is None for h in hbs)


def test_out_of_sync_token_majority_names_the_culprit():
  _, hbs, _, _ = make_cluster(3)
  hbs[2].token ^= 0x1234
  for h in hbs:
    h.start_threads()
  assert all(h.stopped.wait(5) for h in hbs)
  assert hbs[0].failure.client_ids == (2,) and hbs[1].failure.client_ids == (2,)
  assert str(hbs[0].failure).startswith("heartbeat: client 2 sent token ")
  assert str(hbs[2].failure).startswith("heartbeat: this client (2) is out of sync")


def test_stuck_client_is_named_after_the_stuck_timeout_and_terminated():
  ex, hbs, exits, _ = make_cluster(2, period=0.05, policy="terminate")
  for h in hbs:
    h.start_threads()
  time.sleep(0.3)
  ex.stuck.add(1)  # Client 1 freezes (alive but stuck) before its next beat.
  start = time.monotonic()
  assert wait_for(lambda: exits, 15)
  assert exits[0] == PEER_FAILURE_EXIT_CODE
  # The 3 s stuck time-out (checked each second), then the roll call's grace.
  assert 2.5 < time.monotonic() - start < 3 + 1 + protocol.ROLL_CALL_GRACE + 1.5
  assert hbs[0].failure.client_ids == (1,)
  assert str(hbs[0].failure).startswith("heartbeat: client 1 missed beat ")
  assert str(hbs[0].failure).endswith("s ago); stopping this client")


def test_a_slow_beat_within_the_stuck_timeout_is_left_alone():
  """A 2 s GIL hold (here: a frozen client) below the 3 s stuck time-out."""
  ex, hbs, exits, _ = make_cluster(2, period=0.05, policy="terminate")
  for h in hbs:
    h.start_threads()
  time.sleep(0.2)
  ex.stuck.add(1)
  time.sleep(2.0)
  ex.stuck.discard(1)
  time.sleep(1.5)
  assert not exits and all(h.failure is None for h in hbs)
  hbs[0].event.set()
  assert all(h.stopped.wait(5) for h in hbs)


def test_a_client_that_finds_itself_frozen_names_itself():
  now = [100.0]
  hb = beat(0.05, "terminate", 1, 3, stuck_timeout=3, process=Hooks(now=now))
  hb.start_threads()
  time.sleep(0.2)
  now[0] += 10.0  # The process was stopped for 10 s (SIGSTOP, then SIGCONT).
  assert wait_for(lambda: hb.failure is not None, 5)
  assert str(hb.failure).startswith(
      "heartbeat: this client (1) did not run for 9.")
  assert "longer than the stuck time-out (3 s); the others count it as stuck" in (
      str(hb.failure))
  assert hb.failure.client_ids == (1,)


def test_a_client_named_by_a_peer_is_the_root_cause():
  codes, reported = [], []
  hb = beat(1, "terminate", 1, 3, process=Hooks(codes, reported))
  hb.peer_reported([1], Reason("client 1 missed beat 5 (last seen 3.2 s ago)", (1,), 0))
  assert codes == [OWN_FAILURE_EXIT_CODE]  # Not 75: it is the cause.
  assert str(hb.failure) == (
      "heartbeat: client 1 missed beat 5 (last seen 3.2 s ago) (reported by "
      "client 0); stopping this client")
  assert reported == [([1], "heartbeat: client 1 missed beat 5 (last seen 3.2 s "
                       "ago) (reported by client 0)")]


@pytest.mark.parametrize("policy,leaving", [("terminate", True), ("raise", False),
                                            ("log", False)])
def test_the_launcher_is_told_whether_the_client_leaves_by_itself(policy, leaving):
  """Under "terminate" a verdict ends the client at once: the launcher then
  waits for it instead of counting it among the clients its stop ended."""
  hooks = Hooks()
  hb = beat(1, policy, 0, 3, process=hooks)
  hb.peer_died(2, "its process ended without saying goodbye")
  assert [clients for clients, _ in hooks.reported] == [[2]]
  assert hooks.leaving == [leaving]


def judge(n, states, period=1.0, stall=300.0, kill_all=False, me=0, joined=None):
  """The verdict client `me` reaches from one merged beat of (phase, s, busy)."""
  shared = Store(SumExchange(n))
  if me != 1:
    shared.share("stall/0", "main thread in data.py:88 next_batch <- train.py:40 main")
  hb = beat(period, "log", me, n, Echo(shared), stall_timeout=stall,
            stall_kill_all_waiting=kill_all,
            recorder=Recorder("data.py:88 next_batch <- train.py:40 main"))
  phases, seconds, busy = (np.array(v) for v in zip(*states))
  joined = np.ones(n, bool) if joined is None else np.array(joined)
  verdict = verdicts.judge(phases, seconds, busy, joined, hb.exit_grace,
                           hb.stall_timeout)
  if verdict is not None:
    hb._act_on(verdict, 0)
  return hb.failure


def test_stall_names_the_client_that_never_joins_the_collective():
  failure = judge(4, [(WAITING, 301, 1), (RUNNING, 301, 0), (WAITING, 305, 2),
                      (WAITING, 302, 1)])
  assert str(failure) == (
      "heartbeat: client 1 stalled: main thread in data.py:88 next_batch <- "
      "train.py:40 main for 301 s, idle (0% of a core, 0 B/s read or written), while "
      "clients 0, 2, 3 wait in a collective; "
      "carrying on (policy 'log')")
  assert failure.client_ids == (1,)


def test_the_staller_names_itself_with_its_own_stack():
  failure = judge(2, [(WAITING, 400, 1), (RUNNING, 301, 0)], me=1)
  assert str(failure).startswith("heartbeat: client 1 stalled: main thread in "
                                 "data.py:88 next_batch <- train.py:40 main for "
                                 "301 s, idle (0% of a core, 0 B/s read or written), while "
                                 "client 0 waits in a collective")


@pytest.mark.parametrize("states", [
    # Not long enough yet.
    [(WAITING, 299, 1), (RUNNING, 301, 0), (WAITING, 305, 1)],
    [(WAITING, 301, 1), (RUNNING, 299, 0), (WAITING, 305, 1)],
    # A waiter that computes (busy) is not blocked on the staller.
    [(WAITING, 301, 90), (RUNNING, 301, 0), (WAITING, 305, 1)],
    # Compiling or tracing is busy in JAX, never stalled.
    [(WAITING, 301, 1), (IN_JAX, 301, 0), (WAITING, 305, 1)],
    # Two clients outside the collective: it is not one staller.
    [(WAITING, 301, 1), (RUNNING, 301, 0), (RUNNING, 305, 1)],
    # A busy client (a host computation) is slow, not stalled.
    [(WAITING, 301, 1), (RUNNING, 301, 100), (WAITING, 305, 1)],
], ids=["waiters-short", "runner-short", "waiter-busy", "compiling", "two-runners",
        "runner-busy"])
def test_no_stall_verdict_without_the_full_pattern(states):
  assert judge(3, states) is None


def test_a_client_still_in_its_set_up_is_never_a_staller():
  """Before its first collective (a slow data set-up) a client is late, not
  stalled; past it, the same beats name it."""
  states = [(WAITING, 301, 1), (RUNNING, 301, 0), (WAITING, 305, 1)]
  assert judge(3, states, joined=[True, False, True]) is None
  assert judge(3, states, joined=[True, True, True]).client_ids == (1,)


def test_the_joined_bit_rides_in_the_phase_slot():
  layout = protocol.BeatLayout(3)
  rows = [layout.row(c, 9, False, (RUNNING, WAITING, IN_JAX)[c], 5, 1, joined=c != 0)
          for c in range(3)]
  merged = np.sum(rows, axis=0)
  assert layout.states(merged)[0].tolist() == [RUNNING, WAITING, IN_JAX]
  assert layout.joined(merged).tolist() == [False, True, True]


def test_a_collective_that_gave_up_on_a_late_client_names_it():
  hb = beat(1.0, "log", 0, 4)
  merged = np.sum([hb.layout.row(c, 9, False, WAITING if c != 3 else RUNNING, 30, 1,
                                 joined=c != 3) for c in range(4)], axis=0)
  hb.decider.decide(merged)
  hb.late_for_collective(30.0)
  assert str(hb.failure) == (
      "heartbeat: client 3 did not join the collective the others waited in within "
      "JAX's 30 s communicator set-up time (not configurable); it was still in "
      "set-up, before its first collective. If a set-up is slow by design (loading "
      "data, compiling on one client), end it with a barrier (jdtensor.barrier, "
      "multihost_utils.sync_global_devices) so that every client enters the first "
      "collective together; carrying on (policy 'log')")
  assert hb.failure.client_ids == (3,)


def test_stall_detection_can_be_switched_off():
  assert judge(2, [(WAITING, 10**6, 1), (RUNNING, 10**6, 0)], stall=0) is None


def test_every_client_waiting_logs_its_stack_and_fails_only_when_asked(caplog):
  states = [(WAITING, 400, 1), (WAITING, 301, 0)]
  assert judge(2, states) is None
  failure = judge(2, states, kill_all=True)
  assert str(failure).startswith(
      "heartbeat: every client has waited in a collective for 300 s or more: a "
      "long computation, or a deadlock (clients that issued different "
      "collectives); this client (0): main thread in data.py:88 next_batch")
  assert failure.client_ids == (0, 1)


@pytest.mark.parametrize("states", [
    [(WAITING, 4, 1), (AT_EXIT, 3, 0), (WAITING, 4, 0), (WAITING, 5, 3)],
    # Client 0 busy (serving the coordination service) or just arrived: it
    # still waits for client 1, and is named with the others.
    [(WAITING, 4, 60), (AT_EXIT, 3, 0), (WAITING, 4, 0), (WAITING, 5, 3)],
    [(WAITING, 1, 0), (AT_EXIT, 3, 0), (WAITING, 4, 0), (WAITING, 5, 3)],
], ids=["all-idle", "one-busy", "one-just-arrived"])
def test_a_client_at_exit_while_the_others_wait_left_early(states):
  failure = judge(4, states, period=1.0)
  assert str(failure) == (
      "heartbeat: client 1 exited (code 0) while the others were still running "
      "(clients 0, 2, 3 wait in a collective); carrying on (policy 'log')")
  assert failure.client_ids == (1,)


@pytest.mark.parametrize("states", [
    [(WAITING, 4, 1), (AT_EXIT, 2, 0)],  # At exit for less than the grace.
    [(WAITING, 2, 1), (AT_EXIT, 4, 0)],  # Waiting for less than the grace.
    [(WAITING, 9, 80), (AT_EXIT, 9, 0)],  # Computing the end of its program.
    [(RUNNING, 9, 5), (AT_EXIT, 9, 0)],  # Still running its own code.
], ids=["exit-short", "wait-short", "waiter-busy", "other-running"])
def test_finishing_first_is_not_leaving_early(states):
  assert judge(2, states, period=1.0) is None


def test_an_exception_in_the_heartbeats_own_code_is_this_clients_failure():
  ex, hbs, exits, _ = make_cluster(2, period=0.02, policy="terminate")
  announced = []
  hbs[1]._peers.report = lambda clients, reason: announced.append(
      (clients, reason.heartbeat_line()))

  def broken_row(*args, real=hbs[1]._joined.answer):
    if hbs[1].beats == 3:
      raise TypeError("a bug in the record code")
    return real(*args)
  hbs[1]._joined.answer = broken_row
  hbs[1].start_threads()
  hbs[0]._process = Hooks()  # Client 0 waits; only 1 is checked.
  hbs[0].start_threads()
  assert wait_for(lambda: exits)
  assert exits == [OWN_FAILURE_EXIT_CODE]  # A root cause, not 75.
  message = str(hbs[1].failure)
  assert hbs[1].failure.client_ids == (1,)
  assert message.startswith("heartbeat: this client's (1) heartbeat failed in its "
                            "own code: TypeError: a bug in the record code\n"
                            "Traceback (most recent call last):\n")
  assert message.endswith("TypeError: a bug in the record code\n; stopping this client")
  assert "missed beat" not in message  # Never blamed on a peer.
  # The others hear it in their own words, without the traceback.
  assert announced == [([1], "heartbeat: client 1's heartbeat failed in its own "
                        "code: TypeError: a bug in the record code")]
  hbs[0].event.set()


def test_links_only_heartbeat_stops_and_names_a_dead_client():
  """Without an exchange: no beats; the liveness links still work."""
  hb = heartbeat.Heartbeat(settings(0.05), 0, 3)
  hb.start_threads()
  assert hb.ready.wait(1)
  hb.peer_died(2, "its process ended without saying goodbye")
  assert str(hb.failure) == ("heartbeat: client 2 is gone (its process ended "
                             "without saying goodbye); carrying on (policy 'log')")
  assert hb.stop(timeout=1)
  quiet = heartbeat.Heartbeat(settings(0.05), 0, 3)
  quiet.start_threads()
  assert quiet.stop(timeout=1) and quiet.failure is None and quiet.beats == 0


@pytest.mark.parametrize("why,raised,expected", [
    ("failed: ZeroDivisionError: division by zero (train.py:3 in step)", True,
     "heartbeat: client 1 failed: ZeroDivisionError: division by zero (train.py:3 "
     "in step); stopping this client"),
    ("exited (code 3)", False,
     "heartbeat: client 1 exited (code 3) while the others were still running; "
     "stopping this client"),
])
def test_a_departure_with_a_failure_stops_the_others_at_once(why, raised, expected):
  codes = []
  hb = beat(1, "terminate", 0, 3, process=Hooks(codes))
  hb.peer_left(1, 1, why, True, raised)
  assert str(hb.failure) == expected and codes == [PEER_FAILURE_EXIT_CODE]


def test_client_0_waits_for_a_leaving_culprit_but_not_for_a_silent_one():
  """Client 0 hosts the services and leaves last: it waits for every other
  process to end, except a culprit that may never end (stalled, stopped);
  one that announced its departure is on its way out and is waited for
  (ending the services under it would abort it from C++)."""
  peers = WaitingPeers()
  hb = beat(1, "terminate", 0, 3, peers=peers, process=Hooks())
  hb.peer_left(1, 0, "exited (code 0)", False)  # Ended its script early...
  hb._fail(Failure(Reason("client 1 exited (code 0) while the others were still "
                          "running", (1,)), (1,)))  # ... and is named for it: wait for it too.
  assert peers.ignored == [[]]
  peers = WaitingPeers()
  hb = beat(1, "terminate", 0, 3, peers=peers, process=Hooks())
  hb._fail(Failure(Reason("client 2 stalled", (2,)), (2,)))
  assert peers.ignored == [[2]]


def test_a_finished_client_only_logs_what_happens_to_the_others():
  codes = []
  hb = beat(1, "terminate", 0, 3, process=Hooks(codes))
  hb.peer_left(2, 0, "exited (code 0)", False)  # A normal end: nothing to do.
  assert hb.failure is None and 2 in hb.departed
  hb.finish()
  hb.peer_left(1, 3, "exited (code 3)", True)
  assert codes == []  # Never stopped with 75 after its own work is done.
  assert str(hb.failure) == ("heartbeat: client 1 exited (code 3); this client "
                             "had already finished")


def test_a_client_leaving_with_a_failure_reacts_to_nothing():
  codes = []
  hb = beat(1, "terminate", 0, 3, process=Hooks(codes))
  hb.abandon()
  hb.peer_died(1, "its process ended without saying goodbye")
  assert codes == [] and hb.failure is None


def test_peer_died_after_agreed_stop_is_not_a_failure():
  _, hbs, _, _ = make_cluster(2)
  for h in hbs:
    h.start_threads()
  hbs[0].event.set()
  assert all(h.stopped.wait(5) for h in hbs)
  hbs[0].peer_died(1, "its process ended without saying goodbye")
  assert hbs[0].failure is None


def test_beat_stuck_after_every_client_started_it():
  ex, hbs, exits, _ = make_cluster(2, period=0.05, policy="raise")
  hbs[1].start_threads = lambda: None  # Client 1 never beats again...
  threading.Thread(target=hbs[1]._exchange.roll_call, args=(1, 6.0), daemon=True).start()
  hbs[0].start_threads()  # ...although it answers beat 1's roll call.
  assert hbs[0].stopped.wait(10)
  assert str(hbs[0].failure).startswith("heartbeat: beat 1 did not complete within 3 s "
                                        "although every client started it; raising ")
  assert not exits


def test_the_beat_layout_keeps_each_clients_slots_apart():
  layout = protocol.BeatLayout(3)
  rows = [layout.row(c, 77, c == 2, (RUNNING, WAITING, AT_EXIT)[c], 10 * c, c,
                    joined=c != 1, moved=1000 * c) for c in range(3)]
  merged = sum(rows)
  assert layout.tokens(merged).tolist() == [77, 77, 77]
  assert merged[layout.stop] == 1
  phases, seconds, busy = layout.states(merged)
  assert phases.tolist() == [RUNNING, WAITING, AT_EXIT]
  assert seconds.tolist() == [0, 10, 20] and busy.tolist() == [0, 1, 2]
  assert layout.joined(merged).tolist() == [True, False, True]
  assert layout.active(merged).tolist() == [True, True, True]
  assert layout.moved(merged).tolist() == [0, 1000, 2000]
  assert layout.width == 16


class _SlowLauncherHooks(Hooks):
  """Telling the launcher blocks until `go` is set (a slow report directory)."""

  def __init__(self, exits):
    super().__init__(exits)
    self.go = threading.Event()

  def tell_launcher(self, clients, reason, leaving):
    self.go.wait(10)
    super().tell_launcher(clients, reason, leaving)


def _verdict_being_reported():
  """A heartbeat (policy "terminate") whose links' thread has recorded that
  client 2 stalled and is still telling the launcher (until `hooks.go`)."""
  codes = []
  hooks = _SlowLauncherHooks(codes)
  hb = beat(0.5, "terminate", 3, 4, process=hooks)
  verdict = threading.Thread(target=hb.peer_reported, daemon=True,
                             args=([2], Reason("client 2 stalled", (2,), 0)))
  verdict.start()
  _wait_until(lambda: hb.failure is not None)
  return hb, hooks, codes, verdict


def test_a_consequence_under_terminate_leaves_only_once_the_verdict_is_said(
    capsys):
  """Seen in CI: the links' thread records a verdict, the beat thread ends on
  it and wakes the main thread's exit, which ended the process (code 75)
  while the links' thread was still reporting: the client never said whom
  it blamed. The exit now waits for the verdict's line."""
  from jdtensor.heartbeat.departure import Departure  # pylint: disable=g-import-not-at-top
  hb, hooks, codes, verdict = _verdict_being_reported()
  assert not hb.said.is_set()
  left = []
  leaving = threading.Thread(target=lambda: left.append(WayOut(heartbeat=lambda: hb).leave(Departure(
      75, f"failed: ValueError: Gloo, after {hb.failure}", True, peer_lost=True,
      consequence=True))), daemon=True)
  leaving.start()
  time.sleep(0.3)
  assert leaving.is_alive() and not left  # Waits for the verdict's line.
  hooks.go.set()
  verdict.join(5)
  leaving.join(5)
  assert left == [False] and codes == [PEER_FAILURE_EXIT_CODE]
  err = capsys.readouterr().err
  assert err.count("client 2 stalled") == 1, err  # Said once, by the heartbeat.
  assert "jdtensor: client" not in err, err


def test_a_verdict_after_the_exit_gave_up_waiting_for_one_is_not_acted_on(
    capsys):
  """Found on review: a verdict recorded between `blame_peer`'s time-out and
  the exit's `abandon` still ended the process (code 75) while the main
  thread announced its own failure. The two now decide under one lock."""
  from jdtensor.heartbeat.departure import Departure  # pylint: disable=g-import-not-at-top
  codes = []
  hb = beat(0.5, "terminate", 3, 4, process=Hooks(codes))
  own = Departure(1, "failed: ValueError: Gloo all-reduce failed", True,
                  peer_lost=True)
  assert WayOut(heartbeat=lambda: hb).blame_peer(own) is own  # Nobody named in time: its own.
  hb.peer_reported([2], Reason("client 2 stalled", (2,), 0))  # Too late.
  assert hb.failure is None and not hb.terminating and codes == []
  assert "client 2 stalled" not in capsys.readouterr().err


@pytest.mark.parametrize("departure", [
    ("failed: ValueError: bad (train.py:3 in step)", 1),
    ("exited (code 3)", 3)], ids=["exception", "exit-code"])
def test_a_failure_after_a_verdict_under_terminate_leaves_as_its_consequence(
    capsys, departure):
  """The verdict's thread is ending the process with code 75: the main
  thread, failing meanwhile for any reason, leaves as its consequence (same
  code, the verdict said once) rather than announcing a failure of its own."""
  from jdtensor.heartbeat.departure import Departure  # pylint: disable=g-import-not-at-top
  hb, hooks, codes, verdict = _verdict_being_reported()
  why, code = departure
  leaving = WayOut(heartbeat=lambda: hb).blame_peer(Departure(code, why, True))
  assert leaving.code == PEER_FAILURE_EXIT_CODE and leaving.consequence
  assert leaving.why.startswith(f"{why}, after heartbeat: client 2 stalled")
  left = []
  exiting = threading.Thread(target=lambda: left.append(WayOut(heartbeat=lambda: hb).leave(leaving)),
                             daemon=True)
  exiting.start()
  hooks.go.set()
  verdict.join(5)
  exiting.join(5)
  assert left == [False] and codes == [PEER_FAILURE_EXIT_CODE]
  err = capsys.readouterr().err
  assert err.count("client 2 stalled") == 1, err
  assert "jdtensor: client" not in err, err
  # Under "raise", a failure after a verdict is still this client's own.
  hb2 = beat(0.5, "raise", 3, 4, process=Hooks([]))
  hb2.peer_reported([2], Reason("client 2 stalled", (2,), 0))
  mine = Departure(code, why, True)
  assert WayOut(heartbeat=lambda: hb2).blame_peer(mine) is mine


def _wait_until(predicate, timeout=5.0):
  deadline = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.01)


class _Scripted(Exchange):
  """One client's exchange that hands out the outcomes it is given, in order
  (a client of the liveness links that beat once more without waiting, then
  took the agreed end decided one beat before)."""

  def __init__(self, outcomes):
    self.outcomes = list(outcomes)

  def open(self, decider=None, wake=None):
    del decider, wake

  def beat(self, row):
    return self.outcomes.pop(0)

  def close(self, timeout):
    return True


def test_the_agreed_end_is_the_beat_every_client_ends_at():
  from jdtensor.heartbeat.verdicts import Outcome
  script = [Outcome(0, 7), Outcome(1, 7), Outcome(2, 7), Outcome(3, 7),  # Its own.
            Outcome(2, 7, end=True)]  # The end, decided at beat 2.
  hb = beat(0.01, "log", 1, 2, exchange=_Scripted(script))
  hb.start_threads()
  assert hb.stopped.wait(5) and hb.failure is None
  assert hb.beats == 2  # Not 3: every client ends at the agreed beat.
