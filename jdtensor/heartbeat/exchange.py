"""The heartbeat's exchange on the liveness links, outside JAX.

**Invisible to JAX.** XLA collectives on one device group are matched across
processes only by issue order, so a background all-reduce on devices that
user code also uses corrupts results or crashes gloo, and ``jax.thread_guard``
forbids any multi-process XLA program off the guarded thread. A beat
therefore runs no XLA program: it sums one row per client over the liveness
links (`exchange.LinkExchange`: client 0 adds the rows up and sends the sum
back), connections every client holds from the start-up handshake. The
user's ``jax.devices()``, ``jax.make_mesh``, ``multihost_utils``, ``pmap``
and orbax see exactly what raw ``jax.distributed`` shows.

`LinkExchange` runs the beats over the liveness
links (`jdtensor.runtime.links.Links`, the start-up's connections, already
open): every client sends its row to client 0 (a binary frame of 25 bytes),
client 0 decides the beat once (`jdtensor.heartbeat.verdicts.Decider`) and
sends every client the outcome: at once when it has news (a verdict, a
straggler, the agreed end), and otherwise only every `ack_every`-th beat
(12 bytes), which paces the clients and proves client 0's heartbeat alive.
A beat costs a client O(1) bytes and client 0 O(N), whatever N is.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from jdtensor._threads import call_bounded
from jdtensor.heartbeat.flight import AT_EXIT
from jdtensor.heartbeat.interfaces import Exchange
from jdtensor.heartbeat.meetings import ServiceWaitWatch
from jdtensor.heartbeat.verdicts import STALLED, Decider
from jdtensor.heartbeat.wire import (PHASE_BITS, PLAIN_OUTCOME, ROW, ROW_FRAME, Answer, Ask,
                                     BeatNow, Clock, Now, Outcome, Present, RollCall, Row, Shared,
                                     read_exchange, read_row_frame, row_frame)

__all__ = ["LinkExchange", "ROW_FRAME", "ack_every_for"]



def ack_every_for(period: float, stuck_timeout: float) -> int:
  """How many beats apart client 0 sends an outcome without news: four to a
  stuck time-out, so that a stuck client 0 is still named within the stuck
  time-out (plus a few periods), and every beat where the time-out is only
  a few periods."""
  return max(1, int(stuck_timeout / (4.0 * period)))


def _news(outcome: Outcome) -> bool:
  return outcome.verdict is not None or bool(outcome.stragglers) or outcome.end


def _asks(beat: int, ack_every: int, stop: int, phase: int) -> bool:
  """Whether a client waits for this beat's outcome: the first, every
  `ack_every`-th, and any it asks to stop in or is at exit in (the agreed
  end; a client at exit beats again at once, paced by the outcomes)."""
  return beat % ack_every == 0 or bool(stop) or (phase & PHASE_BITS) == AT_EXIT


class _Gather:
  """Client 0: the rows of one beat, as they come in."""

  __slots__ = ("have", "count", "tokens", "stop", "phases", "seconds", "busy",
               "moved", "asked", "arrived")

  def __init__(self, n: int):
    self.have = bytearray(n)
    self.count = 0
    self.stop = 0
    self.asked = False  # Some client waits for this beat's outcome.
    self.tokens, self.phases = [0] * n, [0] * n
    self.seconds, self.busy, self.moved = [0] * n, [0] * n, [0] * n
    # When each row came in (monotonic): a row's seconds were sampled no
    # later, so its client has been in its phase at least that much longer
    # since (`Decider.decide`'s `ages`).
    self.arrived = [0.0] * n

  def merged(self, first: bool) -> np.ndarray:
    """The beat's merged vector (`jdtensor.heartbeat.verdicts.BeatLayout`)."""
    tokens = np.asarray(self.tokens, np.int32)
    if first:  # Client 0's token fills every slot (DTensor's first all-reduce).
      tokens[1:] += tokens[0]
    return np.concatenate([tokens, np.asarray([self.stop], np.int32),
                           np.asarray(self.phases, np.int32),
                           np.asarray(self.seconds, np.int32),
                           np.asarray(self.busy, np.int32),
                           np.asarray(self.moved, np.int32)])


def joined_user_collective() -> bool:
  """Whether this client has joined a collective of the user's yet (its
  set-up is over). On CPU, read from the gloo communicators the user's
  backend has set up; elsewhere (or unreadable), assumed."""
  import jax  # pylint: disable=g-import-not-at-top
  from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
  devices = jax.local_devices()
  if not devices or devices[0].platform != "cpu":
    return True
  # On a helper thread: a stopped client 0 cannot block the beat thread. At
  # the interpreter's shutdown (Python 3.12 starts no thread then) the
  # answer is unknown, so assumed, as where it cannot be read.
  joined = call_bounded(lambda: jax_private.joined_gloo_collective(
      {d.id for d in devices}), timeout=1.0, name="jdtensor-joined")
  return True if joined is None else joined


class LinkExchange(Exchange):
  """The production exchange: the rows meet, and are decided, on client 0.

  A beat costs a client one row to client 0 and one outcome back (client 0:
  a row from and an outcome to every client), on connections every client
  already holds; nothing to start, connect or tear down. Client 0's watching
  thread gathers the rows; the last row in completes the beat (on whichever
  thread brings it), and the outcome goes out before client 0's own beat
  returns. An overdue beat's roll call asks client 0 whom it still misses
  (a client's row says it is in that beat), and client 0 answers from the
  same thread, so a client whose heartbeat thread is stuck still counts as
  present once its row is in.

  Frames (`jdtensor.heartbeat.wire`): binary rows (`wire.row_frame`) and plain
  outcomes (`wire.Outcome.to_wire`); JSON messages with
  ``hb``, never relayed by the links: ``done`` (an outcome with news),
  ``roll`` (beat ``b``, query ``q``) and its answer ``present`` (``m``: the
  clients missing, as runs), ``ask`` (question ``w``, query ``q``) and its
  ``answer`` (``c``: clients, as runs), ``share`` (key ``k``, text ``v``:
  client 0 passes it to every client), ``beat`` (client 0 calls every
  client's next beat now: `sleep_until_beat`).

  A client other than client 0 waits for a beat's outcome only where it
  asks for one (`_asks`); in other beats it sends its row and goes on, and
  takes any news with its next beat. Client 0 waits for every beat.

  Args:
    client_id, num_clients: This client and the cluster size.
    links: This client's liveness links (`jdtensor.runtime.links.Links`).
    ack_every: Client 0 sends an outcome without news every this many beats
      (`ack_every_for`; the same on every client).
  """

  def __init__(self, client_id: int, num_clients: int, links: Any, ack_every: int = 1,
               meetings: ServiceWaitWatch | None = None):
    self.client_id, self.num_clients = client_id, num_clients
    self._meetings = meetings
    self.ack_every = max(1, int(ack_every))
    self._links = links
    self._token = 0  # The cluster's token, once known.
    self._cond = threading.Condition()
    self._beat = 0
    self._gathers: dict[int, _Gather] = {}  # Client 0: beat -> rows so far.
    # Guards the gathers (a plain lock: taken once a row, the cheapest).
    self._gather_lock = threading.Lock()
    self._done = -1  # Client 0: the last beat whose outcome went out.
    self._outcomes: dict[int, Outcome] = {}
    self._answers: dict[int, Any] = {}
    self._queries = 0
    self._shared: dict[str, str] = {}
    self._wake: Callable[[], None] | None = None
    self._waiting_for = -1  # The beat whose outcome `beat` waits for.
    # Client 0: when to call the next beat early (`sleep_until_beat`); None: at its time.
    self._early: float | None = None

  def open(self, decider: Decider | None = None,
           wake: Callable[[], None] | None = None) -> None:
    """Takes this client's exchange messages from the links (those already
    received first: the others may beat before this client starts); on
    client 0, `decider` decides every beat; `wake` is called when news comes
    for a beat this client did not wait for."""
    self._decider = decider
    self._wake = wake
    self._links.carry(self._on_message)

  def beat(self, row: Row) -> Outcome:
    """One beat: this client's row in, an outcome out: this beat's where
    this client waits for it (client 0 always; the others where they ask,
    `_asks`), else the oldest news not yet taken, else none (an outcome of
    this beat without news). Waiting blocks until client 0 has every row;
    jdtensor's watchdog bounds the wait."""
    beat = self._beat
    self._beat += 1
    seconds, busy = row.clamped
    if self.client_id == 0:
      self._add(beat, 0, row.token, int(row.stop), row.phase_code, seconds, busy,
                row.moved_slot)
    else:
      self._links.send(row_frame(beat, row), to=0)
    wait = self.client_id == 0 or _asks(beat, self.ack_every, int(row.stop),
                                        row.phase_code)
    with self._cond:
      self._waiting_for = beat if wait else -1
      while True:
        # News not yet taken is taken first (oldest first), without waiting:
        # a beat's news (the agreed end) may come while this client takes an
        # older one, and no later beat may ever be decided.
        news = [b for b in sorted(self._outcomes) if b <= beat and _news(self._outcomes[b])]
        if news or not wait or beat in self._outcomes:
          break
        self._cond.wait()
      self._waiting_for = -1
      if news:
        taken = self._outcomes.pop(news[0])
      else:
        taken = self._outcomes.get(beat) or Outcome(beat, self._token)
      for b in [b for b in self._outcomes if b <= beat and b not in news]:
        del self._outcomes[b]  # Without news, and this beat is past them.
      self._token = taken.token
      return taken

  def sleep_until_beat(self, wake: threading.Event, at: float, period: float) -> None:
    """See `Exchange.sleep_until_beat`. Client 0 calls the beat at which a
    verdict's time-out ends if every client stays as it was at the last
    beat (`Decider.due`), where that is well before `at`: every client
    beats then, and the verdict comes at its time-out, not up to a period
    after it. Each client takes the called beat as the one it was due to
    send at `at`, so the rate stays one a period."""
    early = self._early
    calling = early is not None and early < at - period / 4
    if wake.wait(max(0.0, (early if calling else at) - time.monotonic())):  # type: ignore[operator]
      wake.clear()
    elif calling:
      self._early = None
      self._links.send(BeatNow().to_frame())

  def _add(self, beat: int, client: int, token: int, stop: int, phase: int,
           seconds: int, busy: int, moved: int) -> None:
    """Client 0: one client's row; the outcome goes out once every row is in."""
    with self._gather_lock:
      if beat <= self._done:
        return  # A row again, or late: ignored.
      gather = self._gathers.get(beat)
      if gather is None:
        gather = self._gathers[beat] = _Gather(self.num_clients)
      if gather.have[client]:
        return
      gather.have[client] = 1
      gather.count += 1
      gather.tokens[client], gather.phases[client] = token, phase
      gather.seconds[client], gather.busy[client] = seconds, busy
      gather.moved[client] = min(moved, 2**31 - 1)
      gather.arrived[client] = time.monotonic()
      gather.stop += stop
      if _asks(beat, self.ack_every, stop, phase):
        gather.asked = True
      if gather.count < self.num_clients:
        return
      del self._gathers[beat]
      self._done = beat
    decider = self._decider
    assert decider is not None, "open() first"
    merged = gather.merged(first=beat == 0)
    now = time.monotonic()
    if beat == 0:
      outcome = decider.first(merged)
    else:
      outcome = decider.decide(merged, ages=now - np.asarray(gather.arrived))
    self._early = None if beat == 0 or decider.due is None else now + decider.due
    # Out before this client's own beat returns, so that a client waiting for
    # a beat always has its outcome before the next beat can complete.
    if gather.asked or _news(outcome):
      self._send_outcome(outcome)
    with self._cond:
      self._outcomes[beat] = outcome
      self._cond.notify_all()

  def _send_outcome(self, outcome: Outcome) -> None:
    """Client 0: an outcome to every client; a stall's to the staller first.

    Every other client waits for the stack the staller shares once it has
    the verdict, so the staller hears it before the thousands of others,
    not after them (at 4,096 clients, the send loop alone takes a few
    hundred milliseconds)."""
    wire = outcome.to_wire()
    verdict = outcome.verdict
    first = (verdict.culprits if verdict is not None and verdict.kind == STALLED
             else ())
    for client in first:
      self._links.send(wire, to=client)
    self._links.send(wire, skip=first)

  def _on_message(self, client: int, message: dict[str, Any] | bytes) -> None:
    """One exchange message from `client` (on the links' watching thread)."""
    try:
      if isinstance(message, bytes):
        if message[:1] == bytes((ROW,)) and self.client_id == 0:
          beat, token, stop, phase, seconds, busy, moved = read_row_frame(message)
          self._add(beat, client, token, min(stop, 1), phase, seconds, busy, moved)
        elif message[:1] == bytes((PLAIN_OUTCOME,)):
          self._outcome(Outcome.from_wire(message, self.num_clients))
        return
      said = read_exchange(message, self.num_clients)
      if isinstance(said, Outcome):
        self._outcome(said)
      elif isinstance(said, RollCall) and self.client_id == 0:
        self._links.send(Present(said.query, tuple(self._missing(said.beat))).to_frame(),
                         to=client)
      elif isinstance(said, Present):
        self._answer(said.query, set(range(self.num_clients)) - set(said.missing))
      elif isinstance(said, Ask) and self.client_id == 0:
        decider = self._decider
        clients = decider.clients(said.what) if decider is not None else None
        self._links.send(Answer(said.query, None if clients is None
                                else tuple(clients)).to_frame(), to=client)
      elif isinstance(said, Answer):
        self._answer(said.query, None if said.clients is None else list(said.clients))
      elif isinstance(said, Clock) and self.client_id == 0:
        self._links.send(Now(said.query, time.time()).to_frame(), to=client)
      elif isinstance(said, Now):
        self._answer(said.query, said.at)
      elif isinstance(said, BeatNow) and client == 0:
        wake = self._wake
        if wake is not None:
          wake()
      elif isinstance(said, Shared):
        with self._cond:
          self._shared[said.key] = said.value
          self._cond.notify_all()
        if self.client_id == 0:
          self._links.send(message, skip=(client,))
    except (KeyError, TypeError, ValueError, IndexError):
      pass  # A malformed message from an authenticated peer is ignored.

  def _outcome(self, outcome: Outcome) -> None:
    with self._cond:
      self._outcomes[outcome.beat] = outcome
      self._cond.notify_all()
      unawaited = outcome.beat != self._waiting_for
    wake = self._wake
    if wake is not None and unawaited and _news(outcome):
      wake()  # The heartbeat thread is between beats: it beats at once.

  def _answer(self, query: int, value: Any) -> None:
    with self._cond:
      self._answers[query] = value
      self._cond.notify_all()

  def _missing(self, beat: int) -> list[int]:
    """Client 0: whom the beats up to `beat` wait for: the clients whose row
    for the oldest beat not yet complete it does not hold (the others may
    be beats ahead; that beat holds everyone up)."""
    with self._gather_lock:
      if beat <= self._done:
        return []
      gather = self._gathers.get(self._done + 1)
      if gather is None:
        return list(range(self.num_clients))
      return [c for c, have in enumerate(gather.have) if not have]

  def clock_offset(self, tries: int = 3, timeout: float = 1.0
                   ) -> tuple[float, float] | None:
    """Seconds to add to this client's ``time.time()`` for client 0's, and
    the residual (half the shortest round trip of `tries`); None when client
    0 does not answer."""
    if self.client_id == 0:
      return 0.0, 0.0
    best: tuple[float, float] | None = None
    for _ in range(tries):
      sent = time.time()
      at = self._query(Clock(), timeout)
      back = time.time()
      if at is not None and (best is None or (back - sent) / 2 < best[1]):
        best = (at - (sent + back) / 2, (back - sent) / 2)
    return best

  def _query(self, question: RollCall | Ask | Clock, timeout: float) -> Any:
    """Sends client 0 a question; its answer, or None after `timeout` s."""
    with self._cond:
      self._queries += 1
      query = self._queries
    self._links.send(dataclasses.replace(question, query=query).to_frame(), to=0)
    return self._await(self._answers, query, timeout, take=True)

  def _ask(self, beat: int, timeout: float) -> set[int] | None:
    """Client 0's answer to "who is in `beat`", or None if none came."""
    if self.client_id == 0:
      return set(range(self.num_clients)) - set(self._missing(beat))
    return self._query(RollCall(beat), timeout)

  def ask(self, what: str, timeout: float) -> list[int] | None:
    """Client 0's decider's `clients(what)` (None: no answer)."""
    if self.client_id == 0:
      decider = self._decider
      return decider.clients(what) if decider is not None else None
    return self._query(Ask(what), timeout)

  def _await(self, table: dict[Any, Any], key: Any, timeout: float,
             take: bool = False) -> Any:
    """`table[key]` once a message has put it there (removed if `take`),
    or None after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    with self._cond:
      while key not in table:
        left = deadline - time.monotonic()
        if left <= 0:
          return None
        self._cond.wait(left)
      return table.pop(key) if take else table[key]

  def roll_call(self, beat: int, grace: float) -> set[int] | None:
    """Who is in `beat` (this client is: it sent its row), waiting up to
    `grace` s for the others; None if client 0 does not answer. The start
    marker (beat 0, no grace) costs nothing: row 0 says it."""
    if beat == 0 and grace <= 0:
      return None
    deadline = time.monotonic() + grace
    while True:
      present = self._ask(beat, timeout=1.0)
      if present is None:
        return None
      present.add(self.client_id)
      if len(present) >= self.num_clients or time.monotonic() >= deadline:
        return present
      time.sleep(0.05)

  def share(self, key: str, value: str) -> None:
    """Publishes `value` under `key` for every client (through client 0)."""
    with self._cond:
      self._shared[key] = value
      self._cond.notify_all()
    self._links.send(Shared(key, value).to_frame(), to=None if self.client_id == 0 else 0)

  def fetch(self, key: str, timeout: float) -> str | None:
    """What some client published under `key`, waiting up to `timeout` s."""
    return self._await(self._shared, key, timeout)

  def joined_collective(self) -> bool:
    """See `joined_user_collective`; or this client came out of a wait on
    the coordination service (`jdtensor.heartbeat.meetings`)."""
    if self._meetings is not None and self._meetings.has_met():
      return True
    joined = joined_user_collective()
    if joined and self._meetings is not None:
      self._meetings.stop()  # Nothing more to learn.
    return joined
