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


def _absl() -> Any:
  return sys.modules.get("absl.logging")


def info(msg: str, *args: Any) -> None:
  absl = _absl()
  if absl is not None:
    absl.info(msg, *args)
  else:
    _logger.info(msg, *args, stacklevel=2)


def warning(msg: str, *args: Any) -> None:
  absl = _absl()
  if absl is not None:
    absl.warning(msg, *args)
  else:
    _logger.warning(msg, *args, stacklevel=2)


def error(msg: str, *args: Any) -> None:
  absl = _absl()
  if absl is not None:
    absl.error(msg, *args)
  else:
    _logger.error(msg, *args, stacklevel=2)


def vlog(level: int, msg: str, *args: Any) -> None:
  """absl's verbose levels: vlog(1) is DEBUG, vlog(2) just below it, ..."""
  absl = _absl()
  if absl is not None:
    absl.vlog(level, msg, *args)
  else:
    _logger.log(_logging.DEBUG - (level - 1), msg, *args, stacklevel=2)
