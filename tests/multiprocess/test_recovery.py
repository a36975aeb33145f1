"""A restart, timed: `jdtensor launch --max-restarts` after a SIGKILL says how
long the failed attempt ran and, at the end, each restart's time to recovery
(from the failure to the next attempt's first step, `jdtensor.step_done`).

On CPU the attempts share no compilation cache (JAX keys a CPU program by
its process; `jdtensor.launcher.compile_cache.CPU_REASON`), and the launcher
says so; the cache's own parts are tested in tests/unit/test_compile_cache.py.
"""

import os
import re
import sys

import pytest

from jdtensor.launcher.compile_cache import CPU_REASON
from tests.helpers import REPO, TEST_TIMEOUTS, clean_env, parse_results, run_python

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "tests", "multiprocess", "recovery_client.py")


def launch(*args, **env):
  """`jdtensor launch -n 4 --max-restarts 1 ARGS -- python recovery_client.py`."""
  res = run_python(f"""
      import sys
      from jdtensor.cli import main
      sys.exit(main(["launch", "-n", "4", "--max-restarts", "1", "--grace", "5",
                     "--timeout", "150", *{list(args)!r}, "--", sys.executable,
                     {CLIENT!r}]))
      """, env=clean_env(**{**TEST_TIMEOUTS, "LAYERS": "20", **env}), timeout=180)
  return res.returncode, res.stdout + res.stderr


@pytest.mark.parametrize("step_done", [True, False], ids=["step-done", "no-step-done"])
def test_a_restart_says_how_long_it_took_to_recover(step_done):
  code, text = launch(KILL="2", KILL_AT="1", STEP_DONE="1" if step_done else "0")
  assert code == 0, text
  assert text.count(f"jdtensor launch: restarts compile every program again on CPU: "
                    f"{CPU_REASON}") == 1, text
  ran = re.search(r"^jdtensor launch: restarting \(1 of 1\) after: client 2 was killed "
                  r"by SIGKILL; .*; attempt 1 ran (\d+\.\d) s$", text, re.M)
  assert ran and 0.5 < float(ran.group(1)) < 120, text
  results = parse_results(text)
  assert sorted(results) == [0, 1, 2, 3], text
  assert all(r["attempt"]["attempt"] == 1 for r in results.values()), text
  if step_done:
    line = re.search(r"^jdtensor launch: time to recovery: restart 1 after client 2's "
                     r"failure: (\d+\.\d) s \((\d+\.\d) s to start again, (\d+\.\d) s "
                     r"to the first step\)$", text, re.M)
    assert line, text
    total, start, first = map(float, line.groups())
    # The survivors know at once (the links close) and leave: no grace is
    # spent on them (the grace is 5 s).
    assert start < 3.0, text
    assert abs(total - start - first) <= 0.11 and first > 0.1, text
  else:
    assert re.search(r"^jdtensor launch: time to recovery: restart 1 after client 2's "
                     r"failure: \d+\.\d s to start again \(call jdtensor.step_done\(\) "
                     r"after each step for the time to the first step\)$", text, re.M), text


def test_no_compile_cache_line_where_the_user_turned_it_off():
  code, text = launch("--no-compile-cache", STEPS="1")
  assert code == 0, text
  assert "compil" not in "".join(l for l in text.splitlines(True)
                                 if l.startswith("jdtensor launch:")), text
  assert "time to recovery" not in text  # No restart happened.
