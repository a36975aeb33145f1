"""What each heartbeat verdict says, for people: pure functions from a
verdict's facts to its `Reason` (the sentence, and the clients it begins
with). `protocol.Heartbeat` decides when a verdict is reached and what
follows; these say it, so that every message is pinned as a table
(tests/unit/test_heartbeat_wording.py) and none is ever parsed back.

PURE: no threads, no I/O, no JAX (the floor and `verdicts` only).
"""

from __future__ import annotations

from collections.abc import Sequence

from jdtensor._ids import LISTED, ids_text
from jdtensor._report import Reason, rate_text
from jdtensor.heartbeat.verdicts import STALL_SAFETY_FACTOR

__all__ = ["names", "early_exit", "stalled", "every_client_waiting", "wrong_sum",
           "out_of_sync_here", "out_of_sync", "late_for_collective", "frozen", "paused",
           "own_code_failed", "gone", "missed_beat", "beat_not_completed",
           "first_tokens_differ", "tokens_unequal", "left", "straggler",
           "consequence"]


def names(clients: Sequence[int]) -> str:
  """``client 3`` or ``clients 0, 2, 3``; a long list as runs (``clients
  0, 2-4095``), so that a message stays a line at any scale."""
  return f"client{'s' if len(clients) > 1 else ''} {ids_text(list(clients))}"


def _verb(clients: Sequence[int], one: str, several: str) -> str:
  return several if len(clients) > 1 else one


def early_exit(gone_: Sequence[int], waiting: Sequence[int]) -> Reason:
  """Clients at exit while the others wait for them in a collective."""
  return Reason(f"{names(gone_)} exited (code 0) while the others were still "
                f"running ({names(waiting)} {_verb(waiting, 'waits', 'wait')} in a "
                "collective)", tuple(gone_))


def stalled(staller: int, where: str, seconds: int, waiters: Sequence[int], *,
            timeout: float = 0.0, learnt: float | None = None, floor: float = 0.0,
            ceiling: float = 0.0, early: bool = False, busy: int = 0,
            moved: int = 0) -> Reason:
  """A client running its own code, idle (`busy`: percent of a core,
  `moved`: bytes a second), while every other waits in a collective; which
  rule set the time-out: learnt (`learnt`: the longest pause it was learnt
  from), the ceiling because the pause began before the run had shown its
  rhythm (`early`), or the set time-out (neither: learning off)."""
  how = ""
  if learnt is not None:
    how = (f" (stall time-out {timeout:g} s, learnt from this run: "
           f"{STALL_SAFETY_FACTOR:g} x its longest idle pause, {learnt:g} s, "
           f"at least {floor:g} s; JDTENSOR_STALL_TIMEOUT {ceiling:g} s is the "
           "ceiling, JDTENSOR_STALL_LEARN=false turns learning off)")
  elif early:
    how = (f" (stall time-out {timeout:g} s, JDTENSOR_STALL_TIMEOUT: the pause began "
           "before the run had shown its rhythm, so no learnt time-out applied)")
  return Reason(f"client {staller} stalled: {where} for {seconds} s, "
                f"idle ({busy}% of a core, {rate_text(moved)} read or written), while "
                f"{names(waiters)} {_verb(waiters, 'waits', 'wait')} in a "
                f"collective{how}", (staller,))


def every_client_waiting(stall_timeout: float, me: int, where: str) -> Reason:
  """Every client in a collective for the stall time-out."""
  return Reason(f"every client has waited in a collective for {int(stall_timeout)} s "
                "or more: a long computation, or a deadlock (clients that issued "
                f"different collectives); this client ({me}): {where}")


def deadlock(seconds: int, timeout: float) -> Reason:
  """Every client idle in a collective for the deadlock time-out (where each
  waits: the stacks shown under the verdict)."""
  return Reason(f"every client has waited in a collective for {seconds} s with its "
                "process idle: a deadlock (clients that issued different collectives, "
                "or a collective one of them never reaches); the run ends after "
                f"JDTENSOR_DEADLOCK_TIMEOUT ({timeout:g} s; 0 only warns)")


def wrong_sum(beat: int, me: int, sent: int, held: int, cluster_token: int) -> Reason:
  """This client's own slot came back without what it sent."""
  return Reason(f"beat {beat} returned a wrong sum: this client ({me}) sent token "
                f"{sent} but its slot holds {held} (the cluster's token: "
                f"{cluster_token})")


def out_of_sync_here(me: int, sent: int, cluster_token: int, beat: int) -> Reason:
  """This client's token is not the cluster's (it restarted)."""
  return Reason(f"this client ({me}) is out of sync: it sent token {sent}, the "
                f"cluster's is {cluster_token} in beat {beat}")


def out_of_sync(wrong: Sequence[int], tokens: Sequence[int], cluster_token: int,
                beat: int) -> Reason:
  """Other clients' tokens are not the cluster's (restarted)."""
  sent = ", ".join(str(t) for t in tokens[:LISTED])
  if len(wrong) > LISTED:
    sent += ", ..."
  return Reason(f"{names(wrong)} sent token {sent} instead of {cluster_token} in "
                f"beat {beat} (restarted or out of sync)", tuple(wrong))


def late_for_collective(late: Sequence[int], waited: float) -> Reason:
  """Clients still in set-up when the others' first collective gave up."""
  several = len(late) > 1
  return Reason(
      f"{names(late)} did not join the collective the others waited in within "
      f"JAX's {waited:.0f} s communicator set-up time (not configurable); "
      f"{'they were' if several else 'it was'} still in set-up, before "
      f"{'their' if several else 'its'} first collective. If a set-up is slow by "
      "design (loading data, compiling on one client), end it with a barrier "
      "(jdtensor.barrier, multihost_utils.sync_global_devices) so that every client "
      "enters the first collective together", tuple(late))


def frozen(me: int, seconds: float, stuck_timeout: float) -> tuple[Reason, Reason]:
  """This client did not run for longer than the stuck time-out: what it
  says, and what the others are told (their "this client" is not it)."""
  what = (f"did not run for {seconds:.1f} s (stopped, swapped out, or its GIL held "
          f"by C code), longer than the stuck time-out ({stuck_timeout:g} s)")
  return (Reason(f"this client ({me}) {what}; the others count it as stuck"),
          Reason(f"client {me} {what}", (me,)))


def paused(me: int, seconds: float, stuck_timeout: float) -> str:
  """The warning (never a verdict) that this client did not run for a while,
  within the stuck time-out."""
  return (f"heartbeat: this client ({me}) did not run for {seconds:.1f} s (within "
          f"the stuck time-out, {stuck_timeout:g} s)")


def own_code_failed(me: int, error: BaseException, trace: str) -> tuple[Reason, Reason]:
  """The heartbeat's own code raised: what this client says (with the
  traceback), and what the others are told."""
  what = f"heartbeat failed in its own code: {type(error).__name__}: {error}"
  return (Reason(f"this client's ({me}) {what}\n{trace}\n"),
          Reason(f"client {me}'s {what}", (me,)))


def gone(client: int, how: str) -> Reason:
  """A linked process ended (no beats to speak of)."""
  return Reason(f"client {client} is gone ({how})", (client,))


def missed_beat(client: int, beat: int, age: float, how: str) -> Reason:
  """A linked process ended while the heartbeat beat."""
  return Reason(f"client {client} missed beat {beat} (last seen {age:.1f} s ago; "
                f"{how})", (client,))


def beat_not_completed(beat: int, waited: float, detail: str, *,
                       service_unreachable: bool = False,
                       missing: Sequence[int] = (), age: float = 0.0,
                       finished: Sequence[int] = ()) -> Reason:
  """A beat not done within `waited` s, after the roll call: client 0's
  service unreachable, every client present (the beat itself is broken),
  or `missing` clients (`finished`: those of them that had ended their
  script). `detail`: what the exchange said, as `` (...)``."""
  if service_unreachable:
    return Reason(f"beat {beat} did not complete within {waited:g} s{detail}; the "
                  "heartbeat's coordination service (client 0) is unreachable")
  if not missing:
    return Reason(f"beat {beat} did not complete within {waited:g} s although every "
                  f"client started it{detail}")
  if beat == 0:
    text = f"{names(missing)} did not start the heartbeat within {waited:g} s"
  else:
    text = f"{names(missing)} missed beat {beat} (last seen {age:.1f} s ago)"
    if finished:
      text += (f"; {names(finished)} had ended {_verb(finished, 'its', 'their')} "
               "script and left after waiting for the others")
  return Reason(f"{text}{detail}", tuple(missing))


def first_tokens_differ(token: int, bad: Sequence[int]) -> Reason:
  """Client 0's first exchange: slots without its token (DTensor's words)."""
  return Reason(f"Merged heartbeat signal has value != {token} "
                f"(clients {', '.join(map(str, bad))})")


def tokens_unequal(tokens: Sequence[int]) -> Reason:
  """Another client's first exchange: unequal slots (DTensor's words)."""
  return Reason(f"Merged heartbeat signal has unequal elements {list(tokens)}")


def left(client: int, why: str, raised: bool, still_running: bool) -> Reason:
  """A client announced it leaves with a failure: `why` as it said it; an
  exit code (not `raised`) while this client still runs is early."""
  if not raised and still_running:
    why += " while the others were still running"
  return Reason(f"client {client} {why}", (client,))


def straggler(client: int, share: float, window: float) -> str:
  """The warning (never a verdict) that the others wait for `client`."""
  return (f"heartbeat: client {client} is a straggler: the others waited for it "
          f"{share:.0f}% of the last {window:g} s")


def consequence(finished: bool, policy: str) -> str:
  """What this client does about a failure: the end of its line."""
  if finished:
    return "this client had already finished"
  return {"terminate": "stopping this client",
          "raise": "raising PeerFailureError at the next jdtensor call",
          "log": "carrying on (policy 'log')"}[policy]
