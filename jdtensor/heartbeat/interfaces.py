"""What the heartbeat protocol is given: the exchange, the peers and the
process (the fourth, the main thread's recorder, is
`jdtensor.heartbeat.flight.Recorder`).

Small classes with working defaults: production subclasses them
(`jdtensor.heartbeat.exchange.LinkExchange`,
`jdtensor.heartbeat.process.ClientProcess`; the liveness links, `jdtensor.runtime.links.Links`, have
the `Peers` methods), and a test fake is a few lines.
"""

from __future__ import annotations

from collections.abc import Callable

import os
import threading
import time
from typing import Any

import numpy as np

from jdtensor._report import Reason
from jdtensor.errors import PeerFailureError
from jdtensor.heartbeat.verdicts import Decider, Outcome, Row

__all__ = ["Exchange", "Peers", "ProcessHooks"]


class Exchange:
  """What the beats run on: every client's row in, one outcome out, and a
  small shared store.

  The production one is `jdtensor.heartbeat.exchange.LinkExchange`: the rows
  meet on client 0, which decides and sends every client the outcome. By
  default (a test's exchange, which implements `all_reduce`), every client
  gets the whole sum and decides from it with its own `Decider`: the same
  beats give every client the same outcome. The store defaults to one that
  nobody else reads.

  Attributes:
    close_timeout: Seconds the teardown (`close`) may take.
  """
  close_timeout: float = 60.0
  _decider: Decider | None = None

  def open(self, decider: Decider | None = None,
           wake: Callable[[], None] | None = None) -> None:
    """Starts this client's end, with the decider of this client's beats;
    run on the heartbeat thread before the first exchange. `wake` is called
    when news (a verdict, a straggler, the agreed end) arrives for a beat
    this client did not wait for, so that it takes the news at once."""
    self._decider = decider

  def beat(self, row: Row) -> Outcome:
    """One beat: this client's row in, the beat's outcome (the same on every
    client) out. Blocks until every client's row is in."""
    decider = self._decider
    assert decider is not None, "open() first"
    merged = self.all_reduce(row.vector(decider.num_clients))
    return decider.first(merged) if row.first else decider.decide(merged)

  def all_reduce(self, row: np.ndarray) -> np.ndarray:
    """The element-wise sum of every client's `row` (every client gets the
    same)."""
    raise NotImplementedError

  def sleep_until_beat(self, wake: threading.Event, at: float, period: float) -> None:
    """Waits until the next beat's time `at` (monotonic seconds; beats come
    every `period`), or until `wake` is set (then clears it): news, the
    stop, this client's end."""
    if wake.wait(max(0.0, at - time.monotonic())):
      wake.clear()

  def ask(self, what: str, timeout: float) -> list[int] | None:
    """Where the beats are decided elsewhere: that decider's answer to
    `Decider.clients(what)`, waiting up to `timeout` s (None: no answer)."""
    return None

  def roll_call(self, beat: int, grace: float) -> set[int] | None:
    """Says "this client is in `beat`" where every client can see it, waits
    up to `grace` seconds for the others, and returns who said so (None when
    unreachable). Only an overdue beat calls it, so a beat costs no extra I/O.
    """
    return None

  def share(self, key: str, value: str) -> None:
    """Publishes a text under `key` for every client (a staller's stack)."""

  def fetch(self, key: str, timeout: float) -> str | None:
    """What some client published under `key`, waiting up to `timeout` s."""
    return None

  def joined_collective(self) -> bool:
    """Whether this client has joined a collective of the user's yet (its
    set-up is over)."""
    return True

  def close(self, timeout: float) -> bool:
    """The teardown after an agreed stop; whether it succeeded in time."""
    return True

  def clock_offset(self) -> tuple[float, float] | None:
    """Seconds to add to this client's ``time.time()`` for client 0's, and
    the measurement's residual; None when unknown."""
    return 0.0, 0.0


class Peers:
  """The other clients as the liveness links reach them (the production one
  is `jdtensor.runtime.links.Links`, which has these methods); by default,
  nobody."""

  def report(self, clients: list[int], reason: Reason) -> None:
    """Tells every other client that `clients` failed, and why."""

  def wait_peers_gone(self, timeout: float, ignore: tuple[int, ...] | list[int] = ()
                      ) -> None:
    """Client 0 waits up to `timeout` s for the other clients (but `ignore`)
    to end before it exits: its process hosts the coordination services."""

  def wait_ended(self, clients: list[int], timeout: float) -> bool:
    """Waits up to `timeout` s until the processes of the culprits `clients`
    have ended; whether they all have."""
    return True

  def announce_departure(self, code: int, why: str, failure: bool,
                         raised: bool = False) -> None:
    """Tells the others this client is leaving: with a `failure` (`raised`:
    an exception; else a non-zero exit `code`), or finished."""


class ProcessHooks:
  """How the heartbeat reads and acts on its own process. The defaults are
  the real ones, except that nobody is told: the launcher's reports and the
  failure under policy raise are `jdtensor.heartbeat.process.ClientProcess`'s."""

  def terminate(self, code: int) -> None:
    """Ends the process at once (policy terminate)."""
    os._exit(code)  # pylint: disable=protected-access

  def tell_launcher_left(self, why: str, exception: str) -> None:
    """Tells the launcher this client is leaving with a failure of its own:
    `why` as it says it, and the `exception` it raised ('' for an exit
    code)."""

  def tell_launcher_finished(self) -> None:
    """Tells the launcher this client's script ended normally."""

  def culprit_grace(self) -> float:
    """Seconds a survivor waits for the culprits' processes to end before it
    leaves (so that an engine that names the first process to fail names
    the culprit); 0 where a jdtensor launcher names the root cause."""
    return 0.0

  def tell_launcher(self, clients: list[int], reason: Reason, leaving: bool) -> None:
    """Tells the launcher whom this client blames (``JDTENSOR_REPORT_DIR``),
    and whether it is leaving because of it (policy terminate)."""

  def on_failure(self, error: PeerFailureError) -> None:
    """Receives the failure under policy raise."""

  def show_stacks(self, phase: int, where: str, stacks: str) -> None:
    """Shows where this client was when its heartbeat named a verdict: its
    main thread's `phase` and innermost frames (`where`), and every
    thread's stack, `stacks` (under `jdtensor launch`: to the launcher;
    elsewhere on stderr)."""

  def status_wanted(self) -> bool:
    """Whether someone asked for this client's status (`jdtensor status`);
    asked once a beat, so it must be cheap."""
    return False

  def publish_status(self, record: dict[str, Any]) -> None:
    """Publishes this client's status (`Heartbeat.status`)."""

  def publish_waits(self, shares: list[float], seconds: float, period: float) -> None:
    """At the agreed end: how long the others waited for each client over
    the run (percent of `seconds`, counted a beat of `period` s at a time),
    for the launcher's summary."""

  def cpu_seconds(self) -> float:
    """This process's CPU time (the busy share of each beat)."""
    return time.process_time()

  def bytes_moved(self, sockets: bool) -> int | None:
    """Bytes this process has read and written (files and pipes; with
    `sockets`, TCP too), less jdtensor's own traffic
    (`jdtensor.heartbeat.progress.ByteMeter`); None: not measured."""
    return None

  def clock(self) -> float:
    """Monotonic seconds."""
    return time.monotonic()

  # The trace of the run (`jdtensor._trace`), where one is written: the
  # heartbeat says what its main thread did, a beat at a time.
  tracing = False

  def trace_open(self, thread: str = "main thread") -> None:
    """The trace's track opens (at the heartbeat's start, so that a client
    that ends before its first beat still has one); `thread` names the
    thread its slices are of (the one the heartbeat watches)."""

  def trace_begin(self, offset: float, residual: float) -> None:
    """The beats begin, on client 0's clock (`offset`, `residual`: s)."""

  def trace_beat(self, phase: int, seconds: float, joined: bool, busy: float,
                 service_wait: bool = False) -> None:
    """One beat's sample: the main thread's phase, seconds in it, whether it
    has joined a collective yet, the process's CPU use (percent), and
    whether its wait is on the coordination service."""

  def trace_event(self, name: str, text: str) -> None:
    """A moment worth seeing (a verdict, a straggler), with its text."""

  def trace_end(self) -> None:
    """The heartbeat ends (the main thread's last slice ends now)."""
