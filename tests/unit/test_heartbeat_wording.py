"""Every verdict's words (`jdtensor.heartbeat.wording`), as a table: the
sentence people read and the clients it begins with (the launcher's summary
names a root cause by that, never by reading the sentence)."""

import pytest

from jdtensor._report import Reason
from jdtensor.heartbeat import wording

CASES = [
    ("early exit", wording.early_exit([1], [0, 2, 3]), Reason(
        "client 1 exited (code 0) while the others were still running (clients 0, 2, 3 "
        "wait in a collective)", (1,))),
    ("early exit, one waiter", wording.early_exit([1, 2], [0]), Reason(
        "clients 1, 2 exited (code 0) while the others were still running (client 0 "
        "waits in a collective)", (1, 2))),
    ("stalled", wording.stalled(2, "main thread in data.py:88 next_batch", 4, [0, 1, 3]), Reason(
        "client 2 stalled: main thread in data.py:88 next_batch for 4 s, idle (0% of a "
        "core, 0 B/s read or written), while clients 0, 1, 3 wait in a collective",
        (2,))),
    ("stalled, learnt", wording.stalled(1, "main thread in t.py:5 f", 61, [0], timeout=60.0, learnt=0.5,
                                        floor=60.0, ceiling=300.0, busy=2, moved=3000),
     Reason("client 1 stalled: main thread in t.py:5 f for 61 s, idle (2% of a core, "
            "2.9 KiB/s read or written), while client 0 waits in a collective (stall "
            "time-out 60 s, learnt from this run: 5 x its longest idle pause, 0.5 s, at "
            "least 60 s; JDTENSOR_STALL_TIMEOUT 300 s is the ceiling, "
            "JDTENSOR_STALL_LEARN=false turns learning off)", (1,))),
    ("stalled before the rhythm", wording.stalled(1, "main thread in t.py:5 f", 300, [0, 2],
                                                  timeout=300.0, early=True),
     Reason("client 1 stalled: main thread in t.py:5 f for 300 s, idle (0% of a core, "
            "0 B/s read or written), while clients 0, 2 wait in a collective (stall "
            "time-out 300 s, JDTENSOR_STALL_TIMEOUT: the pause began before the run had "
            "shown its rhythm, so no learnt time-out applied)", (1,))),
    ("stalled on a worker thread", wording.stalled(
        2, "thread 'TrainingThread' in train.py:12 loop", 9, [0, 1]), Reason(
        "client 2 stalled: thread 'TrainingThread' in train.py:12 loop for 9 s, idle (0% "
        "of a core, 0 B/s read or written), while clients 0, 1 wait in a collective",
        (2,))),
    ("every client waiting", wording.every_client_waiting(300.0, 1, "main thread in train.py:9 step"),
     Reason("every client has waited in a collective for 300 s or more: a long "
            "computation, or a deadlock (clients that issued different collectives); "
            "this client (1): main thread in train.py:9 step")),
    ("deadlock", wording.deadlock(601, 600.0), Reason(
        "every client has waited in a collective for 601 s with its process idle: a "
        "deadlock (clients that issued different collectives, or a collective one of "
        "them never reaches); the run ends after JDTENSOR_DEADLOCK_TIMEOUT (600 s; 0 "
        "only warns)")),
    ("wrong sum", wording.wrong_sum(7, 1, 40, 41, 40), Reason(
        "beat 7 returned a wrong sum: this client (1) sent token 40 but its slot holds "
        "41 (the cluster's token: 40)")),
    ("out of sync here", wording.out_of_sync_here(1, 12, 40, 7), Reason(
        "this client (1) is out of sync: it sent token 12, the cluster's is 40 in beat 7")),
    ("out of sync", wording.out_of_sync(list(range(1, 11)), list(range(10)), 40, 7),
     Reason("clients 1-10 sent token 0, 1, 2, 3, 4, 5, 6, 7, ... instead of 40 in beat 7 "
            "(restarted or out of sync)", tuple(range(1, 11)))),
    ("late", wording.late_for_collective([3], 30.0), Reason(
        "client 3 did not join the collective the others waited in within JAX's 30 s "
        "communicator set-up time (not configurable); it was still in set-up, before "
        "its first collective. If a set-up is slow by design (loading data, compiling "
        "on one client), end it with a barrier (jdtensor.barrier, "
        "multihost_utils.sync_global_devices) so that every client enters the first "
        "collective together", (3,))),
    ("gone", wording.gone(2, "its link closed"), Reason(
        "client 2 is gone (its link closed)", (2,))),
    ("missed beat", wording.missed_beat(2, 9, 8.06, "its link closed"), Reason(
        "client 2 missed beat 9 (last seen 8.1 s ago; its link closed)", (2,))),
    ("service unreachable", wording.beat_not_completed(4, 8.0, "", service_unreachable=True),
     Reason("beat 4 did not complete within 8 s; the heartbeat's coordination service "
            "(client 0) is unreachable")),
    ("every client started", wording.beat_not_completed(4, 8.0, " (the beat failed: x)"),
     Reason("beat 4 did not complete within 8 s although every client started it (the "
            "beat failed: x)")),
    ("never started", wording.beat_not_completed(0, 38.0, "", missing=[2]), Reason(
        "client 2 did not start the heartbeat within 38 s", (2,))),
    ("missed, some finished", wording.beat_not_completed(
        9, 8.0, "", missing=[1, 2], age=8.04, finished=[2]), Reason(
        "clients 1, 2 missed beat 9 (last seen 8.0 s ago); client 2 had ended its "
        "script and left after waiting for the others", (1, 2))),
    ("left with an exception", wording.left(1, "failed: ZeroDivisionError: x", True, True),
     Reason("client 1 failed: ZeroDivisionError: x", (1,))),
    ("left with a code", wording.left(1, "exited (code 3)", False, True), Reason(
        "client 1 exited (code 3) while the others were still running", (1,))),
    ("left with a code, after us", wording.left(1, "exited (code 3)", False, False),
     Reason("client 1 exited (code 3)", (1,))),
    ("first tokens", wording.first_tokens_differ(40, [2, 3]), Reason(
        "Merged heartbeat signal has value != 40 (clients 2, 3)")),
    ("unequal tokens", wording.tokens_unequal([40, 41]), Reason(
        "Merged heartbeat signal has unequal elements [40, 41]")),
]


@pytest.mark.parametrize("said, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_verdict_says_what_happened_and_whom_it_names_first(said, expected):
  assert said == expected


def test_a_client_s_own_verdicts_are_told_to_the_others_in_their_words():
  own, public = wording.frozen(2, 9.04, 3.0)
  assert own == Reason("this client (2) did not run for 9.0 s (stopped, swapped out, or "
                       "its GIL held by C code), longer than the stuck time-out (3 s); "
                       "the others count it as stuck")
  assert public == Reason("client 2 did not run for 9.0 s (stopped, swapped out, or its "
                          "GIL held by C code), longer than the stuck time-out (3 s)", (2,))
  own, public = wording.own_code_failed(1, TypeError("a bug"), "Traceback ...")
  assert own.detail == ("this client's (1) heartbeat failed in its own code: TypeError: "
                        "a bug\nTraceback ...\n") and own.subject == ()
  assert public == Reason("client 1's heartbeat failed in its own code: TypeError: a bug",
                          (1,))


@pytest.mark.parametrize("finished, policy, said", [
    (False, "terminate", "stopping this client"),
    (False, "raise", "raising PeerFailureError at the next jdtensor call"),
    (False, "log", "carrying on (policy 'log')"),
    (True, "terminate", "this client had already finished"),
])
def test_what_a_client_does_about_a_failure(finished, policy, said):
  assert wording.consequence(finished, policy) == said


def test_a_straggler_is_a_warning_line():
  assert wording.straggler(3, 90.4, 2.0) == (
      "heartbeat: client 3 is a straggler: the others waited for it 90% of the last 2 s")


def test_a_pause_within_the_stuck_time_out_is_a_warning_line():
  assert wording.paused(1, 2.04, 3.0) == (
      "heartbeat: this client (1) did not run for 2.0 s (within the stuck time-out, 3 s)")
