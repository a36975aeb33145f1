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
nothing; and the watch ends at the first meeting, for good. Only the calls of
the thread that runs the program count (the main thread, or the one
`jdtensor.heartbeat.watched` names): jdtensor's own threads use the service
too. On
Python 3.11, or where no tool id is free, it does not start, and only the
device collectives say a client is past its set-up.

`JoinedQuestion` decides when a beat asks (`Exchange.joined_collective`).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from jdtensor import _jaxlib_texts
from jdtensor._monitoring import claim_tool, release_tool
from jdtensor.heartbeat.flight import IN_JAX, RUNNING, WAITING
from jdtensor.heartbeat.watched import ProgramThread

__all__ = ["ServiceWaitWatch", "JoinedQuestion"]


class JoinedQuestion:
  """Whether this client has met the others (its set-up is over), asked at
  a beat only when the answer matters.

  Asked while the main thread is inside JAX or waiting, or has run its own
  code for half the `shortest` stall time-out (long enough to be named a
  staller), else at most every `ASK_SECONDS` (the learnt stall time-out's
  warm-up waits for every client's answer), and never again once yes. Not
  at every beat: the question runs jaxlib code on a helper thread, and a
  program that forks while it runs hands its child a held lock.

  Args:
    ask: The question (`jdtensor.heartbeat.interfaces.Exchange.joined_collective`).
    clock: Monotonic seconds.
    shortest: The shortest stall time-out in force (the learnt one's floor,
      else the set one; 0: no stall verdicts).
  """
  ASK_SECONDS = 5.0

  def __init__(self, ask: Callable[[], bool], clock: Callable[[], float],
               shortest: float):
    self._ask, self._clock, self._shortest = ask, clock, shortest
    self._asked = -self.ASK_SECONDS
    self.joined = False

  def answer(self, phase: int, seconds: float) -> bool:
    """This beat's answer; `phase` and `seconds` are the main thread's."""
    if self.joined:
      return True
    now = self._clock()
    if (phase in (IN_JAX, WAITING) or now - self._asked >= self.ASK_SECONDS
        or (self._shortest > 0 and phase == RUNNING and seconds >= self._shortest / 2)):
      self._asked = now
      self.joined = bool(self._ask())
    return self.joined


class ServiceWaitWatch:
  """Sees the program's thread come out of a coordination-service wait.

  Args:
    program: The thread that runs the program (default: the main thread).
  """

  TOOL_IDS = (4, 3)  # Free ids (`SystemExitWatch` takes the lower one first).
  TOOL_NAME = "jdtensor meetings"

  def __init__(self, program: ProgramThread | None = None) -> None:
    self.program = program if program is not None else ProgramThread(
        threading.main_thread())
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
      program = self.program
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
        # Read at each call: the program may name another thread to watch.
        if threading.get_ident() == program.ident and is_wait(fn):
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
