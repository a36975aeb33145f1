"""Suite-wide set-up: JAX on the CPU.

The in-process backend of the jax_single tests gets its 8 simulated CPU
devices from tests/jax_single/conftest.py (``jax_num_cpu_devices``), not from
``JAX_NUM_CPU_DEVICES`` in this process's environment: the clients that tests
launch from this process inherit its environment, and a device count there is
the clients' count (the launcher's rule), as it would be for a user.
Tests that need a different or fresh backend run in subprocesses
(tests/helpers.py).
"""

import atexit
import gc
import os

import pytest

from jdtensor.heartbeat import departure

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_SUITE_PID = os.getpid()


@pytest.fixture(autouse=True)
def _the_suite_never_ends_half_way(monkeypatch):
  """A test that reaches an exit path in this process (the exit handlers,
  ``os._exit``: a client's way out, tested with fakes) fails instead of
  ending the whole run there. Once a clean-end test reached jdtensor's real
  ``os._exit(0)``: the run stopped after half its tests, with code 0.

  A clean end's last step (`departure.before_finalisation`, `gc.freeze`) is
  refused too: frozen, the suite's objects would never be collected again.
  The exit guard swallows any error of that step (it must never change an
  exit), so each refusal is also recorded and fails the test at its end."""
  refused: list[str] = []

  def refusing(name, real):
    def refuse(*args, **kwargs):
      if os.getpid() != _SUITE_PID:
        return real(*args, **kwargs)  # A forked child does as it meant to.
      refused.append(name)
      raise AssertionError(f"a test reached {name} in the pytest process; "
                           "replace it in the test")
    return refuse
  monkeypatch.setattr(os, "_exit", refusing("os._exit", os._exit))
  monkeypatch.setattr(atexit, "_run_exitfuncs",
                      refusing("the exit handlers", atexit._run_exitfuncs))
  monkeypatch.setattr(gc, "freeze", refusing("gc.freeze", gc.freeze))
  monkeypatch.setattr(departure, "before_finalisation",
                      refusing("departure.before_finalisation",
                               departure.before_finalisation))
  yield
  assert not refused, f"a test reached {refused} in the pytest process"
