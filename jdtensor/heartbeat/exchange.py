"""The heartbeat's exchange: sums of one row per client, outside JAX.

A beat runs no XLA program, so the user's JAX sees exactly what raw
``jax.distributed`` shows. `LinkExchange` sums the rows over the liveness
links (`jdtensor.runtime.links.Links`, the start-up's connections, already
open): every client sends its row to client 0, which sends the sum back to
every client. (Until 27f69ae the rows were summed through a second, private
coordination service; its gRPC client and threads cost about 70 ms of CPU a
client at 32 clients on 2 cores: benchmarks/RESULTS.md.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from jdtensor.heartbeat.interfaces import Exchange
from jdtensor.heartbeat.protocol import BeatLayout

__all__ = ["LinkExchange", "bounded"]


def joined_user_collective() -> bool:
  """Whether this client has joined a collective of the user's yet (its
  set-up is over). On CPU, read from the gloo communicators the user's
  backend has set up; elsewhere (or unreadable), assumed."""
  import jax  # pylint: disable=g-import-not-at-top
  from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
  devices = jax.local_devices()
  if not devices or devices[0].platform != "cpu":
    return True
  # On a helper thread: a stopped client 0 cannot block the beat thread.
  joined = bounded(lambda: jax_private.joined_gloo_collective(
      {d.id for d in devices}), timeout=1.0)
  return True if joined is None else joined


class LinkExchange(Exchange):
  """The production exchange: client 0 sums the rows over the liveness links.

  A beat costs a client one message to client 0 and one back (client 0: one
  from and one to every client), on connections every client already holds;
  nothing to start, connect or tear down. Client 0's watching thread adds
  the rows up; an overdue beat's roll call asks client 0 whose rows it holds
  (a client's row says it is in that beat), and client 0 answers from the
  same thread, so a client whose heartbeat thread is stuck still counts as
  present once its row is in.

  Messages (each with ``hb``, never relayed by the links): ``row`` (beat
  ``b``, the row's non-zero entries ``i``/``v``), ``sum`` (beat ``b``, the
  sum ``v``), ``roll`` (beat ``b``, query ``q``) and its answer ``present``
  (``c``: the clients), ``share`` (key ``k``, text ``v``: client 0 passes it
  to every client).

  Args:
    client_id, num_clients: This client and the cluster size.
    links: This client's liveness links (`jdtensor.runtime.links.Links`).
  """

  def __init__(self, client_id: int, num_clients: int, links: Any):
    self.client_id, self.num_clients = client_id, num_clients
    self.width = BeatLayout(num_clients).width
    self._links = links
    self._cond = threading.Condition()
    self._beat = 0
    self._rows: dict[int, dict[int, np.ndarray]] = {}  # Client 0: beat -> rows.
    self._done = -1  # Client 0: the last beat whose sum went out.
    self._sums: dict[int, np.ndarray] = {}
    self._answers: dict[int, set[int]] = {}
    self._queries = 0
    self._shared: dict[str, str] = {}

  def open(self) -> None:
    """Takes this client's exchange messages from the links (those already
    received first: the others may beat before this client starts)."""
    self._links.carry(self._on_message)

  def all_reduce(self, row: np.ndarray) -> np.ndarray:
    """The sum of every client's row: one beat. Blocks until client 0 has
    every row; jdtensor's watchdog bounds the wait."""
    beat = self._beat
    self._beat += 1
    values = np.ascontiguousarray(row, np.int32)
    if self.client_id == 0:
      self._add(beat, 0, values)
    else:
      nonzero = np.flatnonzero(values)
      self._links.send({"hb": "row", "b": beat, "i": nonzero.tolist(),
                        "v": values[nonzero].tolist()}, to=0)
    with self._cond:
      while beat not in self._sums:
        self._cond.wait()
      return self._sums.pop(beat)

  def _add(self, beat: int, client: int, row: np.ndarray) -> None:
    """Client 0: one client's row; the sum goes out once every row is in."""
    with self._cond:
      if beat <= self._done:
        return  # A row again: ignored.
      rows = self._rows.setdefault(beat, {})
      rows[client] = row
      if len(rows) < self.num_clients:
        return
      del self._rows[beat]
      self._done = beat
    total = np.sum(np.stack(list(rows.values())), axis=0, dtype=np.int64).astype(np.int32)
    # Out before this client's own beat returns, so the others always have a
    # beat's sum before the next beat can complete.
    self._links.send({"hb": "sum", "b": beat, "v": total.tolist()})
    with self._cond:
      self._sums[beat] = total
      self._cond.notify_all()

  def _on_message(self, client: int, message: dict[str, Any]) -> None:
    """One exchange message from `client` (on the links' watching thread)."""
    try:
      kind, beat = message["hb"], int(message.get("b", -1))
      if kind == "row" and self.client_id == 0:
        index = np.asarray(message["i"], np.int64)
        if index.size and (index.min() < 0 or index.max() >= self.width):
          raise ValueError("a row's index out of range")  # Never wrap around.
        row = np.zeros(self.width, np.int32)
        row[index] = np.asarray(message["v"], np.int32)
        self._add(beat, client, row)
      elif kind == "sum":
        total = np.asarray(message["v"], np.int32)
        if total.shape == (self.width,):
          with self._cond:
            self._sums[beat] = total
            self._cond.notify_all()
      elif kind == "roll" and self.client_id == 0:
        self._links.send({"hb": "present", "q": message["q"],
                          "c": sorted(self._present(beat))}, to=client)
      elif kind == "present":
        with self._cond:
          self._answers[int(message["q"])] = {int(c) for c in message["c"]}
          self._cond.notify_all()
      elif kind == "share":
        with self._cond:
          self._shared[str(message["k"])] = str(message["v"])
          self._cond.notify_all()
        if self.client_id == 0:
          self._links.send(message, skip=(client,))
    except (KeyError, TypeError, ValueError, IndexError):
      pass  # A malformed message from an authenticated peer is ignored.

  def _present(self, beat: int) -> set[int]:
    """Client 0: the clients whose row for `beat` it holds."""
    with self._cond:
      if beat <= self._done:
        return set(range(self.num_clients))
      return set(self._rows.get(beat, {}))

  def _ask(self, beat: int, timeout: float) -> set[int] | None:
    """Client 0's answer to "who is in `beat`", or None if none came."""
    if self.client_id == 0:
      return self._present(beat)
    with self._cond:
      self._queries += 1
      query = self._queries
    self._links.send({"hb": "roll", "b": beat, "q": query}, to=0)
    return self._await(self._answers, query, timeout, take=True)

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
    message = {"hb": "share", "k": key, "v": value}
    with self._cond:
      self._shared[key] = value
      self._cond.notify_all()
    self._links.send(message, to=None if self.client_id == 0 else 0)

  def fetch(self, key: str, timeout: float) -> str | None:
    """What some client published under `key`, waiting up to `timeout` s."""
    return self._await(self._shared, key, timeout)

  def joined_collective(self) -> bool:
    """See `joined_user_collective`."""
    return joined_user_collective()


def bounded(fn: Callable[[], Any], timeout: float) -> Any:
  """`fn()` on a helper thread; None if it fails or takes over `timeout` s."""
  out: list[Any] = []

  def call() -> None:
    try:
      out.append(fn())
    except Exception:  # pylint: disable=broad-except
      pass
  thread = threading.Thread(target=call, daemon=True, name="jdtensor-kv")
  thread.start()
  thread.join(timeout)
  return out[0] if out else None
