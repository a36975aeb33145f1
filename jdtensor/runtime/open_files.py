"""How many files a client may keep open: enough for its run.

PURE: standard library only.

Client 0 holds, per client, a liveness link and a connection to JAX's
coordination service, and every client of a CPU run holds a gloo connection
to every other (measured: 268 descriptors on client 0 at 128 clients, 524
at 256, before any collective). A pod slice of 1,000 hosts needs more than
the 1,024 that many systems allow by default (the soft ``RLIMIT_NOFILE``),
and a process past its limit fails in whatever opens the next file: a
socket deep inside gRPC or gloo. So start-up raises the soft limit to what
the run needs (never above the hard limit, which only an administrator may
raise), and where the hard limit is too low says so before anything is
connected.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from jdtensor.errors import StartupError

__all__ = ["OpenFiles", "ensure_open_files", "open_files_needed"]

# Descriptors a client needs per client of the run: client 0 a link, a
# coordination-service connection and a gloo connection, each with room to
# spare; every other client a gloo connection per peer.
PER_CLIENT_ON_CLIENT_0 = 4
PER_CLIENT = 2
# Beside those: JAX's own files, threads' pipes, the user's next files.
SPARE = 256


class OpenFiles(NamedTuple):
  """This process's open-file limits and what it did with them.

  Attributes:
    need: Descriptors the run needs here (those open now included).
    soft, hard: ``RLIMIT_NOFILE`` after the call.
    raised_from: The soft limit before, when it was raised; else None.
  """
  need: int
  soft: int
  hard: int
  raised_from: int | None


def open_files_needed(num_clients: int, client_id: int, open_now: int) -> int:
  """Descriptors client `client_id` of `num_clients` needs, with `open_now`
  already open."""
  per_client = PER_CLIENT_ON_CLIENT_0 if client_id == 0 else PER_CLIENT
  return open_now + SPARE + per_client * num_clients


def _open_now() -> int:
  try:
    return len(os.listdir("/proc/self/fd"))
  except OSError:
    return 0


def ensure_open_files(num_clients: int, client_id: int) -> OpenFiles | None:
  """Raises this process's soft open-file limit to what the run needs.

  Returns:
    What was found and done; None where the platform has no such limit.

  Raises:
    StartupError: The hard limit is below the need: names both, and the fix.
  """
  try:
    import resource  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  need = open_files_needed(num_clients, client_id, _open_now())
  if soft == resource.RLIM_INFINITY or soft >= need:
    return OpenFiles(need, soft, hard, None)
  if hard != resource.RLIM_INFINITY and hard < need:
    raise StartupError(
        f"Client {client_id} of {num_clients} needs about {need} open files (its "
        f"links, JAX's connections and collectives), but this process may open at "
        f"most {hard} (the hard RLIMIT_NOFILE; soft {soft}). Raise the hard limit "
        f"where the clients start: `ulimit -Hn {need}` (as root), Docker's "
        f"`--ulimit nofile={need}:{need}`, systemd's `LimitNOFILE={need}`, or "
        "/etc/security/limits.conf.")
  resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
  return OpenFiles(need, need, hard, soft)
