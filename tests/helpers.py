"""Subprocess helpers for tests: every wait has a deadline, nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Variables a test subprocess must not inherit from the developer's shell.
_SCRUBBED_PREFIXES = ("DTENSOR_", "JDTENSOR_", "JAX_", "XLA_FLAGS")


def clean_env(**overrides: str) -> dict[str, str]:
  """The current environment without DTENSOR_/JDTENSOR_/JAX_ variables."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(_SCRUBBED_PREFIXES) and not k.lower().endswith("_proxy")}
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  env.update(overrides)
  return env


@dataclass
class Result:
  returncode: int
  stdout: str
  stderr: str


def run_python(code: str, env: dict[str, str] | None = None,
               timeout: float = 60.0) -> Result:
  """Runs `code` in a fresh interpreter with a hard deadline.

  On expiry the whole process group gets SIGTERM, then SIGKILL after 3 s, and
  the test fails with the output so far.
  """
  proc = subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent(code)], env=env or clean_env(),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True, cwd=REPO)
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
      out, err = proc.communicate(timeout=3)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      out, err = proc.communicate(timeout=3)
    raise AssertionError(
        f"subprocess exceeded {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
  return Result(proc.returncode, out, err)
