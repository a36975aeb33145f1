"""What the heartbeat's parts say to each other, and its frames on the wire.

A client's `Row` for one beat, the merged beat's `BeatLayout`, and the beat's
`Outcome` with at most one `Verdict`: data, and the one place that builds or
parses their frames (`row_frame`/`read_row_frame`, `Outcome.to_wire`/
`Outcome.from_wire`, `Verdict.to_json`/`Verdict.from_json`). Every binary
frame on the liveness links starts with a kind byte (`ROW`, `PLAIN_OUTCOME`);
the other messages are JSON objects (`jdtensor.runtime.links`).

No threads, no sockets, no JAX (`verdicts` decides, `exchange` carries).
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from typing import Any, Union

import numpy as np

from jdtensor._ids import to_ranges

__all__ = ["BeatLayout", "Row", "Verdict", "VerdictKind", "Outcome", "ROW_FRAME", "ROW",
           "PLAIN_OUTCOME", "PHASE_BITS", "SECONDS_SLOT_SCALE", "row_frame",
           "read_row_frame", "from_ranges",
           "RollCall", "Present", "Ask", "Answer", "Shared", "Clock", "Now", "BeatNow",
           "ExchangeMessage",
           "read_exchange",
           "EARLY_EXIT", "STALLED", "ALL_WAITING", "DEADLOCK", "OUT_OF_SYNC",
           "FIRST_TOKENS"]

# The phase slot's bits that hold the phase itself (`jdtensor.heartbeat.flight`).
PHASE_BITS = 7
# The phase slot's bit that says a client has not joined a collective yet
# (above every phase).
_NOT_JOINED = 8
# The phase slot's bit that says a client's main thread ran over the last
# period (its own CPU time moved: a step, a dispatch, a loop), not blocked
# for the whole of it.
_ACTIVE = 16
# A row's seconds travel in tenths: client 0 can then call the beat that
# reaches a time-out when it is reached (`jdtensor.heartbeat.verdicts.
# verdict_due`), not up to a second later. An int32 slot holds 6.8 years.
SECONDS_SLOT_SCALE = 10


class VerdictKind(str, enum.Enum):
  """What a verdict is about (its value is what travels in an outcome)."""
  EARLY_EXIT = "early_exit"  # Clients at exit while others wait for them.
  STALLED = "stalled"  # One client idle in its own code, everyone else waiting.
  ALL_WAITING = "all_waiting"  # Every client waits: a long computation or a deadlock.
  DEADLOCK = "deadlock"  # Every client idle in a collective for the deadlock time-out.
  OUT_OF_SYNC = "out_of_sync"  # Slots without the cluster's token (a restart).
  FIRST_TOKENS = "first_tokens"  # The first beat did not spread client 0's token.


EARLY_EXIT, STALLED, ALL_WAITING, DEADLOCK, OUT_OF_SYNC, FIRST_TOKENS = (
    VerdictKind.EARLY_EXIT, VerdictKind.STALLED, VerdictKind.ALL_WAITING,
    VerdictKind.DEADLOCK, VerdictKind.OUT_OF_SYNC, VerdictKind.FIRST_TOKENS)


class BeatLayout:
  """Where each value sits in the merged beat of `n` clients: DTensor's token
  slots, the stop request, then each client's phase, seconds in it, busy
  percent and bytes moved a second."""

  def __init__(self, n: int):
    self.n = n
    self.stop = n
    self.width = 5 * n + 1

  def row(self, client: int, token: int, stop: bool, phase: int, seconds: float,
          busy: int, joined: bool = True, moved: int = 0) -> np.ndarray:
    """One client's row as a vector of the merged beat's width."""
    return Row(client, token, bool(stop), phase, seconds, busy, joined,
               moved=moved).vector(self.n)

  def tokens(self, merged: np.ndarray) -> np.ndarray:
    return merged[:self.n]

  def states(self, merged: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phase, seconds in it (to a tenth), busy percent) per client."""
    n = self.n
    return (merged[n + 1:2 * n + 1] & (_NOT_JOINED - 1),
            merged[2 * n + 1:3 * n + 1] / SECONDS_SLOT_SCALE,
            merged[3 * n + 1:4 * n + 1])

  def moved(self, merged: np.ndarray) -> np.ndarray:
    """Per client: the bytes its process moved a second over the last period
    (less jdtensor's own)."""
    return merged[4 * self.n + 1:]

  def joined(self, merged: np.ndarray) -> np.ndarray:
    """Per client: whether it has joined a collective yet (set-up is over)."""
    n = self.n
    return (merged[n + 1:2 * n + 1] & _NOT_JOINED) == 0

  def active(self, merged: np.ndarray) -> np.ndarray:
    """Per client: whether its main thread ran over the last period."""
    n = self.n
    return (merged[n + 1:2 * n + 1] & _ACTIVE) != 0


@dataclasses.dataclass(frozen=True)
class Row:
  """What one client says in a beat.

  Attributes:
    client: Its id.
    token: The cluster's token (client 0's in the first beat, 0 elsewhere).
    stop: Whether it asks every client to stop.
    phase: Its main thread's phase (`jdtensor.heartbeat.flight`).
    seconds: Seconds in that phase.
    busy: Its process's CPU use over the last period, percent of a core.
    joined: Whether it has joined a collective yet.
    first: The first beat, where client 0's token fills every token slot
      (DTensor's first all-reduce).
    moved: Bytes its process read and wrote a second over the last period
      (files, pipes, TCP), less jdtensor's own traffic.
    active: Whether its main thread ran over the last period (not blocked
      for the whole of it): the run's rhythm is counted in periods where
      every client's did (`StallTimeout`).
  """
  client: int
  token: int
  stop: bool
  phase: int
  seconds: float
  busy: float
  joined: bool = True
  first: bool = False
  moved: float = 0.0
  active: bool = True

  @property
  def phase_code(self) -> int:
    """The phase slot: the phase, the not-joined bit (a client still in
    set-up is never a staller) and the active bit."""
    return (int(self.phase) | (0 if self.joined else _NOT_JOINED)
            | (_ACTIVE if self.active else 0))

  @property
  def clamped(self) -> tuple[int, int]:
    """(seconds, busy) as the int32 slots hold them: seconds in tenths
    (`SECONDS_SLOT_SCALE`), rounded down."""
    return (min(int(self.seconds * SECONDS_SLOT_SCALE + 1e-6), 2**31 - 1),
            max(0, min(int(self.busy), 10**6)))

  @property
  def moved_slot(self) -> int:
    """`moved` as its int32 slot holds it."""
    return max(0, min(int(self.moved), 2**31 - 1))

  def vector(self, n: int) -> np.ndarray:
    """This row in the merged beat's layout for `n` clients."""
    row = np.zeros(5 * n + 1, np.int32)
    c = self.client
    if self.first and c == 0:
      row[:n] = self.token
    else:
      row[c] = self.token
    row[n] = int(self.stop)
    row[n + 1 + c] = self.phase_code
    row[2 * n + 1 + c], row[3 * n + 1 + c] = self.clamped
    row[4 * n + 1 + c] = self.moved_slot
    return row


def from_ranges(ranges: Any, limit: int) -> list[int]:
  """The ids of `to_ranges`' runs, each in ``[0, limit)``.

  Raises:
    ValueError: A malformed or out-of-range run.
  """
  out: list[int] = []
  for first, last in ranges:
    first, last = int(first), int(last)
    if not 0 <= first <= last < limit:
      raise ValueError(f"a run of clients out of range: {first}-{last}")
    out.extend(range(first, last + 1))
  return out


@dataclasses.dataclass(frozen=True)
class Verdict:
  """A failure every client names the same way.

  Attributes:
    kind: `EARLY_EXIT`, `STALLED`, `ALL_WAITING`, `DEADLOCK`, `OUT_OF_SYNC`
      or `FIRST_TOKENS`.
    culprits: The clients named (every client, for `ALL_WAITING` and
      `DEADLOCK`).
    seconds: For `STALLED`: how long the staller ran its own code; for
      `DEADLOCK`: how long every client has waited, idle.
    waiting: For `EARLY_EXIT`: the clients waiting in a collective.
    tokens: For `OUT_OF_SYNC`: each culprit's token, in `culprits`' order;
      for `FIRST_TOKENS`: every token slot.
    cluster_token: For `OUT_OF_SYNC` and `FIRST_TOKENS`: the cluster's token.
    timeout: For `STALLED`: the stall time-out it was named under, seconds;
      for `DEADLOCK`: the deadlock time-out.
    learnt: For `STALLED` under a learnt time-out: the longest idle pause
      it was learnt from, seconds; None under the set time-out.
    early: For `STALLED` with learning on: the pause began before the run
      had shown its rhythm, so the ceiling judged it.
    busy: For `STALLED`: the staller's CPU use over the last period, percent
      of a core.
    moved: For `STALLED`: the bytes the staller's process moved a second
      over the last period.
  """
  kind: VerdictKind
  culprits: tuple[int, ...]
  seconds: int = 0
  waiting: tuple[int, ...] = ()
  tokens: tuple[int, ...] = ()
  cluster_token: int = 0
  timeout: float = 0.0
  learnt: float | None = None
  early: bool = False
  busy: int = 0
  moved: int = 0

  def token_of(self, client: int) -> int:
    """The token `client`'s slot held (`OUT_OF_SYNC`)."""
    if client in self.culprits:
      return self.tokens[self.culprits.index(client)]
    return self.cluster_token

  def to_json(self) -> dict[str, Any]:
    out = {"k": self.kind.value, "c": to_ranges(self.culprits), "s": self.seconds,
           "w": to_ranges(self.waiting), "t": list(self.tokens),
           "ct": self.cluster_token, "to": self.timeout}
    if self.learnt is not None:
      out["lf"] = self.learnt
    if self.early:
      out["ea"] = 1
    if self.kind == STALLED:
      out["bu"], out["mv"] = self.busy, self.moved
    return out

  @classmethod
  def from_json(cls, data: dict[str, Any], n: int) -> Verdict:
    try:
      kind = VerdictKind(str(data["k"]))
    except ValueError:
      raise ValueError(f"an unknown verdict: {data['k']!r}") from None
    culprits = tuple(from_ranges(data["c"], n))
    tokens = tuple(int(t) for t in data.get("t", ()))
    if kind == OUT_OF_SYNC and len(tokens) != len(culprits):
      raise ValueError("a token per culprit expected")
    learnt = data.get("lf")
    return cls(kind, culprits, int(data.get("s", 0)),
               tuple(from_ranges(data.get("w", ()), n)), tokens,
               int(data.get("ct", 0)), float(data.get("to", 0.0)),
               None if learnt is None else float(learnt), bool(data.get("ea", 0)),
               int(data.get("bu", 0)), int(data.get("mv", 0)))


# An outcome without news: beat, token, whether the run ends (a kind byte
# first, as every binary frame on the links).
_PLAIN = struct.Struct("<BIiB")
PLAIN_OUTCOME = ord("D")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What one beat decided, the same for every client.

  Attributes:
    beat: The beat (0: the first exchange).
    token: The cluster's token.
    end: The run ends by agreement (a stop request, or every client at exit).
    verdict: A failure, or None.
    stragglers: (client, percent of the window the others waited for it) of
      each client named a straggler at this beat.
  """
  beat: int
  token: int
  end: bool = False
  verdict: Verdict | None = None
  stragglers: tuple[tuple[int, float], ...] = ()

  def to_wire(self) -> bytes | dict[str, Any]:
    """A compact binary frame when there is no news, else a JSON object."""
    if self.verdict is None and not self.stragglers:
      return _PLAIN.pack(PLAIN_OUTCOME, self.beat, self.token, int(self.end))
    out: dict[str, Any] = {"hb": "done", "b": self.beat, "t": self.token,
                           "e": int(self.end)}
    if self.verdict is not None:
      out["v"] = self.verdict.to_json()
    if self.stragglers:
      out["s"] = [[c, round(share, 1)] for c, share in self.stragglers]
    return out

  @classmethod
  def from_wire(cls, data: bytes | dict[str, Any], n: int) -> Outcome:
    """The outcome `to_wire` encoded.

    Raises:
      ValueError, KeyError, TypeError: A malformed frame.
    """
    if isinstance(data, bytes):
      try:
        kind, beat, token, end = _PLAIN.unpack(data)
      except struct.error:
        raise ValueError(f"an outcome of {len(data)} bytes") from None
      if kind != PLAIN_OUTCOME:
        raise ValueError("not an outcome")
      return cls(beat, token, bool(end))
    verdict = Verdict.from_json(data["v"], n) if "v" in data else None
    stragglers = tuple((int(c), float(s)) for c, s in data.get("s", ()))
    if any(not 0 <= c < n for c, _ in stragglers):
      raise ValueError("a straggler out of range")
    return cls(int(data["b"]), int(data["t"]), bool(data.get("e")), verdict, stragglers)


# A row on the wire: kind, beat, token, stop, phase slot, tenths of seconds, busy,
# bytes moved a second.
ROW_FRAME = struct.Struct("<BIiBBiiI")
ROW = ord("R")


def row_frame(beat: int, row: Row) -> bytes:
  """`row` of `beat` as the binary frame a client sends client 0."""
  seconds, busy = row.clamped
  return ROW_FRAME.pack(ROW, beat, row.token, int(row.stop), row.phase_code, seconds,
                        busy, row.moved_slot)


def read_row_frame(data: bytes) -> tuple[int, int, int, int, int, int, int]:
  """(beat, token, stop, phase slot, seconds, busy, moved) of a `row_frame`.

  Raises:
    ValueError: A frame of the wrong size.
  """
  try:
    _, beat, token, stop, phase, seconds, busy, moved = ROW_FRAME.unpack(data)
  except struct.error:
    raise ValueError(f"a row of {len(data)} bytes") from None
  return beat, token, stop, phase, seconds, busy, moved


# -- the exchange's questions and answers (JSON objects with an ``hb`` key) --------

@dataclasses.dataclass(frozen=True)
class RollCall:
  """A client asks client 0 who is in `beat` (an overdue beat's roll call)."""
  beat: int
  query: int = 0

  def to_frame(self) -> dict[str, Any]:
    return {"hb": "roll", "b": self.beat, "q": self.query}


@dataclasses.dataclass(frozen=True)
class Present:
  """Client 0's answer to a `RollCall`: the clients `missing` from the beat."""
  query: int
  missing: tuple[int, ...]

  def to_frame(self) -> dict[str, Any]:
    return {"hb": "present", "q": self.query, "m": to_ranges(self.missing)}


@dataclasses.dataclass(frozen=True)
class Ask:
  """A client asks client 0's decider `Decider.clients(what)`."""
  what: str
  query: int = 0

  def to_frame(self) -> dict[str, Any]:
    return {"hb": "ask", "w": self.what, "q": self.query}


@dataclasses.dataclass(frozen=True)
class Answer:
  """Client 0's answer to an `Ask` (None: its decider has none)."""
  query: int
  clients: tuple[int, ...] | None

  def to_frame(self) -> dict[str, Any]:
    return {"hb": "answer", "q": self.query,
            "c": None if self.clients is None else to_ranges(self.clients)}


@dataclasses.dataclass(frozen=True)
class Shared:
  """A text published under `key` for every client (a staller's stack)."""
  key: str
  value: str

  def to_frame(self) -> dict[str, Any]:
    return {"hb": "share", "k": self.key, "v": self.value}


@dataclasses.dataclass(frozen=True)
class Clock:
  """A client asks client 0 the time (a trace's clocks are client 0's)."""
  query: int = 0

  def to_frame(self) -> dict[str, Any]:
    return {"hb": "clock", "q": self.query}


@dataclasses.dataclass(frozen=True)
class Now:
  """Client 0's answer to a `Clock`: its ``time.time()``."""
  query: int
  at: float

  def to_frame(self) -> dict[str, Any]:
    return {"hb": "now", "q": self.query, "t": self.at}


@dataclasses.dataclass(frozen=True)
class BeatNow:
  """Client 0 asks every client to beat now rather than at its next beat's
  time: the beat that may reach a verdict's time-out
  (`jdtensor.heartbeat.verdicts.verdict_due`)."""

  def to_frame(self) -> dict[str, Any]:
    return {"hb": "beat"}


ExchangeMessage = Union[Outcome, RollCall, Present, Ask, Answer, Shared, Clock, Now,
                        BeatNow]


def read_exchange(frame: dict[str, Any], n: int) -> ExchangeMessage | None:
  """The exchange message in `frame` (a JSON object with an ``hb`` key), for
  `n` clients; None for a kind this version does not know.

  Raises:
    KeyError, TypeError, ValueError: A malformed message.
  """
  kind = frame["hb"]
  if kind == "done":
    return Outcome.from_wire(frame, n)
  if kind == "roll":
    return RollCall(int(frame["b"]), int(frame["q"]))
  if kind == "present":
    return Present(int(frame["q"]), tuple(from_ranges(frame["m"], n)))
  if kind == "ask":
    return Ask(str(frame["w"]), int(frame["q"]))
  if kind == "answer":
    clients = frame["c"]
    return Answer(int(frame["q"]), None if clients is None
                  else tuple(from_ranges(clients, n)))
  if kind == "share":
    return Shared(str(frame["k"]), str(frame["v"]))
  if kind == "clock":
    return Clock(int(frame["q"]))
  if kind == "now":
    return Now(int(frame["q"]), float(frame["t"]))
  if kind == "beat":
    return BeatNow()
  return None
