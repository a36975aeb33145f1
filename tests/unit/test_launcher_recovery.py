"""The recovery line's words for an attempt that ended before its first step
(`jdtensor.launcher.nodes.recovery_line`): pure. The line of a restart that
reached its first step, and the hint for a script that never says one, are
tested in tests/unit/test_compile_cache.py; the whole run in
tests/multiprocess/test_recovery.py."""

from jdtensor.launcher.nodes import _Restart, recovery_line

FULL = _Restart(1, 100.0, "client 2's failure", 100.4, 107.25)


def test_an_attempt_that_ended_before_its_first_step_is_said_so_without_advice():
  """The script calls jdtensor.step_done(); the restarted attempt failed
  (or was stopped) before its first step: no advice to call it."""
  early = _Restart(2, 200.0, "client 1's failure", 201.0, None, ended_early=True)
  assert recovery_line([FULL, early]) == (
      "jdtensor launch: time to recovery: restart 1 after client 2's failure: 7.2 s "
      "(0.4 s to start again, 6.8 s to the first step); restart 2 after client 1's "
      "failure: 1.0 s to start again (attempt 3 ended before its first step)")
  assert recovery_line([_Restart(1, 50.0, "a failure", 50.3, None, ended_early=True)]) == (
      "jdtensor launch: time to recovery: restart 1 after a failure: 0.3 s to start "
      "again (attempt 2 ended before its first step)")


def test_the_advice_stays_for_an_attempt_that_ran_on_without_a_first_step():
  """An attempt that ended well (or still ran) without a first step: the
  script does not call jdtensor.step_done()."""
  early = _Restart(1, 50.0, "a failure", 50.3, None, ended_early=True)
  quiet = _Restart(2, 60.0, "a failure", 61.0, None)
  assert recovery_line([early, quiet]) == (
      "jdtensor launch: time to recovery: restart 1 after a failure: 0.3 s to start "
      "again (attempt 2 ended before its first step); restart 2 after a failure: 1.0 s "
      "to start again (call jdtensor.step_done() after each step for the time to the "
      "first step)")
