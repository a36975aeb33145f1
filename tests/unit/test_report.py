"""The launcher's root cause and summary lines, from tables of cases: pure,
no process (jdtensor._report)."""

import pytest

from jdtensor._ids import ids_text
from jdtensor._report import (ClientEnd, Reason, Report, VerdictStack, finished_clients,
                              mark_finished, printable, root_cause, stack_lines, summary)

ZDE = "ZeroDivisionError: division by zero (train.py:42 in step)"


def ends(*codes, at=None):
  """ClientEnd per client: codes in client order, ended at 100 + client."""
  return [ClientEnd(c, code, (at or {}).get(c, 100.0 + c) if code is not None else None)
          for c, code in enumerate(codes)]


def verdict(client, culprits, detail, subject=None, reporter=None, at=99.0):
  """A verdict as the heartbeat reports it: `subject` defaults to the
  culprits (the heartbeat's texts name them first)."""
  reason = Reason(detail, tuple(culprits if subject is None else subject), reporter)
  return Report(client, tuple(culprits), reason.heartbeat_line(), at, False,
                detail=reason.detail, subject=reason.subject, reporter=reporter)


def departure(client, exception, at, code=None):
  """A departure: an `exception`'s description, or (`code`) an exit."""
  why = f"exited (code {code})" if code is not None else f"failed: {exception}"
  return Report(client, (client,), why, at, True, detail=exception)


CASES = [
    # An exception: the root cause with its reason.
    ("exception", ends(75, 1, 75), {1: departure(1, ZDE, 100.5)},
     (1, f"client 1 exited with code 1: {ZDE}", True, 1)),
    # Client 0 fails first by its own account and leaves last (it hosts the
    # services): it is the root cause, not client 1 that ended first.
    ("client-0-leaves-last", ends(1, 1, at={0: 103.0, 1: 101.0}),
     {0: departure(0, "boom", 100.2)},
     (0, "client 0 exited with code 1: boom", True, 1)),
    # sys.exit(3): the code says it all.
    ("exit-3", ends(75, 3, 75), {1: departure(1, "", 100.1, code=3)},
     (1, "client 1 exited with code 3", True, 3)),
    # A SIGKILL: no report at all.
    ("sigkill", ends(75, -9, 75), {}, (1, "client 1 was killed by SIGKILL", True, 137)),
    # The staller names itself (70) with its verdict.
    ("staller", ends(75, 75, 70, 75),
     {c: verdict(c, [2], "client 2 stalled: main thread in data.py:88 "
                 "next_batch for 4 s while clients 0, 1, 3 wait in a collective",
                 reporter=1 if c == 3 else None) for c in range(4)},
     (2, "client 2 exited with code 70: client 2 stalled: main thread in data.py:88 "
         "next_batch for 4 s while clients 0, 1, 3 wait in a collective", True, 70)),
    # An early sys.exit(0) with 4 clients: every survivor is a consequence
    # (75); the root cause is the one they name, never a healthy client.
    ("early-exit-0", ends(75, 0, 75, 75),
     {c: verdict(c, [1], "client 1 exited (code 0) while the others were "
                 "still running (clients 0, 2, 3 wait in a collective)") for c in (0, 2, 3)},
     (1, "client 1 exited (code 0) while the others were still running (clients 0, 2, 3 "
         "wait in a collective) (named by clients 0, 2, 3)", False, 1)),
    # A first collective too late: the late client (70, its own verdict) is
    # the cause, never a waiter.
    ("late-first-collective", ends(75, 75, 75, 70),
     {c: verdict(c, [3], "client 3 did not join the collective the others "
                 "waited in within JAX's 30 s communicator set-up time") for c in range(4)},
     (3, "client 3 exited with code 70: client 3 did not join the collective the others "
         "waited in within JAX's 30 s communicator set-up time", True, 70)),
    # Only consequences ended, the culprit still runs (stalled, or stopped).
    ("culprit-still-running", ends(75, None, 75),
     {0: verdict(0, [1], "client 1 missed beat 9 (last seen 8.1 s ago)"),
      2: verdict(2, [1], "client 1 missed beat 9 (last seen 8.1 s ago)", reporter=0)},
     (1, "client 1 missed beat 9 (last seen 8.1 s ago) (named by clients 0, 2)", False, 1)),
    # A verdict that does not begin with its culprit: the summary names it.
    ("beat-not-completed", ends(75, None, 75),
     {0: verdict(0, [1, 2], "beat 7 did not complete within 8 s although every "
                 "client started it", subject=()),
      2: verdict(2, [1], "clients 1, 3 missed beat 7 (last seen 8.0 s ago)",
                 subject=(1, 3))},
     (1, "client 1: beat 7 did not complete within 8 s although every client started "
         "it (named by clients 0, 2)", False, 1)),
    # The heartbeat's own wording of a verdict never decides the root cause:
    # a reworded text names the same client.
    ("reworded", ends(75, None, 75),
     {0: verdict(0, [1], "lost contact with client 1 at beat 9", subject=()),
      2: verdict(2, [1], "lost contact with client 1 at beat 9", subject=(), reporter=0)},
     (1, "client 1: lost contact with client 1 at beat 9 (named by clients 0, 2)",
      False, 1)),
    # A deadlock: every client names every other; the verdict is the run's,
    # said alone (not "client 0: ... (named by clients 1, 2)").
    ("every-client-named-by-every-other", ends(75, 75, 75),
     {c: verdict(c, [o for o in range(3) if o != c], "every client has waited in a "
                 "collective for 600 s with its process idle: a deadlock", subject=())
      for c in range(3)},
     (0, "every client has waited in a collective for 600 s with its process idle: a "
         "deadlock", False, 75)),
    # Two clients naming each other while a third names one of them: not the
    # whole run's verdict.
    ("two-name-each-other", ends(75, 75, 75),
     {0: verdict(0, [1], "client 1 missed beat 3 (last seen 8.0 s ago)"),
      1: verdict(1, [0], "client 0 missed beat 3 (last seen 8.0 s ago)"),
      2: verdict(2, [1], "client 1 missed beat 3 (last seen 8.0 s ago)")},
     (1, "client 1 missed beat 3 (last seen 8.0 s ago) (named by clients 0, 2)", False,
      75)),
    # Nobody reported anything: the first to end.
    ("no-reports", ends(75, 75, at={0: 102.0, 1: 101.0}), {},
     (1, "client 1 exited with code 75", False, 75)),
]


@pytest.mark.parametrize("client_ends, reports, want", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_root_cause(client_ends, reports, want):
  got = root_cause(client_ends, reports, now=200.0)
  assert (got.client, got.what, got.own, got.exit_code) == want


def test_no_root_cause_when_nobody_failed():
  assert root_cause(ends(0, 0, None), {}) is None


@pytest.mark.parametrize("kwargs, line", [
    (dict(what="client 1 exited with code 3", stopped=[0, 2]),
     "jdtensor launch: client 1 exited with code 3; stopped clients 0, 2"),
    (dict(what="client 1 exited with code 3", stopped=[], also=["client 2 exited with "
                                                                 "code 75"]),
     "jdtensor launch: client 1 exited with code 3; stopped clients none (also: client 2 "
     "exited with code 75)"),
    (dict(what="timed out after 2 s", stopped=[0, 1], killed=[0, 1], grace=1.0),
     "jdtensor launch: timed out after 2 s; stopped clients 0, 1 (clients 0, 1 ignored "
     "SIGTERM for 1 s: killed)"),
    (dict(what="client 2 exited with code 1 (on node 1)", stopped=[0], node=0),
     "jdtensor launch (node 0): client 2 exited with code 1 (on node 1); stopped clients 0"),
], ids=["plain", "also", "killed", "node"])
def test_summary_lines(kwargs, line):
  assert summary(**kwargs) == line


@pytest.mark.parametrize("report", [
    Report(2, (2,), "failed: boom", 12.5, True, detail="boom"),
    Report(3, (1, 4), "heartbeat: clients 1, 4 missed beat 3 (reported by client 0)",
           9.0, False, True, "clients 1, 4 missed beat 3", (1, 4), 0),
], ids=["departure", "relayed-verdict"])
def test_a_report_round_trips_and_bad_files_are_skipped(tmp_path, report):
  report.write(str(tmp_path))
  (tmp_path / "client-9.json").write_text("{not json")
  (tmp_path / "other.txt").write_text("x")
  assert Report.read_all(str(tmp_path)) == {report.client: report}
  assert Report.read_all(str(tmp_path / "gone")) == {}


def test_the_line_for_people_is_made_from_the_fields():
  assert Reason("client 2 missed beat 4", (2,)).heartbeat_line() == (
      "heartbeat: client 2 missed beat 4")
  assert Reason("client 2 missed beat 4", (2,), 0).heartbeat_line() == (
      "heartbeat: client 2 missed beat 4 (reported by client 0)")


def test_finished_clients_are_recorded_by_marker(tmp_path):
  mark_finished(str(tmp_path), 3)
  mark_finished(str(tmp_path), 0)
  (tmp_path / "client-x.finished").write_text("")
  assert finished_clients(str(tmp_path)) == {0, 3}
  assert finished_clients(str(tmp_path / "gone")) == set()


@pytest.mark.parametrize("ids, text", [
    ([], ""), ([3], "3"), ([0, 2, 3], "0, 2, 3"), (list(range(8)), "0, 1, 2, 3, 4, 5, 6, 7"),
    (list(range(1, 300)), "1-299"), ([0, *range(2, 300)], "0, 2-299"),
    ([*range(9), 11, 13], "0-8, 11, 13")])
def test_id_lists_past_eight_are_runs(ids, text):
  assert ids_text(ids) == text


def test_a_summary_of_300_clients_stays_a_line_and_a_cut_grace_says_why():
  assert summary("timed out after 60 s", list(range(1, 300))) == (
      "jdtensor launch: timed out after 60 s; stopped clients 1-299")
  assert summary("received SIGINT", [0, 1, 2], killed=[0, 2], grace=30,
                 cut_short="SIGINT again") == (
      "jdtensor launch: received SIGINT; stopped clients 0, 1, 2 (clients 0, 2 "
      "killed at once: SIGINT again)")
  assert summary("received SIGTERM", [1], killed=[1], grace=30) == (
      "jdtensor launch: received SIGTERM; stopped clients 1 (client 1 ignored "
      "SIGTERM for 30 s: killed)")


def test_the_stacks_under_a_verdict_one_line_per_place(tmp_path):
  waiting = "train.py:44 main"
  for c in (0, 2, 3, 4, 6):
    VerdictStack(c, "collective", waiting, "Thread 'MainThread' ...").write(str(tmp_path))
  VerdictStack(1, "own code", "data.py:88 next_batch <- train.py:40 main").write(str(tmp_path))
  (tmp_path / "client-7.stack").write_text("{not json")  # Half written: skipped.
  stacks = VerdictStack.read_all(str(tmp_path))
  assert sorted(stacks) == [0, 1, 2, 3, 4, 6]
  assert stack_lines(range(9), stacks, {5: -9}) == [
      "jdtensor launch: main threads when the verdict was named:",
      "  clients 0, 2, 3, 4, 6: train.py:44 main (collective)",
      "  client 1: data.py:88 next_batch <- train.py:40 main (own code)",
      "  client 5: was killed by SIGKILL (no stack: it ended first)",
      "  clients 7, 8: did not answer (stopped, or its interpreter held by C code, "
      "or no heartbeat)"]
  assert stack_lines([1], stacks, {}, node=2)[0] == (
      "jdtensor launch (node 2): main threads when the verdict was named:")


def test_who_answered_is_read_from_the_names_alone(tmp_path):
  VerdictStack(3, "collective", "train.py:44 main").write(str(tmp_path))
  (tmp_path / "client-5.stack").write_text("{half written")  # Its name counts.
  (tmp_path / "client-x.stack").write_text("{}")
  mark_finished(str(tmp_path), 2)
  assert VerdictStack.answered(str(tmp_path)) == {3, 5}
  assert finished_clients(str(tmp_path)) == {2}
  assert VerdictStack.answered(str(tmp_path / "gone")) == set()


@pytest.mark.parametrize("text, shown", [
    ("plain text, é and a\ttab", "plain text, é and a\ttab"),
    ("\x1b]0;TITLE\x07", "\\x1b]0;TITLE\\x07"),  # Sets a terminal's window title.
    ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # Clears the screen.
    ("a\x00b\x7fc\x9bd", "a\\x00b\\x7fc\\x9bd"),  # NUL, DEL, a C1 CSI.
    ("one\ntwo\r", "one\\x0atwo\\x0d"),  # One line stays one line.
])
def test_a_clients_text_is_shown_escaped(text, shown):
  assert printable(text) == shown
  assert printable(shown) == shown  # Escaping twice changes nothing.
  assert Reason(text, (1,)).heartbeat_line() == "heartbeat: " + printable(text, newlines=True)
  assert summary(f"client 1 failed: {text}", []) == (
      f"jdtensor launch: client 1 failed: {shown}; stopped clients none")


def test_an_exceptions_description_is_escaped():
  from jdtensor.heartbeat.departure import describe_exception
  try:
    raise RuntimeError("bad \x1b[2J\x00 end\nsecond line")
  except RuntimeError as e:
    text = describe_exception(e)
  assert text.startswith("RuntimeError: bad \\x1b[2J\\x00 end (test_report.py:"), text


# -- a frozen client, a start-up that failed waiting for client 0 (#67) -------------

def test_a_frozen_client_is_said_killed_at_once_never_beside_stopped_clients_none():
  """A stopped (SIGSTOPped) client cannot act on SIGTERM: the launcher kills
  it at once, and the summary says so about a client it counts as stopped."""
  assert summary("client 1 missed beat 5 (last seen 3.2 s ago) (named by clients 0, 2)",
                 [1], frozen=[1], grace=30.0) == (
      "jdtensor launch: client 1 missed beat 5 (last seen 3.2 s ago) (named by clients "
      "0, 2); stopped clients 1 (client 1 frozen (SIGSTOP, or a debugger): killed at once)")
  assert summary("timed out after 9 s", [0, 1, 2], frozen=[0, 2], killed=[1],
                 grace=5.0) == (
      "jdtensor launch: timed out after 9 s; stopped clients 0, 1, 2 (clients 0, 2 frozen "
      "(SIGSTOP, or a debugger): killed at once) (client 1 ignored SIGTERM for 5 s: "
      "killed)")


SERVICE = ("client 0's JAX coordination service at DTENSOR_JOBS[0]='localhost:9' did "
           "not come up within the init timeout (10 s, JDTENSOR_INIT_TIMEOUT) though "
           "client 0 met every client")
TIMEOUT_ERROR = ("StartupTimeoutError: Client 1: client 0 met every client, but its JAX "
                 "coordination service ... did not come up before the init timeout; "
                 "check client 0's output. (rendezvous.py:256 in _service_timeout)")


def test_a_start_up_that_failed_waiting_for_client_0_names_client_0(tmp_path):
  """Client 1's start-up fails (exit 1, StartupTimeoutError) because client 0's
  coordination service never came up: its departure names client 0 (the
  record beside it), so the root cause is client 0, still running and
  silent, not client 1, which only waited."""
  from jdtensor._report import blame_at_start, withdraw_blame
  directory = str(tmp_path)
  departure(1, TIMEOUT_ERROR, 110.0).write(directory)
  departure(2, TIMEOUT_ERROR, 110.2).write(directory)
  blame_at_start(directory, 1, Reason(SERVICE, (0,)))
  blame_at_start(directory, 2, Reason(SERVICE, (0,)))
  reports = Report.read_all(directory)
  assert reports[1].culprits == (0,) and reports[1].blames_others
  assert reports[1].why == f"failed: {TIMEOUT_ERROR}"  # Its own words are kept.
  got = root_cause(ends(None, 1, 1), reports, now=200.0)
  assert (got.client, got.what, got.own, got.exit_code) == (
      0, f"{SERVICE} (named by clients 1, 2)", False, 1)
  # Another client that failed by itself still comes first.
  departure(3, ZDE, 111.0).write(directory)
  got = root_cause(ends(None, 1, 1, 1), Report.read_all(directory), now=200.0)
  assert (got.client, got.own) == (3, True)
  # A blame withdrawn (a later try that started) leaves the departure its own.
  withdraw_blame(directory, 1)
  assert Report.read_all(directory)[1].culprits == (1,)
  withdraw_blame(directory, 1)  # Twice: nothing to withdraw, no error.


def test_a_silent_client_in_its_start_up_answers_with_its_threads_stack(tmp_path):
  """A client in its start-up writes every thread's stack on SIGUSR1 in
  faulthandler's own format; the launcher reads the start-up thread's
  innermost frames (a real faulthandler dump of this thread, here)."""
  import faulthandler
  import os
  import threading
  from jdtensor._report import StartupStacks
  directory = str(tmp_path)
  f = StartupStacks.begin(directory, 0, os.getpid(), threading.get_ident())
  assert StartupStacks.waiting(directory) == {0: (os.getpid(), 0)}
  assert StartupStacks.read(directory, 0) is None  # Not asked yet.

  def stalled_in_start_up():
    faulthandler.dump_traceback(file=f, all_threads=True)
  stalled_in_start_up()
  stalled_in_start_up()  # Asked twice: the last answer counts.
  pid, size = StartupStacks.waiting(directory)[0]
  assert pid == os.getpid() and size > 0
  record = StartupStacks.read(directory, 0)
  top = record.where.split(" <- ")
  assert top[0].startswith("test_report.py:") and top[0].endswith(" stalled_in_start_up")
  assert top[1].endswith(" test_a_silent_client_in_its_start_up_answers_with_its_"
                         "threads_stack") and len(top) == 3, record.where
  assert record.phase == "start-up" and "most recent call first" in record.stacks
  assert stack_lines([0, 1], {0: record}, {1: 1}) == [
      "jdtensor launch: main threads when the verdict was named:",
      f"  client 0: {record.where} (start-up)",
      "  client 1: exited with code 1 (no stack: it ended first)"]
  StartupStacks.end(directory, 0, f)
  assert StartupStacks.waiting(directory) == {} and f.closed
