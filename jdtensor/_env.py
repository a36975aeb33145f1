"""Every environment variable jdtensor reads, parsed strictly.

PURE: standard library only. Never imports jax, never starts a backend.

Each reader takes the environment as a mapping (default: ``os.environ``), so
tests pass a dict instead of patching the process environment, and callers
read the environment at call time, as TF DTensor does (users commonly set
``DTENSOR_*`` in-process before initialising).

Differences from TF DTensor 2.21 (deliberate fixes, see README "Differences"):

* ``DTENSOR_JOBS`` entries are stripped; empty entries and entries that are
  not ``host:port`` (port 1..65535) or a ``/bns/`` address are rejected, as are
  duplicates. An empty or blank value means local mode (TF master behaviour;
  2.21 turned ``""`` into one job named ``''``).
* ``DTENSOR_CLIENT_ID`` must be a decimal integer; anything else is a
  `ConfigError` naming the variable (TF: a bare ``int()`` error).
* Boolean variables accept true/false/1/0/yes/no in any case and reject
  anything else (TF: ``"yes"`` is False, and ``"false"`` is True for the
  ``!= "0"`` variables).
* The legacy ``DTENSOR_NUM_CLIENTS`` is read again; when it disagrees with
  ``DTENSOR_JOBS`` a `ConfigError` names both (TF 2.11+ ignores it silently).
* An unsorted mix of numeric and non-numeric BNS task ids is a `ConfigError`
  (TF: a raw ``TypeError`` from ``sorted``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jdtensor.device_spec import NAME_RE
from jdtensor.errors import ConfigError

__all__ = [
    "DTENSOR_CLIENT_ID",
    "DTENSOR_JOBS",
    "DTENSOR_JOB_NAME",
    "DTENSOR_NUM_CLIENTS",
    "DTENSOR_ENABLE_HEARTBEAT",
    "DTENSOR_GPU_USE_NCCL_COMMUNICATION",
    "DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION",
    "JDTENSOR_INIT_TIMEOUT",
    "JDTENSOR_COORDINATION_TIMEOUT",
    "JDTENSOR_HEARTBEAT_TIMEOUT",
    "JDTENSOR_SHUTDOWN_TIMEOUT",
    "JDTENSOR_COORDINATOR_BIND_ADDRESS",
    "JDTENSOR_HEARTBEAT_PERIOD",
    "JDTENSOR_HEARTBEAT_POLICY",
    "JDTENSOR_STUCK_TIMEOUT",
    "JDTENSOR_STALL_TIMEOUT",
    "JDTENSOR_STALL_KILL_ALL_WAITING",
    "JDTENSOR_REPORT_DIR",
    "JDTENSOR_RUN_SECRET",
    "JDTENSOR_CLUSTER_DETECTION",
    "JDTENSOR_SIMULATED_TPU_TOPOLOGY",
    "JDTENSOR_K8S_PODS_PER_JOB",
    "JDTENSOR_K8S_NUM_JOBS",
    "JDTENSOR_K8S_SUBDOMAIN",
    "JDTENSOR_K8S_JOB_NAME",
    "JDTENSOR_RESTART_COUNT",
    "JAX_NUM_CPU_DEVICES",
    "MAX_TIMEOUT",
    "parse_host",
    "parse_port",
    "normalize_address",
    "parse_bind_address",
    "parse_timeout",
    "read_run_secret",
    "HEARTBEAT_POLICIES",
    "HeartbeatSettings",
    "read_heartbeat_settings",
    "ClusterEnv",
    "parse_bool",
    "parse_int",
    "parse_jobs",
    "jobs",
    "num_clients",
    "client_id",
    "job_name",
    "read_bool",
    "read_cluster_env",
    "Timeouts",
    "read_timeouts",
    "read_bind_override",
    "read_cpu_device_count",
    "process_environ",
    "cpu_device_count_setting",
    "resolve_cpu_device_count",
    "without_cpu_device_count",
    "read_report_dir",
    "read_legacy_num_clients",
    "read_seed_job_name",
    "read_visible_gpu_limit",
    "read_simulated_tpu_shape",
]

# DTensor's own variables (TF names, read by TF DTensor too).
DTENSOR_CLIENT_ID = "DTENSOR_CLIENT_ID"
DTENSOR_JOBS = "DTENSOR_JOBS"
DTENSOR_JOB_NAME = "DTENSOR_JOB_NAME"
DTENSOR_NUM_CLIENTS = "DTENSOR_NUM_CLIENTS"  # legacy (TF <= 2.10)
DTENSOR_ENABLE_HEARTBEAT = "DTENSOR_ENABLE_HEARTBEAT"
DTENSOR_GPU_USE_NCCL_COMMUNICATION = "DTENSOR_GPU_USE_NCCL_COMMUNICATION"
DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION = "DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION"

# jdtensor's own knobs for the JAX runtime underneath.
JDTENSOR_INIT_TIMEOUT = "JDTENSOR_INIT_TIMEOUT"
# How long JAX's coordination service waits for a silent client (its own
# heartbeat, not jdtensor's). JDTENSOR_HEARTBEAT_TIMEOUT is its deprecated
# name, read for one release.
JDTENSOR_COORDINATION_TIMEOUT = "JDTENSOR_COORDINATION_TIMEOUT"
JDTENSOR_HEARTBEAT_TIMEOUT = "JDTENSOR_HEARTBEAT_TIMEOUT"
JDTENSOR_SHUTDOWN_TIMEOUT = "JDTENSOR_SHUTDOWN_TIMEOUT"
JDTENSOR_COORDINATOR_BIND_ADDRESS = "JDTENSOR_COORDINATOR_BIND_ADDRESS"
JDTENSOR_HEARTBEAT_PERIOD = "JDTENSOR_HEARTBEAT_PERIOD"
JDTENSOR_HEARTBEAT_POLICY = "JDTENSOR_HEARTBEAT_POLICY"
JDTENSOR_STUCK_TIMEOUT = "JDTENSOR_STUCK_TIMEOUT"
JDTENSOR_STALL_TIMEOUT = "JDTENSOR_STALL_TIMEOUT"
JDTENSOR_STALL_KILL_ALL_WAITING = "JDTENSOR_STALL_KILL_ALL_WAITING"
# Set by `jdtensor launch` for its clients: where a client that stops because
# of another writes whom it blames (the launcher names the root cause).
JDTENSOR_REPORT_DIR = "JDTENSOR_REPORT_DIR"
# The run's shared secret: the start-up handshake authenticates every client
# with it (`jdtensor launch` makes one per run).
JDTENSOR_RUN_SECRET = "JDTENSOR_RUN_SECRET"
# How to find the cluster when DTENSOR_* is unset (see `jdtensor.cluster`).
JDTENSOR_CLUSTER_DETECTION = "JDTENSOR_CLUSTER_DETECTION"
# A TPU slice simulated on CPU devices, "XxYxZxC" (see `SimulatedTopology`).
JDTENSOR_SIMULATED_TPU_TOPOLOGY = "JDTENSOR_SIMULATED_TPU_TOPOLOGY"
# Kubernetes detection (`jdtensor.cluster`): what a Job or JobSet manifest
# tells its pods that Kubernetes itself does not.
JDTENSOR_K8S_PODS_PER_JOB = "JDTENSOR_K8S_PODS_PER_JOB"
JDTENSOR_K8S_NUM_JOBS = "JDTENSOR_K8S_NUM_JOBS"
JDTENSOR_K8S_SUBDOMAIN = "JDTENSOR_K8S_SUBDOMAIN"
JDTENSOR_K8S_JOB_NAME = "JDTENSOR_K8S_JOB_NAME"
# Set by `jdtensor launch --max-restarts` for its clients: 0 on the first
# attempt, then 1, 2, ...
JDTENSOR_RESTART_COUNT = "JDTENSOR_RESTART_COUNT"

# JAX's own variables that jdtensor reads (never writes).
JAX_NUM_CPU_DEVICES = "JAX_NUM_CPU_DEVICES"
_XLA_FLAGS = "XLA_FLAGS"
_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")

_TRUE = frozenset({"1", "true", "yes"})
_FALSE = frozenset({"0", "false", "no"})
# ASCII digits only: str.isdigit() accepts '²' and Arabic-Indic digits.
_INT_RE = re.compile(r"[+-]?[0-9]{1,18}", re.ASCII)
# Leading zeros are allowed: TF's own multi-client test helper writes
# f"localhost:{port:06d}" and TF accepts it. The value is what is checked.
_PORT_RE = re.compile(r"[0-9]{1,16}", re.ASCII)
_HOST_RE = re.compile(r"[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.%A-Za-z]+\]", re.ASCII)
# Longest timeout accepted anywhere (a week): JAX's time-outs are C ints of
# seconds, and "wait forever" is never what a run wants.
MAX_TIMEOUT = 7 * 24 * 3600.0


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
  return os.environ if environ is None else environ


def process_environ() -> Mapping[str, str]:
  """This process's environment (``os.environ``), for code that hands it on."""
  return os.environ


def parse_bool(name: str, raw: str) -> bool:
  """Parses a boolean variable strictly.

  Args:
    name: The variable's name, for the error message.
    raw: Its value.

  Returns:
    True for 1/true/yes and False for 0/false/no, in any case, ignoring
    surrounding blanks.

  Raises:
    ConfigError: For any other value.
  """
  value = raw.strip().lower()
  if value in _TRUE:
    return True
  if value in _FALSE:
    return False
  raise ConfigError(
      f"{name}={raw!r} is not a boolean; use one of true/false, 1/0 or yes/no "
      "(any case), or unset it for the default.")


def parse_int(name: str, raw: str, *, hint: str = "") -> int:
  """Parses a decimal integer variable strictly (no ``int()`` leniency).

  Args:
    name: The variable's name, for the error message.
    raw: Its value.
    hint: What to set it to, appended to the error message.

  Returns:
    The integer.

  Raises:
    ConfigError: If the value is not a decimal integer.
  """
  value = raw.strip()
  if not _INT_RE.fullmatch(value):
    shown = raw if len(raw) <= 40 else raw[:20] + "..." + raw[-10:]
    what = ("is too long for an integer" if re.fullmatch(r"[+-]?[0-9]+", value,
                                                        re.ASCII)
            else "is not an integer")
    raise ConfigError(f"{name}={shown!r} {what}" + (f"; {hint}" if hint else "."))
  return int(value)


def parse_timeout(name: str, raw: object) -> float:
  """A time-out in seconds: a number above 0 and at most `MAX_TIMEOUT`.

  Raises:
    ConfigError: Naming `name` and showing the value otherwise.
  """
  if isinstance(raw, bool):
    value = float("nan")
  else:
    try:
      value = float(raw.strip() if isinstance(raw, str) else raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
      value = float("nan")
  if not 0 < value <= MAX_TIMEOUT:
    raise ConfigError(f"{name}={raw!r} must be a number of seconds above 0 and at "
                      f"most {MAX_TIMEOUT:g} (a week).")
  return value


def parse_port(name: str, raw: str, what: str) -> int:
  """A TCP port: ASCII decimal digits (leading zeros allowed), 1..65535.

  Raises:
    ConfigError: ``{name}={raw!r}: {what} has an invalid port ...``.
  """
  if not _PORT_RE.fullmatch(raw) or not 1 <= int(raw) <= 65535:
    raise ConfigError(f"{name}={what!r} has an invalid port {raw!r} (expected "
                      "1..65535 in ASCII digits).")
  return int(raw)


def parse_host(name: str, host: str, shown: str) -> str:
  """A host name or address: ASCII, DNS labels of 1-63 characters.

  Raises:
    ConfigError: ``{name}={shown!r} has an invalid host ...``.
  """
  problem = ""
  if not _HOST_RE.fullmatch(host):
    problem = "it may hold only ASCII letters, digits, '.', '-' and '_', or be [IPv6]"
  elif not host.startswith("["):
    labels = host.rstrip(".").split(".")
    if len(host) > 253:
      problem = "a host name has at most 253 characters"
    elif any(not 1 <= len(label) <= 63 for label in labels):
      problem = "each dot-separated part of a host name has 1 to 63 characters"
  if problem:
    raise ConfigError(f"{name}={shown!r} has an invalid host {host!r}: {problem}.")
  return host.strip("[]")


def parse_bind_address(name: str, raw: object) -> tuple[str | None, int | None]:
  """``JDTENSOR_COORDINATOR_BIND_ADDRESS``: a host, ``host:port`` or ``:port``.

  Returns:
    (host or None, port or None): what to use instead of DTENSOR_JOBS[0]'s.

  Raises:
    TypeError: If it is not a str.
    ConfigError: For a bad host or a port outside 1..65535 (``:0`` included:
      a random port nobody could find).
  """
  if not isinstance(raw, str):
    raise TypeError(f"{name} must be a str like 'host', 'host:port' or "
                    f"'[::1]:port', got {raw!r} of type {type(raw).__name__}.")
  text = raw.strip()
  if not text:
    raise ConfigError(f"{name}={raw!r} is empty; give a host, host:port or "
                      "[IPv6]:port, or unset it.")
  if text.startswith("["):
    host, sep, rest = text.partition("]")
    host += "]"
    port_text = rest[1:] if rest.startswith(":") else None
    if rest and port_text is None:
      raise ConfigError(f"{name}={raw!r} is not [IPv6] or [IPv6]:port.")
  elif text.count(":") == 1:
    host, _, port_text = text.partition(":")
  elif ":" in text:  # A bare IPv6 address.
    host, port_text = f"[{text}]", None
  else:
    host, port_text = text, None
  port = parse_port(name, port_text, raw) if port_text is not None else None
  return (parse_host(name, host, raw) if host else None), port


def read_run_secret(environ: Mapping[str, str] | None = None) -> str | None:
  """``JDTENSOR_RUN_SECRET``, or None when unset.

  Raises:
    ConfigError: If it is set but shorter than 16 characters (guessable).
  """
  raw = _environ(environ).get(JDTENSOR_RUN_SECRET)
  if raw is None:
    return None
  if len(raw.strip()) < 16:
    raise ConfigError(
        f"{JDTENSOR_RUN_SECRET} is set but has {len(raw.strip())} characters; "
        "use at least 16 random characters (e.g. `python -c \"import secrets; "
        "print(secrets.token_hex(32))\"`), the same on every client, or unset it.")
  return raw.strip()


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
  elif not _HOST_RE.fullmatch(host):
    problem = f"has an invalid host {host!r}"
  elif not _PORT_RE.fullmatch(port) or not 1 <= int(port) <= 65535:
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
  return parse_jobs(_environ(environ).get(DTENSOR_JOBS))


def num_clients(environ: Mapping[str, str] | None = None) -> int:
  """The number of clients: ``len(DTENSOR_JOBS)``, or 1 in local mode.

  Raises:
    ConfigError: If the legacy ``DTENSOR_NUM_CLIENTS`` is set and is not a
      positive integer equal to that count.
  """
  env = _environ(environ)
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
  env = _environ(environ)
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
  env = _environ(environ)
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


def read_bool(name: str, default: bool,
              environ: Mapping[str, str] | None = None) -> bool:
  """Reads a boolean variable with `parse_bool`, or `default` when unset."""
  raw = _environ(environ).get(name)
  return default if raw is None else parse_bool(name, raw)


@dataclass(frozen=True)
class ClusterEnv:
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
  env = {**_environ(environ), **(overrides or {})}
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


@dataclass(frozen=True)
class Timeouts:
  """Multi-client start-up and runtime time-outs, in seconds.

  Attributes:
    init: Start-up in all: the rendezvous and JAX's registration
      (``JDTENSOR_INIT_TIMEOUT``, default 120).
    coordination: How long JAX's coordination service waits for a silent
      client before declaring it dead (``JDTENSOR_COORDINATION_TIMEOUT``,
      default 100, JAX's default). JAX's heartbeat, not jdtensor's.
    shutdown: How long the shutdown barrier at exit waits for the other
      clients (``JDTENSOR_SHUTDOWN_TIMEOUT``, default 60).
  """
  init: float = 120.0
  coordination: float = 100.0
  shutdown: float = 60.0


def _coordination_timeout_variable(env: Mapping[str, str]) -> str | None:
  """Which variable gives the coordination time-out: the new name, or the
  deprecated one (with a warning); both set to different values is an error."""
  new, old = env.get(JDTENSOR_COORDINATION_TIMEOUT), env.get(JDTENSOR_HEARTBEAT_TIMEOUT)
  if old is None:
    return JDTENSOR_COORDINATION_TIMEOUT if new is not None else None
  if new is not None and new.strip() != old.strip():
    raise ConfigError(
        f"{JDTENSOR_COORDINATION_TIMEOUT}={new!r} and its deprecated name "
        f"{JDTENSOR_HEARTBEAT_TIMEOUT}={old!r} disagree; unset "
        f"{JDTENSOR_HEARTBEAT_TIMEOUT}.")
  if new is None:
    import logging  # pylint: disable=g-import-not-at-top
    logging.getLogger("jdtensor").warning(
        "%s is deprecated: it is JAX's coordination-service time-out, not "
        "jdtensor's heartbeat; set %s instead.", JDTENSOR_HEARTBEAT_TIMEOUT,
        JDTENSOR_COORDINATION_TIMEOUT)
    return JDTENSOR_HEARTBEAT_TIMEOUT
  return JDTENSOR_COORDINATION_TIMEOUT


def read_timeouts(environ: Mapping[str, str] | None = None, *,
                  init: float | None = None, coordination: float | None = None,
                  shutdown: float | None = None) -> Timeouts:
  """Time-outs: explicit arguments win over the variables, then defaults.

  Raises:
    ConfigError: For a variable or argument that is not a number > 0, or the
      coordination time-out set under both its names with different values.
  """
  env = _environ(environ)
  defaults = Timeouts()
  values = {}
  for field_name, var, arg in (
      ("init", JDTENSOR_INIT_TIMEOUT, init),
      ("coordination", _coordination_timeout_variable(env), coordination),
      ("shutdown", JDTENSOR_SHUTDOWN_TIMEOUT, shutdown)):
    if arg is not None:
      values[field_name] = parse_timeout(f"{field_name}_timeout", arg)
    elif var is not None and env.get(var) is not None:
      values[field_name] = parse_timeout(var, env[var])
    else:
      values[field_name] = getattr(defaults, field_name)
  return Timeouts(**values)


def read_bind_override(argument: object = None,
                       environ: Mapping[str, str] | None = None
                       ) -> tuple[str | None, int | None]:
  """Where client 0's coordinator listens: the ``coordinator_bind_address``
  argument, else ``JDTENSOR_COORDINATOR_BIND_ADDRESS``; (None, None) for the
  default (see `parse_bind_address`)."""
  if argument is not None:
    return parse_bind_address("coordinator_bind_address", argument)
  raw = _environ(environ).get(JDTENSOR_COORDINATOR_BIND_ADDRESS)
  if raw is not None:
    return parse_bind_address(JDTENSOR_COORDINATOR_BIND_ADDRESS, raw)
  return None, None


def cpu_device_count_setting(environ: Mapping[str, str] | None = None
                             ) -> tuple[int, str] | None:
  """The CPU device count the environment gives JAX, and where it is set.

  JAX's own reading and precedence: ``JAX_NUM_CPU_DEVICES``, else XLA's
  ``--xla_force_host_platform_device_count`` in ``XLA_FLAGS``; a value that
  is not a positive integer is ignored.

  Returns:
    (count, ``"NAME='value'"``), or None if neither is set.
  """
  env = _environ(environ)
  raw = env.get(JAX_NUM_CPU_DEVICES, "").strip()
  if raw.isascii() and raw.isdigit() and 0 < int(raw) <= 1 << 20:
    return int(raw), f"{JAX_NUM_CPU_DEVICES}={env[JAX_NUM_CPU_DEVICES]!r}"
  match = _DEVICE_COUNT_FLAG.search(env.get(_XLA_FLAGS, ""))
  if match and 0 < int(match.group(1)) <= 1 << 20:
    return int(match.group(1)), f"{_XLA_FLAGS}={env[_XLA_FLAGS]!r}"
  return None


def read_cpu_device_count(environ: Mapping[str, str] | None = None) -> int | None:
  """The CPU device count the environment gives JAX (see
  `cpu_device_count_setting`); None if it sets none."""
  setting = cpu_device_count_setting(environ)
  return setting[0] if setting else None


def without_cpu_device_count(environ: Mapping[str, str]) -> dict[str, str]:
  """`environ` without its CPU device count (``JAX_NUM_CPU_DEVICES`` and the
  flag in ``XLA_FLAGS``; XLA's other flags are kept)."""
  env = dict(environ)
  env.pop(JAX_NUM_CPU_DEVICES, None)
  if _XLA_FLAGS in env:
    flags = _DEVICE_COUNT_FLAG.sub("", env[_XLA_FLAGS]).split()
    if flags:
      env[_XLA_FLAGS] = " ".join(flags)
    else:
      del env[_XLA_FLAGS]
  return env


def resolve_cpu_device_count(requested: int | None, argument: str,
                             environ: Mapping[str, str] | None = None
                             ) -> int | None:
  """One CPU device count from an explicit argument and the environment.

  The rule for `jdtensor launch`, `jdtensor.testing` and
  `initialize_accelerator_system`: the argument when given, else the count the
  environment gives JAX (``JAX_NUM_CPU_DEVICES``, ``XLA_FLAGS``'s
  ``--xla_force_host_platform_device_count``), else None (JAX's default: 1).

  Args:
    requested: The explicit count, or None.
    argument: How the caller spells the argument (``--devices-per-client``,
      ``num_logical_cpu_devices``), for the error.
    environ: The environment the JAX process will read.

  Raises:
    ConfigError: If both are given and differ, naming both, or if
      ``JAX_NUM_CPU_DEVICES`` is set to something JAX refuses.
  """
  env = _environ(environ)
  raw = env.get(JAX_NUM_CPU_DEVICES)
  # JAX's reading: an int; negative means its default; 0 fails the backend.
  if raw is not None and (not _INT_RE.fullmatch(raw.strip()) or int(raw) == 0):
    raise ConfigError(
        f"{JAX_NUM_CPU_DEVICES}={raw!r} in the environment is not a CPU device "
        "count (JAX refuses it when it is imported); set a positive integer, "
        f"or unset it and give {argument}.")
  setting = cpu_device_count_setting(env)
  if setting is None:
    return requested
  count, where = setting
  if requested is None or requested == count:
    return count
  shown = f"{argument} {requested}" if argument.startswith("-") else (
      f"{argument}={requested}")
  raise ConfigError(
      f"{shown} conflicts with {where} in the environment, "
      f"which gives JAX {count} CPU device(s) per process; give the count once: "
      f"drop {argument} to use the environment's {count}, or remove the device "
      "count from the environment.")


def read_report_dir(environ: Mapping[str, str] | None = None) -> str | None:
  """``JDTENSOR_REPORT_DIR`` (set by `jdtensor launch`), or None."""
  return _environ(environ).get(JDTENSOR_REPORT_DIR) or None


def read_legacy_num_clients(environ: Mapping[str, str] | None = None) -> int | None:
  """The legacy ``DTENSOR_NUM_CLIENTS`` as the seed reads it; None when unset.

  Raises:
    ConfigError: If it is set and not an integer.
  """
  raw = _environ(environ).get(DTENSOR_NUM_CLIENTS)
  if raw is None or not raw.strip():
    return None
  return parse_int(DTENSOR_NUM_CLIENTS, raw, hint="set it to the number of clients.")


def read_seed_job_name(environ: Mapping[str, str] | None = None) -> str:
  """``DTENSOR_JOB_NAME`` as the seed's entry points read it: unchecked,
  ``localhost`` when unset (which means single-client mode there)."""
  return _environ(environ).get(DTENSOR_JOB_NAME, "localhost")


_TPU_SHAPE_RE = re.compile(r"\s*([0-9]+)x([0-9]+)x([0-9]+)x([0-9]+)\s*", re.ASCII)


def read_simulated_tpu_shape(environ: Mapping[str, str] | None = None
                             ) -> tuple[int, int, int, int] | None:
  """``JDTENSOR_SIMULATED_TPU_TOPOLOGY`` as (X, Y, Z, C); None when unset.

  Raises:
    ConfigError: If it is not ``XxYxZxC`` with positive sizes, C is not 1 or 2,
      or X or Y does not split into 2-chip host blocks.
  """
  raw = _environ(environ).get(JDTENSOR_SIMULATED_TPU_TOPOLOGY)
  if raw is None or not raw.strip():
    return None
  match = _TPU_SHAPE_RE.fullmatch(raw)
  name = JDTENSOR_SIMULATED_TPU_TOPOLOGY
  if not match or any(not 1 <= int(g) <= 1 << 16 for g in match.groups()):
    raise ConfigError(
        f"{name}={raw!r} is not a TPU slice shape; use XxYxZxC with positive "
        "chip counts along x, y, z and cores per chip, e.g. '2x2x1x2' (one host "
        "of 8 cores) or '4x4x1x2' (4 hosts).")
  shape = tuple(int(g) for g in match.groups())
  if shape[3] not in (1, 2):
    raise ConfigError(f"{name}={raw!r}: TPU chips have 1 or 2 cores, got "
                      f"{shape[3]}.")
  for axis, size in (("x", shape[0]), ("y", shape[1])):
    if size > 1 and size % 2:
      raise ConfigError(
          f"{name}={raw!r} does not divide into hosts: hosts are 2x2-chip "
          f"blocks, so the {axis} size must be 1 or even, got {size}.")
  return shape  # type: ignore[return-value]


def read_visible_gpu_limit(environ: Mapping[str, str] | None = None) -> int | None:
  """How many GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible; None when unset."""
  visible = _environ(environ).get(_CUDA_VISIBLE_DEVICES)
  if visible is None:
    return None
  return len([v for v in visible.split(",") if v.strip()])


HEARTBEAT_POLICIES = ("terminate", "raise", "log")
_PERIOD_RANGE = (0.01, 3600.0)


@dataclass(frozen=True)
class HeartbeatSettings:
  """The heartbeat's settings; every client must have the same.

  Attributes:
    period: Seconds between beats (``JDTENSOR_HEARTBEAT_PERIOD``, default 2,
      0.01 to 3600).
    policy: What a client does when another fails: terminate, raise or log
      (``JDTENSOR_HEARTBEAT_POLICY``, default terminate).
    stuck_timeout: Seconds a beat may take before the clients that did not
      join it are named stuck (``JDTENSOR_STUCK_TIMEOUT``, default 60, at
      least twice the period): a process that is alive but whose heartbeat
      cannot run (SIGSTOP, swapped out, a GIL held by C code). Long enough
      that a 20 s GIL hold or a GC pause never stops a job, and shorter than
      JAX's own coordination heartbeat (100 s), which aborts every client.
    stall_timeout: Seconds a client may go without joining the collective
      every other client waits in before it is named stalled
      (``JDTENSOR_STALL_TIMEOUT``, default 300; 0 disables).
    stall_kill_all_waiting: When every client has waited in a collective for
      the stall timeout (a long computation, or a deadlock), fail the run
      instead of only logging each client's stack
      (``JDTENSOR_STALL_KILL_ALL_WAITING``, default false).
  """
  period: float = 2.0
  policy: str = "terminate"
  stuck_timeout: float = 60.0
  stall_timeout: float = 300.0
  stall_kill_all_waiting: bool = False

  def handshake(self) -> dict[str, object]:
    """The values every client must agree on, by variable name."""
    return {JDTENSOR_HEARTBEAT_PERIOD: self.period,
            JDTENSOR_HEARTBEAT_POLICY: self.policy,
            JDTENSOR_STUCK_TIMEOUT: self.stuck_timeout,
            JDTENSOR_STALL_TIMEOUT: self.stall_timeout,
            JDTENSOR_STALL_KILL_ALL_WAITING: self.stall_kill_all_waiting}


def _seconds(name: str, raw: str, low: float, high: float, zero_ok: bool = False
             ) -> float:
  try:
    value = float(raw.strip())
  except ValueError:
    value = float("nan")
  if zero_ok and value == 0:
    return 0.0
  if not low <= value <= high:  # Also rejects nan and inf.
    allowed = f"a number of seconds from {low:g} to {high:g}"
    raise ConfigError(f"{name}={raw!r} must be "
                      + (f"0 (off) or {allowed}." if zero_ok else f"{allowed}."))
  return value


def _check_stuck_below_coordination(stuck: float, explicit: bool, period: float,
                                    coordination: float, coordination_name: str | None,
                                    env: Mapping[str, str]) -> None:
  """A stopped (SIGSTOP) or frozen client is named by jdtensor after the
  stuck time-out, and JAX's coordination service aborts every client from
  C++ after the coordination time-out: the first must come first, or nobody
  is ever named."""
  if stuck < coordination:
    return
  name = coordination_name or _coordination_timeout_variable(env) or (
      f"{JDTENSOR_COORDINATION_TIMEOUT} (default)")
  what = (f"{JDTENSOR_STUCK_TIMEOUT}={env.get(JDTENSOR_STUCK_TIMEOUT)!r}" if explicit else
          f"{JDTENSOR_STUCK_TIMEOUT} (default {stuck:g})")
  raise ConfigError(
      f"{what} must be shorter than {name}={coordination:g}: JAX aborts every "
      f"client {coordination:g} s after one stops answering, before jdtensor can "
      f"name it. Set {JDTENSOR_STUCK_TIMEOUT} below {coordination:g} (at least "
      f"{2 * period:g}, two heartbeat periods) or the coordination time-out above "
      f"{stuck:g}.")


def read_heartbeat_settings(environ: Mapping[str, str] | None = None, *,
                            period: float | None = None,
                            policy: str | None = None,
                            coordination: float | None = None,
                            coordination_name: str | None = None) -> HeartbeatSettings:
  """The heartbeat's settings: explicit arguments win over the variables.

  Args:
    environ: The variables (default ``os.environ``).
    period, policy: Arguments that win over their variables.
    coordination: JAX's coordination time-out, when known: the stuck
      time-out must be shorter (a frozen process stops JAX's heartbeat too,
      and JAX then aborts every client first).
    coordination_name: The argument that gave `coordination`, for messages.

  Raises:
    ConfigError: For a value out of range, a stuck time-out shorter than two
      periods or not shorter than the coordination time-out; the message
      names the variable (or argument).
  """
  env = _environ(environ)
  defaults = HeartbeatSettings()

  def pick(name: str, arg: object) -> tuple[str, str] | None:
    """(name to show, raw value) of an argument or variable; None if unset."""
    if arg is not None:  # The argument's name: period=..., policy=...
      return name.lower().removeprefix("jdtensor_heartbeat_"), str(arg)
    raw = env.get(name)
    return None if raw is None else (name, raw)
  got = pick(JDTENSOR_HEARTBEAT_PERIOD, period)
  period_value = (defaults.period if got is None else
                  _seconds(got[0], got[1], *_PERIOD_RANGE))
  got = pick(JDTENSOR_HEARTBEAT_POLICY, policy)
  policy_value = defaults.policy if got is None else got[1].strip().lower()
  if got is not None and policy_value not in HEARTBEAT_POLICIES:
    raise ConfigError(f"{got[0]}={got[1]!r} is not one of "
                      f"{', '.join(HEARTBEAT_POLICIES)}.")
  raw = env.get(JDTENSOR_STUCK_TIMEOUT)
  stuck = (max(defaults.stuck_timeout, 2 * period_value) if raw is None else
           _seconds(JDTENSOR_STUCK_TIMEOUT, raw, 1.0, MAX_TIMEOUT))
  if coordination is not None:
    _check_stuck_below_coordination(stuck, raw is not None, period_value, coordination,
                                    coordination_name, env)
  if stuck < 2 * period_value:
    raise ConfigError(
        f"{JDTENSOR_STUCK_TIMEOUT}={raw!r} must be at least twice the heartbeat "
        f"period ({period_value:g} s): a beat may take a period to start.")
  raw = env.get(JDTENSOR_STALL_TIMEOUT)
  stall = (defaults.stall_timeout if raw is None else
           _seconds(JDTENSOR_STALL_TIMEOUT, raw, 1.0, MAX_TIMEOUT, zero_ok=True))
  return HeartbeatSettings(
      period=period_value, policy=policy_value, stuck_timeout=stuck,
      stall_timeout=stall,
      stall_kill_all_waiting=read_bool(JDTENSOR_STALL_KILL_ALL_WAITING, False, env))
