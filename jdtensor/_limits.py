"""What a run needs of the machine: open files in each client, and, for
`jdtensor launch`, open files, processes and ports for all its clients.

PURE: standard library only (the launcher's parent uses it).

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

The launcher does the same for itself before it starts a client: `-n`
beyond what this machine can serve (the launcher's files, client 0's, the
process ids, the ephemeral ports it picks from) is refused at once with the
numbers and the fix, not after minutes of starting clients that cannot run.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from jdtensor.errors import ConfigError, StartupError

__all__ = ["OpenFiles", "ensure_open_files", "open_files_needed", "launcher_files_needed",
           "MachineLimits",
           "launch_capacity_problem", "ensure_launch_capacity"]

# Descriptors a client needs per client of the run: client 0 a link, a
# coordination-service connection and a gloo connection, each with room to
# spare; every other client a gloo connection per peer.
PER_CLIENT_ON_CLIENT_0 = 4
PER_CLIENT = 2
# Beside those: JAX's own files, threads' pipes, the user's next files.
SPARE = 256
# The launcher, per client of its node: the two ends of its output it
# reads, its port (held until it starts) and its --log-dir file.
PER_CLIENT_IN_LAUNCHER = 4
LAUNCHER_SPARE = 64
# Open files a client holds before start-up reaches its check.
CLIENT_OPEN_AT_START = 64


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


def launcher_files_needed(local_clients: int, open_now: int) -> int:
  """Descriptors `jdtensor launch` needs for `local_clients`, with `open_now`
  already open."""
  return open_now + LAUNCHER_SPARE + PER_CLIENT_IN_LAUNCHER * local_clients


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


class MachineLimits(NamedTuple):
  """What this machine lets the launcher start (None: no such limit).

  Attributes:
    open_now: Descriptors the launcher holds now.
    files_soft, files_hard: ``RLIMIT_NOFILE``.
    pid_max: ``/proc/sys/kernel/pid_max``.
    processes: Processes running now (all users).
    nproc: ``RLIMIT_NPROC`` (soft) of a user who is not root.
    ports: The ephemeral port range (``ip_local_port_range``).
  """
  open_now: int
  files_soft: int | None
  files_hard: int | None
  pid_max: int | None
  processes: int
  nproc: int | None
  ports: tuple[int, int] | None

  @staticmethod
  def read() -> MachineLimits:
    """This machine's, now."""
    soft = hard = nproc = None
    try:
      import resource  # pylint: disable=g-import-not-at-top
      def finite(v: int) -> int | None:
        return None if v == resource.RLIM_INFINITY else v
      soft, hard = map(finite, resource.getrlimit(resource.RLIMIT_NOFILE))
      if os.geteuid() != 0:  # The kernel does not apply it to root.
        nproc = finite(resource.getrlimit(resource.RLIMIT_NPROC)[0])
    except ImportError:
      pass
    pid_max = _read_ints("/proc/sys/kernel/pid_max")
    ports = _read_ints("/proc/sys/net/ipv4/ip_local_port_range")
    try:
      processes = sum(1 for name in os.listdir("/proc") if name.isdecimal())
    except OSError:
      processes = 0
    return MachineLimits(_open_now(), soft, hard, pid_max[0] if pid_max else None,
                         processes, nproc,
                         (ports[0], ports[1]) if len(ports or ()) == 2 else None)


def _read_ints(path: str) -> list[int] | None:
  try:
    with open(path, encoding="ascii") as f:
      return [int(v) for v in f.read().split()]
  except (OSError, ValueError):
    return None


def launch_capacity_problem(local_clients: int, num_clients: int, runs_client_0: bool,
                            picks_ports: bool, limits: MachineLimits) -> str | None:
  """Why this machine cannot start `local_clients` clients of a run of
  `num_clients` (the first resource short, with its numbers and the fix), or
  None when it can.

  Args:
    local_clients: Clients this launcher starts (``-n``).
    num_clients: Clients of the whole run (client 0's links to every one).
    runs_client_0: Whether client 0 runs here (it inherits the hard limit).
    picks_ports: Whether the launcher picks free ports (no ``--port``).
    limits: The machine's (`MachineLimits.read`).
  """
  n = local_clients
  launcher_need = launcher_files_needed(n, limits.open_now)
  client_0_need = open_files_needed(num_clients, 0, CLIENT_OPEN_AT_START)
  need = max(launcher_need, client_0_need if runs_client_0 else 0)
  hard = limits.files_hard
  if hard is not None and need > hard:
    fit = (hard - limits.open_now - LAUNCHER_SPARE) // PER_CLIENT_IN_LAUNCHER
    if runs_client_0:
      fit = min(fit, (hard - CLIENT_OPEN_AT_START - SPARE) // PER_CLIENT_ON_CLIENT_0
                - (num_clients - n))
    soft = "unlimited" if limits.files_soft is None else f"{limits.files_soft:,}"
    in_client_0 = (f" and {client_0_need:,} in client 0 (its links and JAX's "
                   "connections to every client)" if runs_client_0 else "")
    return (f"-n {n}: the clients need about {need:,} open files: {launcher_need:,} "
            f"in this launcher ({PER_CLIENT_IN_LAUNCHER} per client: its output, its "
            f"port, its log){in_client_0}; but a process here may open at most "
            f"{hard:,} (the hard RLIMIT_NOFILE; soft {soft}). Raise the "
            f"hard limit where you launch: `ulimit -Hn {need}` (as root), Docker's "
            f"`--ulimit nofile={need}:{need}`, systemd's `LimitNOFILE={need}`, or "
            f"/etc/security/limits.conf; or start at most {max(fit, 0):,} clients "
            "here.")
  if limits.pid_max is not None and n > limits.pid_max - limits.processes:
    return (f"-n {n}: this machine has room for {limits.pid_max - limits.processes:,} "
            f"more processes at most ({limits.pid_max:,} process ids, "
            f"/proc/sys/kernel/pid_max; {limits.processes:,} in use). Start fewer "
            "clients here, or spread them over more machines (--nnodes).")
  if limits.nproc is not None and n > limits.nproc:
    return (f"-n {n}: this user may run at most {limits.nproc:,} processes and "
            "threads (the soft RLIMIT_NPROC), fewer than the clients alone. Raise "
            "it (`ulimit -u`, limits.conf's nproc) or start fewer clients here.")
  if picks_ports and limits.ports is not None:
    low, high = limits.ports
    if n > high - low + 1:
      return (f"-n {n}: the launcher picks each client a free port from the "
              f"ephemeral range {low}-{high} ({high - low + 1:,} ports, "
              "/proc/sys/net/ipv4/ip_local_port_range), too few for the clients. "
              "Give --port P (clients use P..P+n-1), or start fewer clients here.")
  return None


def ensure_launch_capacity(local_clients: int, num_clients: int, runs_client_0: bool,
                           picks_ports: bool) -> None:
  """Before the launcher starts anything: raises its soft open-file limit to
  what its clients need of it, or refuses.

  Raises:
    ConfigError: This machine cannot start the clients
      (`launch_capacity_problem`'s text).
  """
  limits = MachineLimits.read()
  problem = launch_capacity_problem(local_clients, num_clients, runs_client_0,
                                    picks_ports, limits)
  if problem is not None:
    raise ConfigError(problem)
  need = launcher_files_needed(local_clients, limits.open_now)
  if limits.files_soft is not None and limits.files_soft < need:
    import resource  # pylint: disable=g-import-not-at-top
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (need, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
