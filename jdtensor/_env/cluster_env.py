"""The cluster variables: DTENSOR_JOBS and who this client is in it
(`ClusterEnv`, read once).

PURE: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from jdtensor._env.names import (DTENSOR_CLIENT_ID, DTENSOR_ENABLE_HEARTBEAT,
                                 DTENSOR_GPU_USE_NCCL_COMMUNICATION, DTENSOR_JOBS,
                                 DTENSOR_JOB_NAME, DTENSOR_NUM_CLIENTS,
                                 JDTENSOR_CLUSTER_DETECTION, JDTENSOR_RUN_SECRET)
from jdtensor._env.parse import (HOST_RE, PORT_RE, environ_or_default, parse_host,
                                 parse_int, read_bool)
from jdtensor.device_spec import NAME_RE
from jdtensor.errors import ConfigError

__all__ = ["ClusterEnv", "client_id", "detection_method", "job_name", "jobs", "normalize_address",
           "num_clients", "parse_jobs", "read_cluster_env", "read_legacy_num_clients",
           "read_run_secret", "read_seed_job_name"]


def detection_method(environ: Mapping[str, str] | None = None) -> str:
  """``JDTENSOR_CLUSTER_DETECTION``, lower-cased; ``none`` when unset or empty
  (checked by `jdtensor.cluster.detect`)."""
  raw = environ_or_default(environ).get(JDTENSOR_CLUSTER_DETECTION, "none")
  return raw.strip().lower() or "none"


def read_run_secret(environ: Mapping[str, str] | None = None) -> str | None:
  """``JDTENSOR_RUN_SECRET``, or None when unset.

  Raises:
    ConfigError: If it is set but shorter than 16 characters (guessable).
  """
  raw = environ_or_default(environ).get(JDTENSOR_RUN_SECRET)
  if raw is None:
    return None
  if len(raw.strip()) < 16:
    raise ConfigError(
        f"{JDTENSOR_RUN_SECRET} is set but has {len(raw.strip())} characters; "
        "use at least 16 random characters (e.g. `python -c \"import secrets; "
        "print(secrets.token_hex(32))\"`), the same on every client, or unset it.")
  return raw.strip()


def run_secret_hint(environ: Mapping[str, str] | None = None) -> str:
  """How to give every client the same ``JDTENSOR_RUN_SECRET`` under the
  engine this process runs under (read from the engine's own variables)."""
  env = environ_or_default(environ)
  make = ('export JDTENSOR_RUN_SECRET=$(python -c "import secrets; '
          'print(secrets.token_hex(32))")')
  if "OMPI_COMM_WORLD_SIZE" in env:
    return (f"under mpirun: `{make}`, then `mpirun -x JDTENSOR_RUN_SECRET ...` "
            "(Open MPI passes only the variables -x names)")
  if "SLURM_JOB_ID" in env:
    return (f"under SLURM: `{make}` in the batch script or shell before srun "
            "(srun passes the environment on: --export=ALL, its default; with "
            "--export=NONE or a list, add JDTENSOR_RUN_SECRET to it)")
  if "KUBERNETES_SERVICE_HOST" in env:
    return ("under Kubernetes: from one Secret in every pod's env "
            "(valueFrom.secretKeyRef)")
  return "`jdtensor launch` sets one per run; set the same one on every client"


def _bns_task_id(job: str) -> int | str:
  # DTensor's `_bns_task_id`: last path component, text before its first ':'.
  tail = job.split("/")[-1].split(":")[0]
  try:
    return int(tail)
  except ValueError:
    return job


def _check_host_port(entry: str, raw: str) -> None:
  host, sep, port = entry.rpartition(":")
  problem = ""
  if not sep or not host:
    problem = "is not of the form host:port"
  elif not HOST_RE.fullmatch(host):
    problem = f"has an invalid host {host!r}"
  elif not PORT_RE.fullmatch(port) or not 1 <= int(port) <= 65535:
    problem = f"has an invalid port {port!r} (expected 1..65535 in ASCII digits)"
  else:
    try:
      parse_host(DTENSOR_JOBS, host, raw)
    except ConfigError as e:
      problem = "has an invalid host " + str(e).split(" has an invalid host ", 1)[1]
      problem = problem.rstrip(".")
  if problem:
    raise ConfigError(
        f"{DTENSOR_JOBS}={raw!r}: entry {entry!r} {problem}. Set "
        f"{DTENSOR_JOBS} to a comma-separated list of host:port addresses, one "
        "per client in client-id order, e.g. "
        "'localhost:10000,localhost:10001'.")


def normalize_address(entry: str) -> str:
  """A checked ``DTENSOR_JOBS`` entry as JAX and sockets want it.

  ``localhost:060293`` (TF's test helper pads ports to six digits) ->
  ``localhost:60293``; BNS entries are returned unchanged.
  """
  if entry.startswith("/bns/"):
    return entry
  host, _, port = entry.rpartition(":")
  return f"{host}:{int(port)}"


def parse_jobs(raw: str | None) -> list[str]:
  """Parses ``DTENSOR_JOBS``.

  Args:
    raw: The variable's value, or None when unset.

  Returns:
    The stripped entries in client-id order; ``[]`` (local mode) when unset,
    empty or blank.

  Raises:
    ConfigError: For an empty entry, an entry that is not ``host:port`` or a
      BNS address, a duplicate entry, or BNS entries out of task order (the
      last with DTensor's exact message).
  """
  if raw is None or not raw.strip():
    return []
  entries = [e.strip() for e in raw.split(",")]
  for i, entry in enumerate(entries):
    if not entry:
      raise ConfigError(
          f"{DTENSOR_JOBS}={raw!r} has an empty entry at position {i}; remove "
          "the stray comma so that every entry is a host:port address.")
    if not entry.startswith("/bns/"):
      _check_host_port(entry, raw)
  seen: dict[str, tuple[int, str]] = {}
  for i, entry in enumerate(entries):
    address = normalize_address(entry)
    if address in seen:
      first, shown = seen[address]
      twice = (f"{entry!r} twice" if shown == entry
               else f"{address!r} twice (as {shown!r} and {entry!r})")
      raise ConfigError(
          f"{DTENSOR_JOBS}={raw!r} lists {twice} (clients {first} "
          f"and {i}); every client needs its own address.")
    seen[address] = (i, entry)
  if any(e.startswith("/bns/") for e in entries):
    keys = [_bns_task_id(e) for e in entries]
    if len({type(k) for k in keys}) > 1:
      raise ConfigError(
          f"{DTENSOR_JOBS}={raw!r} mixes BNS entries with numeric task ids and "
          "entries without one, so they cannot be sorted; give every entry a "
          "numeric task id.")
    if keys != sorted(keys):  # type: ignore[type-var]
      # DTensor-compatible message.
      raise ConfigError(
          f"Unexpected DTENSOR_JOBS content {raw}. Sort entries in DTENSOR_JOBS "
          "because cluster construction relies on the order.")
  return entries


def jobs(environ: Mapping[str, str] | None = None) -> list[str]:
  """``DTENSOR_JOBS`` as a list (see `parse_jobs`)."""
  return parse_jobs(environ_or_default(environ).get(DTENSOR_JOBS))


def num_clients(environ: Mapping[str, str] | None = None) -> int:
  """The number of clients: ``len(DTENSOR_JOBS)``, or 1 in local mode.

  Raises:
    ConfigError: If the legacy ``DTENSOR_NUM_CLIENTS`` is set and is not a
      positive integer equal to that count.
  """
  env = environ_or_default(environ)
  return _count_clients(env, parse_jobs(env.get(DTENSOR_JOBS)))


def _count_clients(env: Mapping[str, str], job_list: Sequence[str]) -> int:
  count = len(job_list) or 1
  raw_legacy = env.get(DTENSOR_NUM_CLIENTS)
  if raw_legacy is not None and raw_legacy.strip():
    legacy = parse_int(
        DTENSOR_NUM_CLIENTS, raw_legacy,
        hint=f"set it to the number of entries in {DTENSOR_JOBS}, or unset it.")
    if legacy != count:
      jobs_shown = repr(env.get(DTENSOR_JOBS)) if job_list else "unset (local mode)"
      raise ConfigError(
          f"{DTENSOR_NUM_CLIENTS}={raw_legacy!r} disagrees with {DTENSOR_JOBS}="
          f"{jobs_shown}, which names {count} client(s). Make "
          f"{DTENSOR_JOBS} list one host:port per client, and set "
          f"{DTENSOR_NUM_CLIENTS} to that count or unset it.")
  return count


def client_id(environ: Mapping[str, str] | None = None) -> int:
  """``DTENSOR_CLIENT_ID`` (default 0), checked against `num_clients`.

  Raises:
    ConfigError: If it is not an integer, or out of ``[0, num_clients)`` (the
      range errors carry DTensor's exact messages).
  """
  env = environ_or_default(environ)
  return _client_id(env, num_clients(env))


def _client_id(env: Mapping[str, str], n: int) -> int:
  raw = env.get(DTENSOR_CLIENT_ID, "0")
  value = parse_int(
      DTENSOR_CLIENT_ID, raw,
      hint="set it to this process's index in DTENSOR_JOBS (0 for the first).")
  if value < 0:
    # DTensor-compatible message (trailing ". " is verbatim).
    raise ConfigError(
        f"Environment variable DTENSOR_CLIENT_ID must be >= 0, got {value}. ")
  if value >= n:
    # DTensor-compatible message.
    raise ConfigError(
        f"Environment variable DTENSOR_CLIENT_ID must be < {n}, got {value}")
  return value


def job_name(environ: Mapping[str, str] | None = None) -> str:
  """``DTENSOR_JOB_NAME``; defaults to localhost (1 client) or worker.

  Raises:
    ConfigError: If it is not a TF job name (a letter, then letters, digits
      or underscores), since it becomes part of every device string.
  """
  env = environ_or_default(environ)
  raw = env.get(DTENSOR_JOB_NAME)
  return _job_name(env, num_clients(env) if raw is None else 0)


def _job_name(env: Mapping[str, str], n: int) -> str:
  raw = env.get(DTENSOR_JOB_NAME)
  if raw is None:
    return "localhost" if n == 1 else "worker"
  if not NAME_RE.fullmatch(raw):
    raise ConfigError(
        f"{DTENSOR_JOB_NAME}={raw!r} is not a valid job name; use a letter "
        "followed by letters, digits or '_' (e.g. 'worker'), or unset it.")
  return raw


class ClusterEnv(NamedTuple):
  """A validated snapshot of the cluster variables, taken once at init.

  Attributes:
    jobs: ``DTENSOR_JOBS`` entries (empty in local mode).
    num_clients: Number of clients.
    client_id: This process's client id.
    job_name: The DTensor job name used in device strings.
    heartbeat_enabled: ``DTENSOR_ENABLE_HEARTBEAT``.
    gpu_use_nccl_communication: ``DTENSOR_GPU_USE_NCCL_COMMUNICATION``.
  """

  jobs: tuple[str, ...]
  num_clients: int
  client_id: int
  job_name: str
  heartbeat_enabled: bool
  gpu_use_nccl_communication: bool

  @property
  def is_local_mode(self) -> bool:
    return not self.jobs

  @property
  def coordinator_address(self) -> str | None:
    """``DTENSOR_JOBS[0]`` with its port normalised (no leading zeros)."""
    return normalize_address(self.jobs[0]) if self.jobs else None


def read_cluster_env(environ: Mapping[str, str] | None = None,
                     overrides: Mapping[str, str] | None = None) -> ClusterEnv:
  """Reads and validates every cluster variable at once.

  Args:
    environ: The environment (default ``os.environ``).
    overrides: Values that win over it (a detected cluster's exports).

  Raises:
    ConfigError: For the first invalid variable found.
  """
  env = {**environ_or_default(environ), **(overrides or {})}
  job_list = parse_jobs(env.get(DTENSOR_JOBS))  # Parsed once, used by each check.
  n = _count_clients(env, job_list)
  return ClusterEnv(
      jobs=tuple(job_list),
      num_clients=n,
      client_id=_client_id(env, n),
      job_name=_job_name(env, n),
      heartbeat_enabled=read_bool(DTENSOR_ENABLE_HEARTBEAT, True, env),
      gpu_use_nccl_communication=read_bool(
          DTENSOR_GPU_USE_NCCL_COMMUNICATION, False, env),
  )


def read_legacy_num_clients(environ: Mapping[str, str] | None = None) -> int | None:
  """The legacy ``DTENSOR_NUM_CLIENTS`` as the seed reads it; None when unset.

  Raises:
    ConfigError: If it is set and not an integer.
  """
  raw = environ_or_default(environ).get(DTENSOR_NUM_CLIENTS)
  if raw is None or not raw.strip():
    return None
  return parse_int(DTENSOR_NUM_CLIENTS, raw, hint="set it to the number of clients.")


def read_seed_job_name(environ: Mapping[str, str] | None = None) -> str:
  """``DTENSOR_JOB_NAME`` as the seed's entry points read it: unchecked,
  ``localhost`` when unset (which means single-client mode there)."""
  return environ_or_default(environ).get(DTENSOR_JOB_NAME, "localhost")
