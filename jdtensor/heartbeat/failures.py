"""What a verdict, or news of another client, means for this client: a
`Failure` (whom it blames, why, with which exit code, whether the others
must be told, how long to wait for the culprits' exits).

Pure functions of the facts: the verdict (`jdtensor.heartbeat.verdicts`)
or the event from the liveness links, this client's id and what it holds.
`jdtensor.heartbeat.protocol.Heartbeat` gathers the facts that need I/O (a
staller's stack, the roll call), calls one of these and applies the policy
to the result; the sentences come from `jdtensor.heartbeat.wording`. So who
is blamed for what is pinned as a table (tests/unit/test_heartbeat_failures.py),
without threads.

PURE: no threads, no I/O, no JAX (the floor, `verdicts` and `wording` only).
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Collection, Sequence

from jdtensor._report import Reason
from jdtensor.errors import OWN_FAILURE_EXIT_CODE, PEER_FAILURE_EXIT_CODE
from jdtensor.heartbeat import wording
from jdtensor.heartbeat.verdicts import StallTimeout, Verdict

__all__ = ["Failure", "CULPRIT_EXIT_GRACE", "REPORTED_CULPRIT_WAIT", "early_exit",
           "stalled", "every_client_waiting", "first_tokens", "out_of_sync",
           "late_for_collective", "frozen", "missed", "own_code_failed", "peer_died",
           "peer_reported", "peer_left"]

# Seconds a survivor waits, where no jdtensor launcher names the root cause
# (under mpirun, srun, by hand), for the culprits' processes to end before
# it leaves: the engine names the first process to fail, and that must be
# the culprit. A culprit that never ends (stopped) costs the run this much.
CULPRIT_EXIT_GRACE = 5.0
# The same wait where another client's report names the culprits: a dead
# culprit's end is told right after the report, but the report may be of a
# culprit that never ends (stuck, cut off), which must not hold the run.
REPORTED_CULPRIT_WAIT = 0.5


@dataclasses.dataclass(frozen=True)
class Failure:
  """A failure this client acts on (`Heartbeat._fail` applies the policy).

  Attributes:
    reason: Why, as `wording` says it.
    culprits: The clients blamed; this client's own id where it is the root
      cause.
    exit_code: `OWN_FAILURE_EXIT_CODE` where this client is the root cause,
      else `PEER_FAILURE_EXIT_CODE`.
    public: What the others are told where `reason` speaks of "this client"
      (they would read it as themselves); None: `reason` itself.
    told: Every client knows already (the same verdict at the same beat,
      another client's report, a departure): not told again (at N clients
      that would be N reports, each relayed to N clients).
    culprit_wait: Seconds to wait for the culprits' processes to end before
      leaving, where no jdtensor launcher names the root cause; only for
      culprits that end by themselves (gone, leaving, a staller).
  """
  reason: Reason
  culprits: tuple[int, ...]
  exit_code: int = PEER_FAILURE_EXIT_CODE
  public: Reason | None = None
  told: bool = False
  culprit_wait: float = 0.0

  @property
  def own(self) -> bool:
    """Whether this client is the root cause."""
    return self.exit_code != PEER_FAILURE_EXIT_CODE


def _blame(me: int, culprits: Sequence[int]) -> int:
  return OWN_FAILURE_EXIT_CODE if me in culprits else PEER_FAILURE_EXIT_CODE


# -- the beats' verdicts (every client has the same one: told=True) -------------

def early_exit(verdict: Verdict) -> Failure:
  """Clients at exit while the others wait for them in a collective."""
  return Failure(wording.early_exit(verdict.culprits, verdict.waiting),
                 tuple(verdict.culprits), told=True)


def stalled(verdict: Verdict, me: int, num_clients: int, where: str,
            stall: StallTimeout) -> Failure:
  """The staller (whose main thread is in `where`) is the root cause; it
  ends itself, so the others wait for its exit."""
  staller = verdict.culprits[0]
  waiters = [*range(staller), *range(staller + 1, num_clients)]
  return Failure(wording.stalled(staller, where, verdict.seconds, waiters,
                                 timeout=verdict.timeout, learnt=verdict.learnt,
                                 floor=stall.floor, ceiling=stall.ceiling,
                                 early=verdict.early, busy=verdict.busy,
                                 moved=verdict.moved),
                 (staller,), _blame(me, (staller,)), told=True,
                 culprit_wait=CULPRIT_EXIT_GRACE)


def every_client_waiting(me: int, num_clients: int, stall_timeout: float,
                         where: str) -> Failure:
  """Every client in a collective for the set stall time-out (a failure
  only where the user asked for one: ``JDTENSOR_STALL_KILL_ALL_WAITING``)."""
  return Failure(wording.every_client_waiting(stall_timeout, me, where),
                 tuple(range(num_clients)), told=True)


def deadlock(verdict: Verdict, num_clients: int) -> Failure:
  """Every client idle in a collective for the deadlock time-out: the run
  ends, every client named (none of them can move on)."""
  return Failure(wording.deadlock(verdict.seconds, verdict.timeout),
                 tuple(range(num_clients)), told=True)


def first_tokens(verdict: Verdict, me: int, sent: int) -> Failure:
  """The first exchange did not spread client 0's token (DTensor's check):
  client 0 names the slots without its token, the others every client."""
  tokens = list(verdict.tokens)
  if me == 0:
    bad = [c for c, token in enumerate(tokens) if token != sent]
    return Failure(wording.first_tokens_differ(sent, bad), tuple(bad))
  return Failure(wording.tokens_unequal(tokens), tuple(range(len(tokens))))


def out_of_sync(verdict: Verdict, me: int, sent: int, beat: int) -> Failure:
  """Slots without the cluster's token (`Decider` takes the token most slots
  hold, so a restarted client blames itself)."""
  held = verdict.token_of(me)
  if held != sent:  # Only this client writes its slot: the exchange is broken.
    return Failure(wording.wrong_sum(beat, me, sent, held, verdict.cluster_token),
                   (me,), OWN_FAILURE_EXIT_CODE)
  if me in verdict.culprits:
    return Failure(wording.out_of_sync_here(me, sent, verdict.cluster_token, beat),
                   (me,), OWN_FAILURE_EXIT_CODE)
  return Failure(wording.out_of_sync(verdict.culprits, verdict.tokens,
                                     verdict.cluster_token, beat),
                 tuple(verdict.culprits), told=True)


# -- what this client finds itself ----------------------------------------------

def late_for_collective(me: int, unjoined: Sequence[int] | None,
                        waited: float) -> Failure | None:
  """This client's collective gave up after `waited` s setting up: the
  clients still in their set-up (`unjoined`, from the last beat) are the
  cause; None when there are none but this one."""
  late = [c for c in unjoined or () if c != me]
  return Failure(wording.late_for_collective(late, waited), tuple(late)) if late else None


def frozen(me: int, seconds: float, stuck_timeout: float) -> Failure | None:
  """This client did not run for `seconds`: its own failure past the stuck
  time-out (the others count it as stuck); None within it."""
  if seconds < stuck_timeout:
    return None
  own, public = wording.frozen(me, seconds, stuck_timeout)
  return Failure(own, (me,), OWN_FAILURE_EXIT_CODE, public=public)


def missed(me: int, num_clients: int, beat: int, waited: float, detail: str,
           present: Collection[int] | None, age: float,
           departed: Collection[int]) -> Failure:
  """Beat `beat` did not complete within `waited` s; `present`: who answered
  the roll call (None: client 0's service unreachable); `age`: seconds since
  the last beat; `departed`: clients that ended their script normally."""
  others = [c for c in range(num_clients) if c != me]
  if present is None:
    return Failure(wording.beat_not_completed(beat, waited, detail,
                                              service_unreachable=True), (0,))
  gone = [c for c in others if c not in present]
  if not gone:
    return Failure(wording.beat_not_completed(beat, waited, detail), tuple(others))
  return Failure(wording.beat_not_completed(
      beat, waited, detail, missing=gone, age=age,
      finished=[c for c in gone if c in departed]), tuple(gone))


def own_code_failed(me: int, error: BaseException) -> Failure:
  """The heartbeat's own code raised: this client's failure, with its
  traceback (the others are told without it)."""
  trace = "".join(traceback.format_exception(error)).rstrip()
  own, public = wording.own_code_failed(me, error, trace)
  return Failure(own, (me,), OWN_FAILURE_EXIT_CODE, public=public)


# -- what the liveness links tell -----------------------------------------------

def peer_died(client: int, how: str, beat: int | None, age: float) -> Failure:
  """`client`'s process ended without a goodbye; `beat`: the beat it missed
  (None where the heartbeat runs on the links alone); `age`: seconds since
  the last beat."""
  if beat is None:
    return Failure(wording.gone(client, how), (client,))
  return Failure(wording.missed_beat(client, beat, age, how), (client,),
                 culprit_wait=CULPRIT_EXIT_GRACE)


def peer_reported(me: int, clients: Sequence[int], reason: Reason) -> Failure:
  """Another client (`reason.reporter`) found `clients` failed; a client
  named itself is the root cause."""
  return Failure(reason, tuple(clients), _blame(me, clients), told=True,
                 culprit_wait=REPORTED_CULPRIT_WAIT)


def peer_left(client: int, why: str, raised: bool, still_running: bool) -> Failure:
  """`client` announced it leaves with a failure (`raised`: an exception;
  else a non-zero exit code); it is on its way out."""
  return Failure(wording.left(client, why, raised, still_running), (client,),
                 told=True, culprit_wait=CULPRIT_EXIT_GRACE)
