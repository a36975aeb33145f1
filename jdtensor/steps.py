"""`step_done`: a client tells `jdtensor launch` that it completed a step.

PURE: standard library only; no JAX. The launcher uses the first step of
each attempt to measure a restart's time to recovery: from the failure that
ended the last attempt to the first step the next one completed (every
compilation, restore and collective of the step included).
"""

from __future__ import annotations

import threading
import time

from jdtensor import _env, _report

__all__ = ["step_done"]

_lock = threading.Lock()
_told = False


def step_done() -> None:
  """Says that this client completed a training step.

  Call it after each step (or only after the first): under ``jdtensor
  launch`` the first call of each attempt writes one small file for the
  launcher, which then gives each restart's time to recovery in its summary;
  every later call, and every call outside ``jdtensor launch``, only reads a
  flag. It never starts JAX and never waits for the other clients: call it
  once the step's results are ready (e.g. after reading the loss), so that
  the time includes the step itself.

  Example::

    for step in range(start, steps):
      state, loss = train_step(state, batch)
      print(step, float(loss))
      jdtensor.step_done()
  """
  global _told
  if _told:
    return
  with _lock:
    if _told:
      return
    _told = True
    directory = _env.read_report_dir()
    raw = _env.process_environ().get(_env.DTENSOR_CLIENT_ID, "")
    if directory and raw.strip().isdigit():
      _report.mark_first_step(directory, int(raw), time.time())
