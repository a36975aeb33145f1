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
  ``os._exit(0)``: the run stopped after half its tests, with code 0."""
  real_exit = os._exit

  def refuse(*args, **kwargs):
    if os.getpid() != _SUITE_PID:
      real_exit(*args, **kwargs)  # A forked child ends as it meant to.
    raise AssertionError("a test reached os._exit, the exit handlers or "
                         "gc.freeze in the pytest process; replace them in "
                         "the test")
  monkeypatch.setattr(os, "_exit", refuse)
  monkeypatch.setattr(atexit, "_run_exitfuncs", refuse)
  # A clean end's last step: frozen, the suite's objects would never be
  # collected again.
  monkeypatch.setattr(gc, "freeze", refuse)
  monkeypatch.setattr(departure, "before_finalisation", refuse)
