"""Claiming and giving back a ``sys.monitoring`` tool id (Python 3.12+).

PURE: standard library only. jdtensor watches two things with
``sys.monitoring`` (the ``SystemExit`` ending the script, a client's first
meeting at a coordination-service wait); each takes one free id of the two
Python leaves unnamed (3 and 4: not the debugger's, coverage's, profiler's
or optimiser's), and gives it back whole.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["claim_tool", "release_tool"]


def claim_tool(ids: Iterable[int], name: str) -> tuple[Any, int] | None:
  """(``sys.monitoring``, the first free id of `ids`, now used by `name`);
  None where ``sys.monitoring`` is absent or none is free."""
  monitoring = getattr(sys, "monitoring", None)
  if monitoring is None:
    return None
  for tool in ids:
    if monitoring.get_tool(tool) is None:
      monitoring.use_tool_id(tool, name)
      return monitoring, tool
  return None


def release_tool(tool: int, events: Iterable[int]) -> None:
  """Switches `tool`'s events off, drops its callbacks for `events`, and
  frees the id."""
  monitoring = sys.monitoring  # type: ignore[attr-defined]
  monitoring.set_events(tool, 0)
  for event in events:
    monitoring.register_callback(tool, event, None)
  monitoring.free_tool_id(tool)
