"""Where the checkout is, for the benchmarks and the client programs they start.

The benchmarks run as modules of the checkout (``python -m benchmarks.<name>``
from its root), so they import `benchmarks` and `jdtensor` from it without
editing ``sys.path``; a client program they start by path gets the checkout
first on ``PYTHONPATH`` (`with_checkout`), installed jdtensor or not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def with_checkout(env: Mapping[str, str]) -> dict[str, str]:
  """`env` with the checkout first on ``PYTHONPATH``."""
  rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != ROOT]
  return {**env, "PYTHONPATH": os.pathsep.join([ROOT, *rest])}
