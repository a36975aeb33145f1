"""`jdtensor launch --log-dir` on a file system that cannot take a client's
log (full, over quota): nothing is lost in silence. The launcher says once
which client's log failed and from when; with --log-only that client's
output goes to the console instead; a summary never points at a cut-short
log without saying so.

The full disk is real: client 1's log is /dev/full (every write fails with
ENOSPC), the others' are plain files.
"""

import io
import os
import re
import sys
import textwrap

import pytest

from jdtensor import launcher
from tests.helpers import TEST_TIMEOUTS, clean_env

pytestmark = pytest.mark.multiprocess

SCRIPT = """
import jdtensor
import jax
jdtensor.initialize_accelerator_system("CPU")
for i in range(3):
  print("line", i, flush=True)
if jax.process_index() == 1 and FAIL:
  raise RuntimeError("client 1 fails after its lines")
print("done", flush=True)
"""


@pytest.mark.parametrize("log_only", [True, False], ids=["log-only", "console-too"])
@pytest.mark.parametrize("fail", [False, True], ids=["ends-0", "fails"])
def test_a_log_that_cannot_be_written_is_said_and_loses_nothing(log_only, fail, tmp_path):
  script = tmp_path / "train.py"
  script.write_text(f"FAIL = {fail}\n" + textwrap.dedent(SCRIPT))
  logs = tmp_path / "logs"
  logs.mkdir()
  os.symlink("/dev/full", logs / "client-1.log")
  out, err = io.StringIO(), io.StringIO()
  res = launcher.launch(launcher.LaunchSpec(
      command=(sys.executable, str(script)), num_clients=2, devices_per_client=1,
      timeout=60, grace=3, log_dir=str(logs), log_only=log_only), out=out, err=err,
      env=clean_env(**TEST_TIMEOUTS))
  out, err = out.getvalue(), err.getvalue()
  said = re.findall(r"^jdtensor launch: cannot write client (\d)'s log (\S+) from "
                    r"\d\d:\d\d:\d\d on \(No space left on device\): its output from "
                    r"then on (goes to the console instead|is on the console only)$",
                    err, re.M)
  assert said == [("1", str(logs / "client-1.log"),
                   "goes to the console instead" if log_only else
                   "is on the console only")], err
  # Client 1's output is on the console; client 0's is in its log (and, without
  # --log-only, on the console too).
  assert all(f"[client 1] line {i}" in out for i in range(3)), out
  assert ("[client 0] line 0" in out) is not log_only, out
  assert "line 2" in (logs / "client-0.log").read_text()
  if not fail:
    assert res.exit_code == 0, (res.reason, err)
    assert "[client 1] done" in out and ("[client 0] done" in out) is not log_only
    return
  assert res.first_failure == 1, (res.reason, err)
  assert "client 1 fails after its lines" in err  # Its traceback, on the console.
  assert (f"(its log, {logs / 'client-1.log'}, could not be written from "
          in res.reason), res.reason
  assert "its log: " not in res.reason, res.reason
