"""What each verdict and each peer's news means for one client, as a table:
whom it blames, with which exit code, whether the others must be told, how
long it waits for the culprits' exits, and what the others read where it
blames itself. The sentences themselves are pinned in
test_heartbeat_wording.py; here they are checked where a fact (a token, a
beat, who is "this client") could reach the wrong place."""

import pytest

from jdtensor._report import Reason
from jdtensor.errors import OWN_FAILURE_EXIT_CODE as OWN
from jdtensor.errors import PEER_FAILURE_EXIT_CODE as PEER
from jdtensor.heartbeat import failures, wording
from jdtensor.heartbeat.verdicts import (EARLY_EXIT, FIRST_TOKENS,
                                         OUT_OF_SYNC, STALLED, StallTimeout, Verdict)

STALL = Verdict(STALLED, (1,), seconds=301, timeout=300.0)
LEARNT = Verdict(STALLED, (1,), seconds=35, timeout=30.0, learnt=0.8)
RESTARTED = Verdict(OUT_OF_SYNC, (2,), tokens=(9,), cluster_token=7)
BROKEN_SUM = Verdict(OUT_OF_SYNC, (2,), tokens=(4242,), cluster_token=12927)
FIRST = Verdict(FIRST_TOKENS, (), tokens=(7, 7, 9))
ERROR = ValueError("a bug")
CRASH = "its process ended without saying goodbye"

# (case, the Failure, culprits, exit code, told, culprit wait, what it says).
CASES = [
    ("early exit", failures.early_exit(Verdict(EARLY_EXIT, (1, 3), waiting=(0, 2))),
     (1, 3), PEER, True, 0.0,
     "clients 1, 3 exited (code 0) while the others were still running (clients "
     "0, 2 wait in a collective)"),
    ("stalled, seen by another", failures.stalled(STALL, 0, 3, "main thread in data.py:88 next",
                                                  StallTimeout(300.0)),
     (1,), PEER, True, failures.CULPRIT_EXIT_GRACE,
     "client 1 stalled: main thread in data.py:88 next for 301 s, idle (0% of a core, 0 B/s "
     "read or written), while clients 0, 2 "
     "wait in a collective"),
    ("stalled, the staller itself", failures.stalled(STALL, 1, 3, "main thread in data.py:88 next",
                                                     StallTimeout(300.0)),
     (1,), OWN, True, failures.CULPRIT_EXIT_GRACE,
     "client 1 stalled: main thread in data.py:88 next for 301 s, idle (0% of a core, 0 B/s "
     "read or written), while clients 0, 2 "
     "wait in a collective"),
    ("stalled, learnt", failures.stalled(LEARNT, 0, 2, "main thread in t.py:5 f",
                                         StallTimeout(300.0, 30.0, True)),
     (1,), PEER, True, failures.CULPRIT_EXIT_GRACE,
     wording.stalled(1, "main thread in t.py:5 f", 35, [0], timeout=30.0, learnt=0.8, floor=30.0,
                     ceiling=300.0).detail),
    ("every client waiting", failures.every_client_waiting(1, 3, 300.0, "main thread in t.py:5 g"),
     (0, 1, 2), PEER, True, 0.0,
     "every client has waited in a collective for 300 s or more: a long computation, "
     "or a deadlock (clients that issued different collectives); this client (1): "
     "main thread in t.py:5 g"),
    ("first tokens, client 0", failures.first_tokens(FIRST, 0, 7),
     (2,), PEER, False, 0.0, "Merged heartbeat signal has value != 7 (clients 2)"),
    ("first tokens, another client", failures.first_tokens(FIRST, 1, 0),
     (0, 1, 2), PEER, False, 0.0, "Merged heartbeat signal has unequal elements [7, 7, 9]"),
    ("out of sync, the others restarted", failures.out_of_sync(RESTARTED, 0, 7, 5),
     (2,), PEER, True, 0.0,
     "client 2 sent token 9 instead of 7 in beat 5 (restarted or out of sync)"),
    ("out of sync, this client restarted", failures.out_of_sync(RESTARTED, 2, 9, 5),
     (2,), OWN, False, 0.0,
     "this client (2) is out of sync: it sent token 9, the cluster's is 7 in beat 5"),
    # A slot only its owner writes came back wrong: the exchange is broken,
    # never "it sent token 12927, the cluster's is 12927".
    ("a wrong sum", failures.out_of_sync(BROKEN_SUM, 2, 12927, 5),
     (2,), OWN, False, 0.0,
     "beat 5 returned a wrong sum: this client (2) sent token 12927 but its slot "
     "holds 4242 (the cluster's token: 12927)"),
    ("late for the first collective", failures.late_for_collective(0, [0, 3], 30.0),
     (3,), PEER, False, 0.0, wording.late_for_collective([3], 30.0).detail),
    ("missed, service unreachable", failures.missed(1, 3, 4, 60.0, "", None, 2.0, {}),
     (0,), PEER, False, 0.0,
     "beat 4 did not complete within 60 s; the heartbeat's coordination service "
     "(client 0) is unreachable"),
    ("missed, every client present", failures.missed(1, 3, 4, 60.0, "", {0, 1, 2}, 2.0,
                                                     {}),
     (0, 2), PEER, False, 0.0,
     "beat 4 did not complete within 60 s although every client started it"),
    ("missed, one absent after its script ended",
     failures.missed(0, 3, 4, 60.0, " (the beat failed: EOF)", {0, 1}, 3.2, {2: 1.0}),
     (2,), PEER, False, 0.0,
     "client 2 missed beat 4 (last seen 3.2 s ago); client 2 had ended its script and "
     "left after waiting for the others (the beat failed: EOF)"),
    ("a peer died, links only", failures.peer_died(2, CRASH, None, 0.0),
     (2,), PEER, False, 0.0, f"client 2 is gone ({CRASH})"),
    ("a peer died while beating", failures.peer_died(2, CRASH, 5, 3.2),
     (2,), PEER, False, failures.CULPRIT_EXIT_GRACE,
     f"client 2 missed beat 5 (last seen 3.2 s ago; {CRASH})"),
    ("a report of another", failures.peer_reported(0, [2], Reason("client 2 x", (2,), 1)),
     (2,), PEER, True, failures.REPORTED_CULPRIT_WAIT, "client 2 x"),
    ("a report of this client", failures.peer_reported(2, [2], Reason("client 2 x", (2,), 1)),
     (2,), OWN, True, failures.REPORTED_CULPRIT_WAIT, "client 2 x"),
    ("left with an exception", failures.peer_left(1, "failed: E: x (t.py:3 in f)", True,
                                                  True),
     (1,), PEER, True, failures.CULPRIT_EXIT_GRACE, "client 1 failed: E: x (t.py:3 in f)"),
    ("left with an exit code, early", failures.peer_left(1, "exited (code 3)", False, True),
     (1,), PEER, True, failures.CULPRIT_EXIT_GRACE,
     "client 1 exited (code 3) while the others were still running"),
    ("left with an exit code, after this client finished",
     failures.peer_left(1, "exited (code 3)", False, False),
     (1,), PEER, True, failures.CULPRIT_EXIT_GRACE, "client 1 exited (code 3)"),
]


@pytest.mark.parametrize("case,failure,culprits,code,told,wait,detail", CASES,
                         ids=[c[0] for c in CASES])
def test_whom_a_client_blames_and_how_it_leaves(case, failure, culprits, code, told, wait,
                                                detail):
  assert failure.culprits == culprits
  assert failure.exit_code == code and failure.own == (code == OWN)
  assert failure.told is told
  assert failure.culprit_wait == wait
  assert failure.reason.detail == detail
  assert failure.public is None  # The others may read these as they are.


@pytest.mark.parametrize("failure,detail,public", [
    (failures.frozen(1, 10.0, 3.0),
     "this client (1) did not run for 10.0 s (stopped, swapped out, or its GIL held by C "
     "code), longer than the stuck time-out (3 s); the others count it as stuck",
     Reason("client 1 did not run for 10.0 s (stopped, swapped out, or its GIL held by "
            "C code), longer than the stuck time-out (3 s)", (1,))),
    (failures.own_code_failed(1, ERROR), None,
     Reason("client 1's heartbeat failed in its own code: ValueError: a bug", (1,))),
], ids=["frozen", "own code failed"])
def test_a_client_that_blames_itself_tells_the_others_in_their_words(failure, detail,
                                                                     public):
  assert failure.culprits == (1,) and failure.exit_code == OWN and not failure.told
  assert failure.public == public
  if detail is not None:
    assert failure.reason.detail == detail
  else:  # Its own line carries the traceback; the others' does not.
    assert failure.reason.detail.startswith(
        "this client's (1) heartbeat failed in its own code: ValueError: a bug\n")


@pytest.mark.parametrize("failure", [
    failures.frozen(1, 2.9, 3.0),  # Within the stuck time-out: a warning only.
    failures.late_for_collective(3, [3], 30.0),  # Only this client was late.
    failures.late_for_collective(3, None, 30.0),  # The decider did not answer.
], ids=["frozen-within", "late-only-itself", "late-no-answer"])
def test_no_failure(failure):
  assert failure is None

