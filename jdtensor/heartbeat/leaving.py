"""How a client leaves a run: the one way out, for its script's end and for a
verdict.

Two callers, one path down the floors:

* the exit guard (`jdtensor.heartbeat.departure.ExitGuard`, Python's exit
  hooks) calls `WayOut.blame_peer` with a failure, then `WayOut.leave`;
* the heartbeat's thread, under policy "terminate", calls `wait_to_leave`
  before it ends the process (`jdtensor.heartbeat.protocol.Heartbeat`).

Both end in `wait_to_leave`: the culprits' processes end first where an
engine names the first process to fail (the failure's culprit grace, asked of
the heartbeat, which asked the failure), and client 0, which hosts the
coordination services, leaves last.

**Leaving is announced**: an unhandled exception or a non-zero ``sys.exit``
is told to every client at once over the liveness links (and to the
launcher); a normal end waits, still beating, for every client to end (the
agreed end), and is named "exited (code 0) while the others were still
running" if they wait for it in a collective. If JAX's shutdown barrier
cannot succeed, it is not entered (no C++ abort on the way out).

No JAX, no runtime: what the way out needs of the heartbeat is
`LeavingHeartbeat`, of the other clients `Peers`, of the process
`ProcessHooks`; `jdtensor.heartbeat` wires the real ones.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from jdtensor import _logging as logging
from jdtensor.errors import PEER_FAILURE_EXIT_CODE, PeerFailureError
from jdtensor.heartbeat.departure import Departure
from jdtensor.heartbeat.interfaces import Peers, ProcessHooks

__all__ = ["WayOut", "LeavingHeartbeat", "wait_to_leave", "wait_for_the_agreed_end",
           "HOST_EXIT_WAIT", "ROLL_CALL_GRACE"]

# Seconds client 0, which hosts the coordination services, waits for the
# other clients' processes to end before its own exit (their JAX clients
# abort the moment the service is gone).
HOST_EXIT_WAIT = 5.0
# Seconds an overdue beat's roll call waits for the healthy clients to answer
# (they are blocked in the same beat, and their deadlines expire together).
ROLL_CALL_GRACE = 1.0


def wait_to_leave(peers: Peers, me: int, culprits: Sequence[int], culprit_grace: float,
                  spare: Sequence[int] = ()) -> None:
  """Waits, bounded, until this client's process may end with a failure.

  Args:
    peers: The other clients (the liveness links).
    me: This client's id.
    culprits: The clients this client leaves because of (empty for a failure
      of its own): their processes end first, within `culprit_grace` s, so
      that an engine that names the first process to fail (mpirun, srun)
      names a culprit.
    culprit_grace: Seconds for that (0 where a jdtensor launcher names the
      root cause).
    spare: Clients client 0 does not wait for (a culprit that may never end:
      stalled, stopped).
  """
  if culprits and culprit_grace > 0:
    peers.wait_ended(list(culprits), culprit_grace)
  if me == 0:
    # Client 0 hosts the coordination service: ending it now would abort
    # clients still on their own way out inside JAX (a C++ fatal error)
    # before their exit code and reason are out. Bounded: a client that does
    # not leave is ended by JAX when the service goes.
    peers.wait_peers_gone(HOST_EXIT_WAIT, list(spare))


class LeavingHeartbeat(Protocol):
  """What the way out reads of this client's heartbeat
  (`jdtensor.heartbeat.protocol.Heartbeat`)."""
  period: float
  stopped: threading.Event
  said: threading.Event

  @property
  def failure(self) -> PeerFailureError | None: ...
  @property
  def terminating(self) -> bool: ...
  @property
  def script_ended(self) -> bool: ...
  @property
  def culprit_grace(self) -> float: ...
  @property
  def closed_cleanly(self) -> bool | None: ...
  def abandon(self) -> PeerFailureError | None: ...
  def finish(self) -> None: ...
  def late_for_collective(self, waited: float) -> None: ...
  def clients(self, what: str) -> list[int] | None: ...
  def running(self) -> bool: ...


def wait_for_the_agreed_end(hb: LeavingHeartbeat, patience: float, me: int) -> bool:
  """Waits until the heartbeat has ended (the agreed end and its teardown, or
  a verdict); False if its thread is gone without ending it.

  Late is not dead: a client that finishes long after the others (a final
  save) is waited for as long as it is alive and beating; past `patience`
  (the shutdown time-out) this client says once whom it waits for.
  """
  if hb.stopped.wait(patience):
    return True
  others = [c for c in hb.clients("running") or () if c != me]
  logging.warning("jdtensor: client %d ended its script; waiting for client%s %s, "
                  "still running and beating, to end theirs.", me,
                  "s" if len(others) != 1 else "", ", ".join(map(str, others)) or "?")
  while not hb.stopped.wait(hb.period):
    # The thread sets `stopped` before it ends: one that ended between the
    # wait and this check has ended the heartbeat (a client that took this
    # for a lost heartbeat would skip JAX's shutdown barrier, and the others'
    # barrier would abort them).
    if not hb.running() and not hb.stopped.is_set():
      return False
  return True


def _others(failure: PeerFailureError | None, me: int) -> list[int]:
  return [] if failure is None else [c for c in failure.client_ids if c != me]


@dataclass
class WayOut:
  """This client's way out of a multi-client run (the exit guard's
  `blame_peer` and `on_leave`).

  Attributes:
    client_id: This client's id (-1 outside a cluster).
    heartbeat: This client's heartbeat, None where it does not run; read at
      exit, as it may start after the guard is installed.
    peers: The other clients (the liveness links).
    process: This process (the launcher's reports).
    shutdown_timeout: Seconds a client that ended its script waits for the
      others before it says whom it waits for.
    no_peer_failure: Without a heartbeat: whether no failure of another
      client is recorded (then JAX's shutdown barrier can succeed).
  """
  client_id: int = -1
  heartbeat: Callable[[], LeavingHeartbeat | None] = lambda: None
  peers: Peers = field(default_factory=Peers)
  process: ProcessHooks = field(default_factory=ProcessHooks)
  shutdown_timeout: float = 300.0
  no_peer_failure: Callable[[], bool] = lambda: True

  def blame_peer(self, departure: Departure) -> Departure:
    """Decides whether the failed `departure` is this client's own or a
    consequence of another client that the heartbeat has named.

    A collective's error about a connection to another client that went away
    (``peer_lost``) first waits briefly for the heartbeat to name that client
    (the liveness links see a process end at once; a missed beat takes up to
    two periods). Any other failure only checks whether a verdict under
    "terminate" came first: its thread is then already ending this process
    (code 75), and this client leaves as its consequence.

    The decision is taken with the heartbeat's own (`abandon`): a verdict
    that comes after it is not acted on, so the process never both announces
    its own failure and ends on someone else's.

    Returns:
      A consequence departure (code 75) naming the verdict, or `departure`
      unchanged when the failure is this client's own.
    """
    hb = self.heartbeat()
    if hb is None or hb.script_ended:
      return departure
    if departure.peer_lost:
      if departure.join_wait is not None:
        # Nobody else can name a client that never reached the collective:
        # it is alive and beating. Every waiter names it from the same beats.
        hb.late_for_collective(departure.join_wait)
      hb.stopped.wait(min(2 * hb.period + ROLL_CALL_GRACE, HOST_EXIT_WAIT))
    failure = hb.abandon()
    if not _others(failure, self.client_id) or not (departure.peer_lost or hb.terminating):
      return departure
    return Departure(PEER_FAILURE_EXIT_CODE, f"{departure.why}, after {failure}", True,
                     peer_lost=departure.peer_lost, consequence=True)

  def leave(self, departure: Departure) -> bool:
    """This client's way out (the exit handler calls it).

    A failure is announced to every client at once and nothing collective is
    attempted. A normal end beats "at exit" until every client has ended (the
    agreed end, then the exchange's teardown), bounded by the shutdown
    time-out.

    Returns:
      Whether JAX's own shutdown barrier can still succeed.
    """
    if departure.failed:
      self._leave_with_a_failure(departure)
      return False
    me, hb = self.client_id, self.heartbeat()
    self.peers.announce_departure(0, departure.why, False)
    self.process.tell_launcher_finished()
    if hb is None:
      return self.no_peer_failure()
    if hb.failure is None and not hb.stopped.is_set():
      hb.finish()
      if not wait_for_the_agreed_end(hb, self.shutdown_timeout, me):
        return False
    return hb.failure is None and hb.closed_cleanly is not False

  def _leave_with_a_failure(self, departure: Departure) -> None:
    me, hb = self.client_id, self.heartbeat()
    if hb is not None:
      hb.abandon()
    culprits: list[int] = []
    if departure.consequence:
      # The heartbeat has told everyone (and the launcher) whom it blames;
      # under "terminate" it says so here too: each thing is said once. Its
      # verdict may be on its way out on another thread (the links'), which
      # this exit would cut short: wait for the line, or say it here.
      if hb is None or not hb.terminating or not hb.said.wait(HOST_EXIT_WAIT):
        sys.stderr.write(f"jdtensor: client {me} {departure.why}\n")
      culprits = [] if hb is None else _others(hb.failure, me)
    else:
      self.peers.announce_departure(departure.code, departure.why, True,
                                    raised=bool(departure.exception))
      self.process.tell_launcher_left(departure.why, departure.exception)
      sys.stderr.write(f"jdtensor: client {me} {departure.why}; the other clients "
                       "have been told.\n")
    sys.stderr.flush()
    wait_to_leave(self.peers, me, culprits, 0.0 if hb is None else hb.culprit_grace)
