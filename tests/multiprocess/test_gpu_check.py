"""benchmarks/gpu_check.py, the one-command check for GPU machines, run here
on CPU devices (``--platform cpu``): the same checks, so that the script a
GPU machine runs is known to work where CI has no GPU."""

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, clean_env

pytestmark = pytest.mark.multiprocess

SCRIPT = os.path.join(REPO, "benchmarks", "gpu_check.py")


def test_every_check_passes_and_the_table_is_written(tmp_path):
  out = tmp_path / "table.md"
  res = subprocess.run([sys.executable, SCRIPT, "--platform", "cpu", "--out", str(out),
                        "--busy-seconds", "7"], env=clean_env(), cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stdout + res.stderr
  table = out.read_text()
  rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
  assert [r.split(" | ")[0][2:] for r in rows] == [
      "single-client API (init s)", "launcher GPU assignment",
      "start-up and cross-client psum (slowest init s)",
      "a SIGKILLed client (s to the run's end)",
      "an exception on a client (s to the run's end)",
      "a stalled client, stall time-out 5 s (s to the run's end)",
      "a 7 s kernel on client 1, stall time-out 5 s: not a stall (kernel s)",
      "a restart loads the step from the compilation cache (s to recovery)"], table
  assert all(r.split(" | ")[2] == "ok" for r in rows), table
  seconds = {r.split(" | ")[0][2:]: r.split(" | ")[3] for r in rows}
  assert float(seconds["a SIGKILLed client (s to the run's end)"]) < 2, table
  stall = float(seconds["a stalled client, stall time-out 5 s (s to the run's end)"])
  assert 5 <= stall < 9, table
  assert re.match(r"jdtensor gpu_check: \d{4}-\d\d-\d\d, .*: Python 3\.\d+\.\d+, jax ",
                  table), table
  assert res.stdout.endswith(f"gpu_check: 8 of 8 checks passed; table in {out}\n")


def test_a_machine_without_a_gpu_is_told_so():
  env = clean_env(CUDA_VISIBLE_DEVICES="")
  res = subprocess.run([sys.executable, SCRIPT], env=env, capture_output=True,
                       text=True, timeout=60)
  assert (res.returncode, res.stdout) == (2, ""), res.stderr
  assert res.stderr == (
      "gpu_check: this machine shows no GPU (no /dev/nvidia<N>, or CUDA_VISIBLE_DEVICES "
      "is empty). Run it on a GPU machine, or with --platform cpu to test the script "
      "itself.\n")
