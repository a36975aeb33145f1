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
  consecutive clients is a few numbers.

  Every client builds such a list at a verdict (``clients 0-4094 wait``), so
  the runs are found by halving, not by a Python step per id: a stretch of
  sorted distinct ids is one run exactly when its ends differ by its length
  less one. R runs in N ids cost O(R log N) steps after a sort (in C).
  """
  ids = sorted(set(map(int, clients)))
  out: list[list[int]] = []
  stretches = [(0, len(ids) - 1)] if ids else []
  while stretches:
    lo, hi = stretches.pop()
    if ids[hi] - ids[lo] == hi - lo:
      _extend(out, ids[lo], ids[hi])
    elif hi - lo < _SCANNED:
      for c in ids[lo:hi + 1]:  # Short and broken: a step per id is cheaper.
        _extend(out, c, c)
    else:
      mid = (lo + hi) // 2
      stretches += [(mid + 1, hi), (lo, mid)]  # The lower half first.
  return out


# Below this many ids a broken stretch is scanned id by id rather than
# halved: scattered ids cost about what a plain scan does.
_SCANNED = 32


def _extend(out: list[list[int]], first: int, last: int) -> None:
  """Adds the run `first`-`last` to `out`, joining the run before it where
  they meet (a run cut in two by a halving)."""
  if out and out[-1][1] + 1 == first:
    out[-1][1] = last
  else:
    out.append([first, last])


def ids_text(clients: Sequence[int], listed: int = LISTED) -> str:
  """``0, 2, 3`` (at most `listed` ids, in their order), else runs in order:
  ``0, 2-299``."""
  if len(clients) <= listed:
    return ", ".join(map(str, clients))
  return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in to_ranges(clients))
