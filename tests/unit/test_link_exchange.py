"""The heartbeat's exchange on the liveness links: real `Links` over socket
pairs (a star around client 0, as the rendezvous leaves them), one thread per
client, no JAX backend."""

import socket
import threading
import time

import dataclasses

import pytest

from jdtensor._env import HeartbeatSettings
from jdtensor._report import Reason
from jdtensor._wire import encode, encode_binary
from jdtensor.heartbeat.exchange import ROW_FRAME, LinkExchange
from jdtensor.heartbeat.flight import AT_EXIT, RUNNING, WAITING, Recorder
from jdtensor.heartbeat.interfaces import ProcessHooks
from jdtensor.heartbeat.protocol import Heartbeat
from jdtensor.heartbeat.stragglers import WaitLedger
from jdtensor.heartbeat.verdicts import (EARLY_EXIT, OUT_OF_SYNC, STALLED, Decider, Outcome,
                                         Row, Verdict)
from jdtensor.runtime.links import LinkEvents, Links


def decider(n: int) -> Decider:
  return Decider(n, 3.0, 300.0, WaitLedger(n, 60.0, 30.0, 1.0), time.monotonic)


class Star:
  """`n` clients' links and exchanges in one process."""

  def __init__(self, n: int, open_now: bool = True, ack_every: int = 1):
    self.n = n
    pairs = {c: socket.socketpair() for c in range(1, n)}
    self.links = [Links(0, {c: pairs[c][0] for c in pairs})]
    self.links += [Links(c, {0: pairs[c][1]}) for c in range(1, n)]
    for link in self.links:
      link.watch(None)
    self.exchanges = [LinkExchange(c, n, self.links[c], ack_every) for c in range(n)]
    self.deciders = [decider(n) for _ in range(n)]
    if open_now:
      for c in range(n):
        self.open(c)

  def open(self, c: int) -> None:
    self.exchanges[c].open(self.deciders[c])

  def close(self) -> None:
    for link in self.links:
      link._closing = True  # pylint: disable=protected-access
      for sock in list(link._sockets.values()):  # pylint: disable=protected-access
        sock.close()

  def beat(self, rows: dict[int, Row], timeout: float = 10.0) -> dict[int, Outcome]:
    """Each client in `rows` runs one beat on its own thread."""
    out: dict[int, Outcome] = {}

    def run(c: int) -> None:
      out[c] = self.exchanges[c].beat(rows[c])
    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in rows]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout)
    return out


@pytest.fixture
def star():
  made = []

  def make(n, open_now=True, ack_every=1):
    made.append(Star(n, open_now, ack_every))
    return made[-1]
  yield make
  for s in made:
    s.close()


TOKEN = 4242


def rows_of(n: int, beat: int, phase: int = RUNNING, **changes) -> dict[int, Row]:
  """Every client's row of `beat` (the first spreads client 0's token)."""
  if beat == 0:
    return {c: Row(c, TOKEN if c == 0 else 0, False, RUNNING, 0, 0, first=True)
            for c in range(n)}
  rows = {c: Row(c, TOKEN, False, phase, beat, 10 * c + beat) for c in range(n)}
  for c, row in changes.items():
    rows[int(c[1:])] = row
  return rows


@pytest.mark.parametrize("n", [2, 3, 5])
def test_every_client_gets_client_0s_outcome_beat_after_beat(star, n):
  s = star(n)
  for beat in range(4):
    out = s.beat(rows_of(n, beat))
    assert sorted(out) == list(range(n))
    assert {out[c] for c in range(n)} == {Outcome(beat, TOKEN)}
  # Decided once, on client 0, from every row.
  phases, seconds, busy, joined = s.deciders[0].view
  assert phases.tolist() == [RUNNING] * n and seconds.tolist() == [3] * n
  assert busy.tolist() == [10 * c + 3 for c in range(n)] and joined.all()
  assert all(d.view is None for d in s.deciders[1:])


def test_a_verdict_decided_on_client_0_reaches_every_client(star):
  s = star(4)
  s.beat(rows_of(4, 0))
  rows = rows_of(4, 1, WAITING, c2=Row(2, TOKEN, False, AT_EXIT, 9, 0))
  out = s.beat({c: dataclasses.replace(r, seconds=9, busy=0) for c, r in rows.items()})
  expected = Verdict(EARLY_EXIT, (2,), waiting=(0, 1, 3))
  assert [out[c].verdict for c in range(4)] == [expected] * 4


def test_a_restarted_client_is_named_by_its_token(star):
  s = star(3)
  s.beat(rows_of(3, 0))
  out = s.beat(rows_of(3, 1, c1=Row(1, 99, False, RUNNING, 1, 0)))
  assert {out[c].verdict for c in range(3)} == {
      Verdict(OUT_OF_SYNC, (1,), tokens=(99,), cluster_token=TOKEN)}


def test_a_stop_request_ends_the_run_on_every_client(star):
  s = star(3)
  s.beat(rows_of(3, 0))
  out = s.beat(rows_of(3, 1, c2=Row(2, TOKEN, True, RUNNING, 1, 0)))
  assert all(out[c].end for c in range(3))


def test_rows_sent_before_client_0_starts_are_kept(star):
  s = star(3, open_now=False)
  for c in (1, 2):
    s.open(c)
  rows = rows_of(3, 0)
  early: dict[int, Outcome] = {}
  threads = [threading.Thread(
      target=lambda c=c: early.update({c: s.exchanges[c].beat(rows[c])}),
      daemon=True) for c in (1, 2)]
  for t in threads:
    t.start()
  time.sleep(0.3)
  assert early == {}  # Nobody has an outcome without client 0's row.
  s.open(0)
  out = s.beat({0: rows[0]})
  for t in threads:
    t.join(10.0)
  assert {**early, **out} == {c: Outcome(0, TOKEN) for c in range(3)}


def test_a_roll_call_names_whose_row_client_0_holds(star):
  s = star(3)
  rows = rows_of(3, 0)
  s.beat({1: rows[1], 2: rows[2]}, timeout=0.2)  # Client 0 never beats.
  started = time.monotonic()
  assert s.exchanges[1].roll_call(0, 0.3) == {1, 2}
  assert 0.25 < time.monotonic() - started < 2.0  # It waited its grace.
  # The caller counts itself present: it asks from inside the beat.
  assert s.exchanges[0].roll_call(0, 0.01) == {0, 1, 2}
  # A later beat waits for the oldest: the same clients hold it up.
  assert s.exchanges[2].roll_call(7, 0.0) == {1, 2}


def test_a_completed_beat_has_everyone_present(star):
  s = star(3)
  s.beat(rows_of(3, 0))
  assert s.exchanges[2].roll_call(0, 1.0) == {0, 1, 2}


def test_the_start_marker_costs_nothing(star):
  s = star(2)
  assert s.exchanges[1].roll_call(0, 0.0) is None


def test_a_roll_call_without_client_0_is_unreachable(star):
  s = star(2)
  s.links[0]._closing = True  # pylint: disable=protected-access  # Client 0 reads nothing.
  started = time.monotonic()
  assert s.exchanges[1].roll_call(3, 0.0) is None
  assert time.monotonic() - started < 2.0


def test_the_others_ask_client_0_what_it_decided(star):
  s = star(3)
  assert s.exchanges[1].ask("unjoined", 1.0) is None  # Nothing decided yet.
  s.beat(rows_of(3, 0))
  s.beat(rows_of(3, 1, c2=Row(2, TOKEN, False, RUNNING, 1, 0, joined=False)))
  assert s.exchanges[1].ask("unjoined", 1.0) == [2]
  assert s.exchanges[0].ask("unjoined", 1.0) == [2]
  assert s.exchanges[2].ask("running", 1.0) == [0, 1, 2]


def test_a_shared_text_reaches_every_client(star):
  s = star(3)
  s.exchanges[2].share("stack/2", "File train.py, line 3")
  for c in range(3):
    assert s.exchanges[c].fetch("stack/2", timeout=5.0) == "File train.py, line 3"
  assert s.exchanges[1].fetch("stack/0", timeout=0.1) is None


def test_malformed_exchange_messages_are_ignored(star):
  s = star(2)
  for bad in ({"hb": "done", "b": "x"}, {"hb": "done", "b": 0, "t": 1, "v": {"k": "?"}},
              {"hb": "present", "q": "?"}, {"hb": "present", "q": 1, "m": [[5, 9]]},
              {"hb": "answer", "q": 1, "c": [[-1, 3]]}, {"hb": 7},
              b"R", b"R" + bytes(40), b"D\x00", b"?" * 8):
    s.links[1].send(bad, to=0)
    s.links[0].send(bad, to=1)
  # A row naming a beat long gone, and a second row for a beat: ignored too.
  out = s.beat(rows_of(2, 0))
  assert out == {0: Outcome(0, TOKEN), 1: Outcome(0, TOKEN)}
  s.links[1].send(ROW_FRAME.pack(ord("R"), 0, 1, 0, RUNNING, 0, 0, 0), to=0)
  assert s.beat(rows_of(2, 1)) == {0: Outcome(1, TOKEN), 1: Outcome(1, TOKEN)}


class _CountingLinks:
  """Client 0's links, counting the bytes each send puts on the wire."""

  def __init__(self, n: int):
    self.n, self.sent, self.carrier = n, [], None

  def carry(self, handler):
    self.carrier = handler

  def send(self, message, to=None, skip=()):
    size = len(encode_binary(message) if isinstance(message, bytes) else encode(message))
    self.sent.append((size, 1 if to is not None else self.n - 1 - len(skip)))


@pytest.mark.parametrize("n", [3, 4096])
def test_a_beat_costs_each_client_the_same_few_bytes_at_any_scale(n):
  """Client 0 takes a 25-byte row from every client and sends each a 12-byte
  outcome: O(1) per client, O(N) at client 0."""
  links = _CountingLinks(n)
  exchange = LinkExchange(0, n, links)
  exchange.open(decider(n))
  row = ROW_FRAME.pack(ord("R"), 0, 0, 0, RUNNING, 0, 0, 0)
  assert len(encode_binary(row)) == 25
  for beat in range(3):
    row = ROW_FRAME.pack(ord("R"), beat, 0 if beat == 0 else TOKEN, 0, RUNNING, 5, 1, 0)
    for c in range(1, n):
      links.carrier(c, row)
    own = rows_of(1, beat)[0]
    outcome = exchange.beat(dataclasses.replace(own, client=0))
    assert outcome == Outcome(beat, TOKEN)
    assert links.sent == [(12, n - 1)]
    links.sent.clear()


def test_a_stall_is_told_to_the_staller_before_every_other_client():
  """The others wait for the stack the staller shares once it has the
  verdict: it hears first, then everyone else once."""
  n, staller = 6, 4
  sent = []

  class Recording(_CountingLinks):
    def send(self, message, to=None, skip=()):
      sent.append((to, tuple(skip)))

  links = Recording(n)
  exchange = LinkExchange(0, n, links)
  judge = decider(n)
  stall = Verdict(STALLED, (staller,), seconds=9, waiting=(0, 1, 2, 3, 5), timeout=4.0)
  judge.decide = lambda merged, ages=None: Outcome(1, TOKEN, verdict=stall)
  exchange.open(judge)
  for beat in range(2):
    row = ROW_FRAME.pack(ord("R"), beat, 0 if beat == 0 else TOKEN, 0, RUNNING, 5, 1, 0)
    for c in range(1, n):
      links.carrier(c, row)
    exchange.beat(dataclasses.replace(rows_of(1, beat)[0], client=0))
  assert sent == [(None, ()), (staller, ()), (None, (staller,))]


def test_links_closed_before_their_watch_starts_end_it_quietly(monkeypatch):
  """A process that closes its links as the watching thread starts (a test's
  teardown, an exit) must not leave an exception in that thread."""
  import socket  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  from jdtensor.runtime.links import Links  # pylint: disable=g-import-not-at-top
  errors = []
  monkeypatch.setattr(threading, "excepthook", errors.append)
  a, b = socket.socketpair()
  links = Links(1, {0: a})
  a.close()
  links.watch(None)
  links._thread.join(5)  # pylint: disable=protected-access
  assert not links._thread.is_alive() and not errors  # pylint: disable=protected-access
  b.close()


class _Recorded(ProcessHooks):
  def __init__(self):
    self.reported = []

  def tell_launcher(self, clients, reason, leaving):
    self.reported.append((clients, reason.heartbeat_line()))

  def terminate(self, code):
    raise AssertionError("policy log never exits")


def heartbeats(s: Star, stuck: float = 30.0) -> list[Heartbeat]:
  """A real heartbeat per client of `s` (policy log), started."""
  settings = HeartbeatSettings(period=0.05, policy="log", stuck_timeout=stuck)
  hbs = [Heartbeat(settings, c, s.n, exchange=s.exchanges[c], peers=s.links[c],
                   process=_Recorded()) for c in range(s.n)]
  for c, hb in enumerate(hbs):
    s.links[c].watch(hb)
    hb.start_threads()
  for hb in hbs:
    assert hb.ready.wait(10)
  return hbs


def _named(hbs, clients):
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline:
    if all(hbs[c].failure is not None for c in clients):
      return {c: hbs[c].failure.client_ids for c in clients}
    time.sleep(0.02)
  return {c: hbs[c].failure for c in clients}


@pytest.mark.parametrize("ack_every", [1, 5])
def test_the_hub_gone_is_named_by_every_client(star, ack_every):
  """Client 0 decides the beats and relays every report: when its process
  ends, every other client names it at once (its link's end)."""
  s = star(4, open_now=False, ack_every=ack_every)
  hbs = heartbeats(s)
  for sock in list(s.links[0]._sockets.values()):  # pylint: disable=protected-access
    sock.close()
  s.links[0]._closing = True  # pylint: disable=protected-access
  assert _named(hbs, [1, 2, 3]) == {1: (0,), 2: (0,), 3: (0,)}
  assert "the coordinator's process ended" in str(hbs[1].failure)


@pytest.mark.parametrize("ack_every", [1, 5])
def test_a_partitioned_client_is_named_on_both_sides(star, ack_every):
  """A client whose link to client 0 breaks (a network partition): client 0
  names it and tells the others; it names client 0."""
  s = star(4, open_now=False, ack_every=ack_every)
  hbs = heartbeats(s)
  s.links[2]._sockets[0].shutdown(socket.SHUT_RDWR)  # pylint: disable=protected-access
  assert _named(hbs, [0, 1, 2, 3]) == {0: (2,), 1: (2,), 3: (2,), 2: (0,)}
  # Told once: client 0's report, relayed; nobody reported it again.
  assert [len(hb._process.reported) for hb in hbs] == [1, 1, 1, 1]  # pylint: disable=protected-access


@pytest.mark.parametrize("ack_every", [1, 5])
def test_a_row_that_never_comes_is_named_by_the_roll_call(star, ack_every):
  """Client 3 freezes before its row: the others' beat is overdue, and
  client 0's roll call names client 3 to each of them."""
  s = star(4, open_now=False, ack_every=ack_every)
  frozen = threading.Event()
  real = s.exchanges[3].beat

  def freezing(row):
    if row.seconds >= 0 and not row.first and frozen.is_set():
      threading.Event().wait(60)
    return real(row)
  s.exchanges[3].beat = freezing
  # Frozen as a whole (SIGSTOP): its own watchdog's roll call never returns.
  s.exchanges[3].roll_call = lambda beat, grace: (
      threading.Event().wait(60) if frozen.is_set() else None)
  hbs = heartbeats(s, stuck=1.0)
  frozen.set()
  assert _named(hbs, [0, 1, 2]) == {0: (3,), 1: (3,), 2: (3,)}
  assert "client 3 missed beat" in str(hbs[1].failure)


def test_client_0_relays_a_report_only_when_it_names_someone_new(star):
  """N survivors each reporting the same culprit must not cost client 0 N
  relays to N clients: the first report naming a client goes on, the same
  names again do not; a normal departure reaches client 0 only."""
  s = star(4)
  heard = []

  class Ear(LinkEvents):
    def peer_reported(self, clients, reason):
      heard.append((clients, reason.reporter))

    def peer_left(self, client, code, why, failed, raised):
      heard.append(("left", client, failed))
  s.links[3].watch(Ear())

  def heard_at_least(n):
    # Messages on different links reach client 0 in any order: each step
    # waits for the relay before the next link speaks.
    deadline = time.monotonic() + 5
    while len(heard) < n and time.monotonic() < deadline:
      time.sleep(0.01)
  s.links[1].report([2], Reason("client 2 missed beat 4"))
  heard_at_least(1)
  s.links[2].report([2], Reason("this client (2) was frozen"))  # The same name again.
  s.links[1].announce_departure(0, "finished", False)
  s.links[1].report([2, 1], Reason("clients 1, 2 missed beat 5"))  # Someone new.
  heard_at_least(2)
  s.links[2].announce_departure(3, "exited (code 3)", True)
  heard_at_least(3)
  time.sleep(0.2)  # Nothing else is on its way.
  assert heard == [([2], 1), ([2, 1], 1), ("left", 2, True)]


def test_without_news_an_outcome_goes_out_only_every_few_beats():
  """ack_every=3: client 0 sends an outcome without news at beats 0, 3, 6;
  the others do not wait for the beats between."""
  n = 5
  links = _CountingLinks(n)
  exchange = LinkExchange(0, n, links, ack_every=3)
  exchange.open(decider(n))
  sent = []
  for beat in range(7):
    row = ROW_FRAME.pack(ord("R"), beat, 0 if beat == 0 else TOKEN, 0, RUNNING, 5, 1, 0)
    for c in range(1, n):
      links.carrier(c, row)
    assert exchange.beat(rows_of(1, beat)[0]) == Outcome(beat, TOKEN)
    sent.append(len(links.sent))
    links.sent.clear()
  assert sent == [1, 0, 0, 1, 0, 0, 1]


def test_news_reaches_a_client_that_does_not_wait_at_its_next_beat(star):
  s = star(3, ack_every=100)
  s.beat(rows_of(3, 0))
  # Beat 1: clients 1 and 2 send and go on; client 0 decides once it has
  # every row: client 2 is out of sync.
  rows = rows_of(3, 1, c2=Row(2, 99, False, RUNNING, 1, 0))
  out = s.beat({1: rows[1], 2: rows[2]})
  assert out == {1: Outcome(1, TOKEN), 2: Outcome(1, TOKEN)}  # Nothing known yet.
  verdict = s.beat({0: rows[0]})[0].verdict
  assert verdict == Verdict(OUT_OF_SYNC, (2,), tokens=(99,), cluster_token=TOKEN)
  deadline = time.monotonic() + 5
  while 1 not in s.exchanges[1]._outcomes and time.monotonic() < deadline:  # pylint: disable=protected-access
    time.sleep(0.01)
  later = s.beat({1: rows_of(3, 2)[1]})[1]
  assert (later.beat, later.verdict) == (1, verdict)


def test_news_not_yet_taken_is_taken_without_waiting(star):
  """A client at exit that takes an older beat's news (a straggler) while
  the agreed end comes for the beat it waited for takes the end at its next
  beat at once: no later beat will ever be decided (a real deadlock at a
  20 ms period, before)."""
  s = star(2, ack_every=100)
  s.beat(rows_of(2, 0))
  ex = s.exchanges[1]
  ex._beat = 2  # pylint: disable=protected-access  # Beat 1 went by unawaited.
  ex._outcome(Outcome(1, TOKEN, stragglers=((0, 80.0),)))  # pylint: disable=protected-access
  ex._outcome(Outcome(2, TOKEN, end=True))  # pylint: disable=protected-access
  at_exit = Row(1, TOKEN, False, AT_EXIT, 0, 0)
  assert s.beat({1: at_exit}, timeout=5)[1].stragglers == ((0, 80.0),)
  assert s.beat({1: at_exit}, timeout=5) == {1: Outcome(2, TOKEN, end=True)}


def test_news_for_a_beat_nobody_waited_for_wakes_the_heartbeat(star):
  """A client between beats is woken when news comes (it takes a verdict at
  once, not a period later); an outcome it waits for, or one without news,
  wakes nobody."""
  s = star(3, open_now=False, ack_every=100)
  woken = {c: threading.Event() for c in range(3)}
  for c in range(3):
    s.exchanges[c].open(s.deciders[c], wake=woken[c].set)
  s.beat(rows_of(3, 0))  # Waited for by everyone (the first beat).
  s.beat(rows_of(3, 1))  # No news.
  time.sleep(0.2)
  assert not any(w.is_set() for w in woken.values())
  rows = rows_of(3, 2, c2=Row(2, 99, False, RUNNING, 1, 0))
  s.beat({1: rows[1], 2: rows[2]})
  s.beat({0: rows[0]})  # Client 0 waits for it; 1 and 2 had gone on.
  for c in (1, 2):
    assert woken[c].wait(5), f"client {c} not woken"
  assert not woken[0].is_set()


def test_a_client_at_exit_waits_for_every_beat(star):
  """At exit a client beats again at once: it waits for each outcome (no
  spin), and client 0 sends one because it asked."""
  s = star(2, ack_every=100)
  s.beat(rows_of(2, 0))
  at_exit = Row(1, TOKEN, False, AT_EXIT, 0, 0)
  out = s.beat({1: at_exit}, timeout=0.3)
  assert out == {}  # Waiting for client 0's row.
  both = s.beat({0: Row(0, TOKEN, False, AT_EXIT, 0, 0)})
  assert both[0] == Outcome(1, TOKEN, end=True)
  deadline = time.monotonic() + 5
  while 1 not in out and time.monotonic() < deadline:
    time.sleep(0.01)
  assert out == {1: Outcome(1, TOKEN, end=True)}  # The waiting client's beat.


def test_client_0_tells_every_client_when_a_culprit_has_ended(star):
  """Where an engine names the first process to fail, the survivors wait for
  the culprit's end: client 0 sees every link close and tells the others of
  a culprit's, once (named before or after its end); a survivor's end is
  told to nobody (N survivors' ends to N clients would be N^2 messages)."""
  s = star(4)
  heard = []

  class Ear(LinkEvents):
    def peer_reported(self, clients, reason):
      heard.append(clients)
  s.links[3].watch(Ear())
  s.links[2]._sockets[0].close()  # pylint: disable=protected-access  # Client 2 dies...
  assert not s.links[3].wait_ended([2], 0.3)  # ... not yet named.
  s.links[1].report([2], Reason("client 2 is gone"))
  assert s.links[3].wait_ended([2], 5) and s.links[1].wait_ended([2], 5)
  s.links[1].report([2], Reason("client 2 is gone"))  # Named again: told once.
  s.links[3]._sockets[0].close()  # pylint: disable=protected-access  # A survivor's end.
  assert s.links[0].wait_ended([3], 5)  # Client 0 sees it...
  assert not s.links[1].wait_ended([3], 0.3)  # ... and tells nobody.
  sent = []
  s.links[0]._send = lambda message, **kw: sent.append(message)  # pylint: disable=protected-access
  s.links[0].report([1], Reason("client 1 left"))  # Named while alive: nothing yet.
  assert sent == [{"failed": [1], "why": "client 1 left", "subject": [], "by": 0}]


class _StandIn(Recorder):
  """A main thread in one phase since `since` (wall time; None: not yet)."""
  at_exit, joined, active = False, True, True

  def __init__(self, phase: int):
    self.phase, self.since = phase, None

  def sample(self, busy=0.0, idle_percent=0.0, moving=False):
    return self.phase, 0.0 if self.since is None else max(0.0, time.time() - self.since)

  def where(self) -> str:
    return "train.py:9 main"

  def where_in_program(self) -> str:
    return self.where()


@pytest.mark.parametrize("phase, resumes", [(0.1, False), (0.6, False), (0.1, True)])
def test_client_0_calls_the_beat_at_which_a_stall_reaches_its_time_out(star, phase,
                                                                      resumes):
  """A stall is named when its time-out ends, not up to a period later
  (period 1 s, stall time-out 2 s, the stall starting `phase` of a period
  after a beat: the worst phase is just after one). The called beat is a
  beat like any other: a runner that rejoins the others just before the
  time-out is not named."""
  s = star(3, open_now=False)
  recorders = [_StandIn(WAITING), _StandIn(WAITING), _StandIn(RUNNING)]
  settings = HeartbeatSettings(period=1.0, policy="log", stall_timeout=2.0,
                               stall_learn=False)
  hbs = [Heartbeat(settings, c, 3, exchange=s.exchanges[c], peers=s.links[c],
                   process=_Recorded(), recorder=recorders[c]) for c in range(3)]
  for c, hb in enumerate(hbs):
    s.links[c].watch(hb)
    hb.start_threads()
  for hb in hbs:
    assert hb.ready.wait(10)
  ready = time.time()
  time.sleep(1.0 + phase)  # The first beat is a period after the first exchange.
  started = time.time()
  for recorder in recorders:
    recorder.since = started
  if resumes:
    time.sleep(2.0 - 0.15)
    recorders[2].phase = WAITING  # It joins the others' collective.
    time.sleep(2.5)
    assert [hb.failure for hb in hbs] == [None] * 3
    return
  while hbs[1].failure is None and time.time() < started + 6:
    time.sleep(0.01)
  late = time.time() - started - 2.0
  assert hbs[1].failure is not None and hbs[1].failure.client_ids == (2,)
  assert late < 0.5, (f"named {late:.2f} s after the time-out (stall began "
                      f"{started - ready:.2f} s after the first exchange)")
  assert "train.py:9 main" in str(hbs[1].failure)  # The staller's own stack.


class _Downloading(_Recorded):
  """A process that begins a download (1 MB/s, on and on) just after its
  first beat at or after wall time `after` (None: never); `began` is when."""

  RATE = 1_000_000

  def __init__(self):
    super().__init__()
    self.after: float | None = None
    self.began: float | None = None

  def bytes_moved(self, sockets):
    now = time.time()
    if self.began is None:
      if self.after is not None and now >= self.after:
        self.began = now
      return 0
    return int((now - self.began) * self.RATE)


@pytest.mark.parametrize("download", [False, True], ids=["idle", "download"])
def test_a_called_beat_counts_bytes_that_began_moving_since_the_last_beat(star,
                                                                          download):
  """A beat called less than half a period after the last one (a stall's
  time-out) measures what the client did since that beat: a download that
  began just after it makes the client busy, not a staller, though the last
  beat's rates said idle. Period 1 s, stall time-out 2 s, the stall begun
  just after a beat, so the time-out (and the called beat) comes about 0.1 s
  after the next-but-one; the download begins just after that beat. Without
  the download the same client is named at the called beat."""
  s = star(3, open_now=False)
  recorders = [_StandIn(WAITING), _StandIn(WAITING), _StandIn(RUNNING)]
  downloading = _Downloading()
  settings = HeartbeatSettings(period=1.0, policy="log", stall_timeout=2.0,
                               stall_learn=False)
  hbs = [Heartbeat(settings, c, 3, exchange=s.exchanges[c], peers=s.links[c],
                   process=downloading if c == 2 else _Recorded(),
                   recorder=recorders[c])
         for c in range(3)]
  for c, hb in enumerate(hbs):
    s.links[c].watch(hb)
    hb.start_threads()
  for hb in hbs:
    assert hb.ready.wait(10)
  time.sleep(1.0 + 0.1)  # Beats come at 1, 2, 3 s; the stall begins at 1.1 s.
  started = time.time()
  for recorder in recorders:
    recorder.since = started
  if download:
    downloading.after = started + 1.5  # The beat at 3 s begins it.
  while hbs[1].failure is None and time.time() < started + 2.6:
    time.sleep(0.01)
  if not download:
    assert hbs[1].failure is not None and hbs[1].failure.client_ids == (2,)
    assert time.time() - started < 2.0 + 0.5  # At the called beat, not at 4 s.
    return
  assert downloading.began is not None and downloading.began < started + 2.0, (
      "the download began too late to test a called beat")
  assert [hb.failure for hb in hbs] == [None] * 3
