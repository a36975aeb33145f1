"""Whether this client has met the others at a coordination-service wait.

A client counts as past its set-up (and so can be named a staller) once it
has met the other clients somewhere. A device collective says so (on CPU,
the gloo communicators it joined: `jdtensor.heartbeat.exchange`); so does
coming out of a wait on JAX's coordination service, ``wait_at_barrier`` or
``blocking_key_value_get`` (a loop synchronised only through the service
never joins a collective). Sampling the main thread once a beat cannot see
those: a client that arrives last at a barrier passes it at once, and the
staller is that client at every step before its stall.

`ServiceWaitWatch` sees each such call return, with ``sys.monitoring``
(Python 3.12+): CALL events, where every call site but the service's waits
is switched off after its first call (``DISABLE``), so a steady loop costs
nothing; and the watch ends at the first meeting, for good. Only the main
thread's calls count (jdtensor's own threads use the service too). On
Python 3.11, or where no tool id is free, it does not start, and only the
device collectives say a client is past its set-up.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from jdtensor import _jaxlib_texts
from jdtensor._monitoring import claim_tool, release_tool

__all__ = ["ServiceWaitWatch"]


class ServiceWaitWatch:
  """Sees the main thread come out of a coordination-service wait."""

  TOOL_IDS = (4, 3)  # Free ids (`SystemExitWatch` takes the lower one first).
  TOOL_NAME = "jdtensor meetings"

  def __init__(self) -> None:
    self.met = False
    self._tool: int | None = None
    self._lock = threading.Lock()

  @property
  def active(self) -> bool:
    return self._tool is not None

  def start(self) -> bool:
    """Starts watching; False where ``sys.monitoring`` is absent or no tool
    id is free."""
    with self._lock:
      if self._tool is not None or self.met:
        return self._tool is not None
      claimed = claim_tool(self.TOOL_IDS, self.TOOL_NAME)
      if claimed is None:
        return False
      monitoring, tool = claimed
      waits = frozenset(_jaxlib_texts.SERVICE_WAIT_CALLS.split())
      main = threading.main_thread().ident
      disable = monitoring.DISABLE

      def is_wait(fn: Any) -> bool:
        try:  # Never an error into the program's call (an odd callable).
          return getattr(fn, "__qualname__", None) in waits
        except Exception:  # pylint: disable=broad-except
          return False

      def called(code: Any, offset: int, fn: Any, arg0: Any) -> Any:
        del code, offset, arg0
        return None if is_wait(fn) else disable  # Only the waits' sites stay.

      def returned(code: Any, offset: int, fn: Any, arg0: Any) -> None:
        del code, offset, arg0
        if threading.get_ident() == main and is_wait(fn):
          self.met = True
      events = monitoring.events
      monitoring.register_callback(tool, events.CALL, called)
      monitoring.register_callback(tool, events.C_RETURN, returned)
      monitoring.set_events(tool, events.CALL)
      self._tool = tool
    return True

  def stop(self) -> None:
    """Gives the tool id back (at the first meeting: nothing more to see)."""
    with self._lock:
      if self._tool is None:
        return
      events = sys.monitoring.events  # type: ignore[attr-defined]
      release_tool(self._tool, (events.CALL, events.C_RETURN))
      self._tool = None

  def has_met(self) -> bool:
    """Whether the main thread came out of a service wait (then the watch
    ends)."""
    if self.met and self._tool is not None:
      self.stop()
    return self.met
