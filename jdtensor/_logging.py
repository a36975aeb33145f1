"""jdtensor's log calls: one logger, ``jdtensor``, whoever imported absl.

DTensor logs through absl. jdtensor logs through the standard ``jdtensor``
logger only, so that its lines (the heartbeat's verdicts among them) look the
same whether or not something in the process imported ``absl.logging``
(orbax, flax and TF do): calling ``absl.logging`` before absl is initialised
runs ``logging.basicConfig()`` on the application's root logger and prints
``ERROR:absl:...``. An application that runs under ``absl.app.run`` (or calls
``absl.logging.use_absl_handler()``) has absl's handler on the root logger,
and jdtensor's lines then carry absl's format and verbosity like any other
standard logger's: that is the application's choice, not an import's.
"""

from __future__ import annotations

import logging as _logging
from typing import Any

__all__ = ["info", "warning", "error", "vlog"]

_logger = _logging.getLogger("jdtensor")

# absl level -> standard level: absl's INFO/WARNING/ERROR are 0/-1/-2, and
# vlog(n) is absl level n, one standard level below DEBUG per step.
_STANDARD = {0: _logging.INFO, -1: _logging.WARNING, -2: _logging.ERROR}


def _log(absl_level: int, msg: str, args: tuple[Any, ...]) -> None:
  level = _STANDARD.get(absl_level, _logging.DEBUG - (absl_level - 1))
  # stacklevel: the record (and absl's handler) names jdtensor's caller.
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
