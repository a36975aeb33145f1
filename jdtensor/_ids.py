"""Client ids in messages: a short list as it is, a long one as runs.

PURE: standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["to_ranges", "ids_text", "LISTED"]

# Up to this many ids are listed one by one; more are written as runs, so
# that a message stays one line at any scale.
LISTED = 8


def to_ranges(clients: Iterable[int]) -> list[list[int]]:
  """Sorted client ids as ``[first, last]`` runs: a list of thousands of
  consecutive clients is a few numbers."""
  out: list[list[int]] = []
  for c in sorted(int(c) for c in clients):
    if out and c == out[-1][1] + 1:
      out[-1][1] = c
    elif not out or c > out[-1][1]:
      out.append([c, c])
  return out


def ids_text(clients: Sequence[int], listed: int = LISTED) -> str:
  """``0, 2, 3`` (at most `listed` ids, in their order), else runs in order:
  ``0, 2-299``."""
  if len(clients) <= listed:
    return ", ".join(map(str, clients))
  return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in to_ranges(clients))
