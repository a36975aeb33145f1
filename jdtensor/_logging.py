"""jdtensor's log calls: absl logging when the application uses absl.

DTensor logs through absl. Importing ``absl.logging`` costs a client about
0.1-0.2 s of CPU at start-up (JAX itself does not import it), so jdtensor
routes each call at call time: to ``absl.logging`` when the application has
imported it (the lines then carry absl's format, flags and verbosity), and to
the standard ``jdtensor`` logger otherwise. It never creates the ``absl``
logger itself, which would stop absl from installing its own logger class.
"""

from __future__ import annotations

import logging as _logging
import sys
from typing import Any

__all__ = ["info", "warning", "error", "vlog"]

_logger = _logging.getLogger("jdtensor")

# absl level -> standard level: absl's INFO/WARNING/ERROR are 0/-1/-2, and
# vlog(n) is absl level n, one standard level below DEBUG per step.
_STANDARD = {0: _logging.INFO, -1: _logging.WARNING, -2: _logging.ERROR}


_absl_frames_skipped = False


def _ready_absl() -> Any:
  """``absl.logging`` if the application imported it and it is fully loaded.

  Another thread may be importing it right now: a module being imported is
  already in ``sys.modules`` but half-built (its spec says ``_initializing``),
  and touching it raises ``AttributeError`` (seen when a user imported absl
  right after initialisation while the heartbeat thread logged).
  """
  absl = sys.modules.get("absl.logging")
  if absl is None or getattr(getattr(absl, "__spec__", None), "_initializing",
                             False):
    return None
  return absl


def _log(absl_level: int, msg: str, args: tuple[Any, ...]) -> None:
  global _absl_frames_skipped
  absl = _ready_absl()
  if absl is not None:
    try:
      if not _absl_frames_skipped:  # So that absl names jdtensor's caller.
        for name in ("_log", "info", "warning", "error", "vlog"):
          absl.ABSLLogger.register_frame_to_skip(__file__, name)
        _absl_frames_skipped = True
      absl.log(absl_level, msg, *args)
      return
    except AttributeError:  # Half-built after all: use the standard logger.
      pass
  level = _STANDARD.get(absl_level, _logging.DEBUG - (absl_level - 1))
  _logger.log(level, msg, *args, stacklevel=3)


def info(msg: str, *args: Any) -> None:
  _log(0, msg, args)


def warning(msg: str, *args: Any) -> None:
  _log(-1, msg, args)


def error(msg: str, *args: Any) -> None:
  _log(-2, msg, args)


def vlog(level: int, msg: str, *args: Any) -> None:
  """absl's verbose levels: vlog(1) is DEBUG, vlog(2) just below it, ..."""
  _log(level, msg, args)
