"""The heartbeat's exchange on the liveness links: real `Links` over socket
pairs (a star around client 0, as the rendezvous leaves them), one thread per
client, no JAX backend."""

import socket
import threading
import time

import numpy as np
import pytest

from jdtensor.heartbeat.exchange import LinkExchange
from jdtensor.heartbeat.protocol import BeatLayout
from jdtensor.runtime.links import Links


class Star:
  """`n` clients' links and exchanges in one process."""

  def __init__(self, n: int, open_now: bool = True):
    self.n = n
    pairs = {c: socket.socketpair() for c in range(1, n)}
    self.links = [Links(0, {c: pairs[c][0] for c in pairs})]
    self.links += [Links(c, {0: pairs[c][1]}) for c in range(1, n)]
    for link in self.links:
      link.watch(None)
    self.exchanges = [LinkExchange(c, n, self.links[c]) for c in range(n)]
    if open_now:
      for ex in self.exchanges:
        ex.open()

  def close(self) -> None:
    for link in self.links:
      link._closing = True  # pylint: disable=protected-access
      for sock in list(link._sockets.values()):  # pylint: disable=protected-access
        sock.close()

  def beat(self, rows: dict[int, np.ndarray], timeout: float = 10.0
           ) -> dict[int, np.ndarray]:
    """Each client in `rows` runs one all-reduce on its own thread."""
    out: dict[int, np.ndarray] = {}

    def run(c: int) -> None:
      out[c] = self.exchanges[c].all_reduce(rows[c])
    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in rows]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout)
    return out


@pytest.fixture
def star():
  made = []

  def make(n, open_now=True):
    made.append(Star(n, open_now))
    return made[-1]
  yield make
  for s in made:
    s.close()


def rows_of(n: int, beat: int) -> dict[int, np.ndarray]:
  layout = BeatLayout(n)
  return {c: layout.row(c, 1000 + c, False, 1, beat, 10 * c + beat) for c in range(n)}


@pytest.mark.parametrize("n", [2, 3, 5])
def test_every_client_gets_the_same_sum_beat_after_beat(star, n):
  s = star(n)
  for beat in range(4):
    rows = rows_of(n, beat)
    out = s.beat(rows)
    expected = np.sum(np.stack(list(rows.values())), axis=0).astype(np.int32)
    assert sorted(out) == list(range(n))
    for c in range(n):
      np.testing.assert_array_equal(out[c], expected)
      assert out[c].dtype == np.int32


def test_rows_sent_before_client_0_starts_are_kept(star):
  s = star(3, open_now=False)
  for c in (1, 2):
    s.exchanges[c].open()
  rows = rows_of(3, 0)
  early: dict[int, np.ndarray] = {}
  threads = [threading.Thread(
      target=lambda c=c: early.update({c: s.exchanges[c].all_reduce(rows[c])}),
      daemon=True) for c in (1, 2)]
  for t in threads:
    t.start()
  time.sleep(0.3)
  assert early == {}  # Nobody has a sum without client 0's row.
  s.exchanges[0].open()
  out = s.beat({0: rows[0]})
  for t in threads:
    t.join(10.0)
  for c, total in {**early, **out}.items():
    np.testing.assert_array_equal(total, sum(rows.values()), err_msg=f"client {c}")
  assert sorted({**early, **out}) == [0, 1, 2]


def test_a_roll_call_names_whose_row_client_0_holds(star):
  s = star(3)
  rows = rows_of(3, 0)
  s.beat({1: rows[1], 2: rows[2]}, timeout=0.2)  # Client 0 never beats.
  started = time.monotonic()
  assert s.exchanges[1].roll_call(0, 0.3) == {1, 2}
  assert 0.25 < time.monotonic() - started < 2.0  # It waited its grace.
  # The caller counts itself present: it asks from inside the beat.
  assert s.exchanges[0].roll_call(0, 0.01) == {0, 1, 2}


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


def test_a_shared_text_reaches_every_client(star):
  s = star(3)
  s.exchanges[2].share("stack/2", "File train.py, line 3")
  for c in range(3):
    assert s.exchanges[c].fetch("stack/2", timeout=5.0) == "File train.py, line 3"
  assert s.exchanges[1].fetch("stack/0", timeout=0.1) is None


def test_malformed_exchange_messages_are_ignored(star):
  s = star(2)
  for bad in ({"hb": "row", "b": 0, "i": [10**6], "v": [1]},
              {"hb": "row", "b": 0, "i": [-1], "v": [5]}, {"hb": "row"},
              {"hb": "sum", "b": "x", "v": None}, {"hb": "present", "q": "?"},
              {"hb": 7}):
    s.links[1].send(bad, to=0)
    s.links[0].send(bad, to=1)
  out = s.beat(rows_of(2, 0))
  np.testing.assert_array_equal(out[0], out[1])
  np.testing.assert_array_equal(out[0], sum(rows_of(2, 0).values()))


def test_a_large_cluster_s_sum_fits_one_link_message(star):
  """A merged row has 4 values a client: 4,096 clients' sum is one message."""
  s = star(2)
  s.exchanges[1].width = s.exchanges[0].width = BeatLayout(4096).width
  row = np.full(BeatLayout(4096).width, 65535, np.int32)
  out = s.beat({0: row, 1: row})
  np.testing.assert_array_equal(out[1], 2 * row)


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
