"""`jdtensor._threads`: a helper thread the interpreter refuses is no error."""

import sys

from tests.helpers import run_python


def test_a_helper_thread_at_interpreter_shutdown_is_no_error():
  """In an exit handler (3.12 refuses new threads there; 3.11 and 3.13 do
  not), `start_daemon` gives None or a thread, and `call_bounded` an answer
  or None, never an exception."""
  res = run_python("""
      import atexit, sys
      from jdtensor._threads import call_bounded, start_daemon

      def at_exit():
        started = start_daemon(lambda: None, "t") is not None
        print("started", started, "answer", call_bounded(lambda: 7, 5.0), flush=True)
      atexit.register(at_exit)
  """, timeout=30)
  assert res.returncode == 0 and not res.stderr, res
  refused = sys.version_info[:2] == (3, 12)
  assert res.stdout.split() == (["started", "False", "answer", "None"] if refused
                                else ["started", "True", "answer", "7"])


def test_call_bounded_gives_the_answer_or_none():
  from jdtensor._threads import call_bounded  # pylint: disable=g-import-not-at-top
  assert call_bounded(lambda: 3, 5.0) == 3
  assert call_bounded(lambda: 1 / 0, 5.0) is None
  assert call_bounded(lambda: __import__("time").sleep(2), 0.05) is None
