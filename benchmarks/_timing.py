"""Side-by-side timing helpers: interleaved repetitions, min and median."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable


def interleaved(fns: dict[str, Callable[[], object]], repeats: int
                ) -> dict[str, list[float]]:
  """Runs every function once per round, `repeats` rounds, in one process.

  Interleaving makes the noise of a shared machine fall on every contender
  alike; compare ratios, not absolute times.
  """
  times: dict[str, list[float]] = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  return times


def summary(samples: list[float]) -> tuple[float, float]:
  """(min, median) seconds."""
  return min(samples), statistics.median(samples)


def machine() -> str:
  import os  # pylint: disable=g-import-not-at-top
  return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {platform.system()} "
          f"{platform.release()}")
