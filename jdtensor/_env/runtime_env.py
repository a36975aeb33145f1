"""The runtime's knobs: time-outs, the coordinator's bind address, the CPU
device count, the launcher's report directory, simulated TPUs, visible GPUs.

PURE: standard library only.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, MutableMapping
from typing import NamedTuple, cast

from jdtensor._env.names import (CUDA_VISIBLE_DEVICES, JAX_NUM_CPU_DEVICES, JAX_PLATFORMS,
                                 JDTENSOR_COORDINATION_TIMEOUT,
                                 JDTENSOR_COORDINATOR_BIND_ADDRESS,
                                 JDTENSOR_HEARTBEAT_TIMEOUT, JDTENSOR_INIT_TIMEOUT,
                                 JDTENSOR_REPORT_DIR, JDTENSOR_RESTART_COUNT,
                                 JDTENSOR_TRACE_DIR,
                                 JDTENSOR_CLIENT_PROCESS,
                                 JDTENSOR_SHUTDOWN_TIMEOUT,
                                 JDTENSOR_SHARE_GPUS,
                                 JDTENSOR_SIMULATED_TPU_TOPOLOGY, XDG_RUNTIME_DIR,
                                 XLA_FLAGS, XLA_PYTHON_CLIENT_MEM_FRACTION,
                                 XLA_PYTHON_CLIENT_MEM_SETTINGS)
from jdtensor._env.parse import (INT_RE, environ_or_default, parse_bind_address,
                                 parse_timeout)
from jdtensor.errors import ConfigError

__all__ = ["JAX_DEFAULT_MEM_FRACTION", "Timeouts", "cpu_device_count_setting",
           "fit_shared_gpu_memory", "read_bind_override",
           "read_cpu_device_count", "read_jax_platforms", "read_report_dir", "read_simulated_tpu_shape",
           "read_timeouts", "read_visible_gpu_limit", "read_visible_gpus", "resolve_cpu_device_count",
           "without_cpu_device_count"]


_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


class Timeouts(NamedTuple):
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
  env = environ_or_default(environ)
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
  raw = environ_or_default(environ).get(JDTENSOR_COORDINATOR_BIND_ADDRESS)
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
  env = environ_or_default(environ)
  raw = env.get(JAX_NUM_CPU_DEVICES, "").strip()
  if raw.isascii() and raw.isdigit() and 0 < int(raw) <= 1 << 20:
    return int(raw), f"{JAX_NUM_CPU_DEVICES}={env[JAX_NUM_CPU_DEVICES]!r}"
  match = _DEVICE_COUNT_FLAG.search(env.get(XLA_FLAGS, ""))
  if match and 0 < int(match.group(1)) <= 1 << 20:
    return int(match.group(1)), f"{XLA_FLAGS}={env[XLA_FLAGS]!r}"
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
  if XLA_FLAGS in env:
    flags = _DEVICE_COUNT_FLAG.sub("", env[XLA_FLAGS]).split()
    if flags:
      env[XLA_FLAGS] = " ".join(flags)
    else:
      del env[XLA_FLAGS]
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
  env = environ_or_default(environ)
  raw = env.get(JAX_NUM_CPU_DEVICES)
  # JAX's reading: an int; negative means its default; 0 fails the backend.
  if raw is not None and (not INT_RE.fullmatch(raw.strip()) or int(raw) == 0):
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
  return environ_or_default(environ).get(JDTENSOR_REPORT_DIR) or None


def read_trace_dir(environ: Mapping[str, str] | None = None) -> str | None:
  """``JDTENSOR_TRACE_DIR`` (where this client writes its trace), or None."""
  return environ_or_default(environ).get(JDTENSOR_TRACE_DIR) or None


def read_user_runtime_dir(environ: Mapping[str, str] | None = None) -> str | None:
  """``XDG_RUNTIME_DIR`` (the user's private runtime directory), or None."""
  return environ_or_default(environ).get(XDG_RUNTIME_DIR) or None


def read_inherited_client(environ: Mapping[str, str] | None = None
                          ) -> tuple[int, int, str] | None:
  """``JDTENSOR_CLIENT_PROCESS`` when it marks another process: (its pid,
  client id, coordinator); this process inherited an initialised client's
  environment (a child of it). None when unset, this process's own mark, or
  not jdtensor's format."""
  raw = environ_or_default(environ).get(JDTENSOR_CLIENT_PROCESS, "").split(" ", 2)
  if len(raw) != 3 or not (raw[0].isdigit() and raw[1].isdigit()):
    return None
  if int(raw[0]) == os.getpid():
    return None
  return int(raw[0]), int(raw[1]), raw[2]


def mark_client_process(pid: int, client_id: int, coordinator: str,
                        environ: MutableMapping[str, str]) -> None:
  """Records in `environ` (an initialised client's own ``os.environ``) that
  process `pid` is client `client_id`, for `read_inherited_client` in its
  children."""
  environ[JDTENSOR_CLIENT_PROCESS] = f"{pid} {client_id} {coordinator}"


def read_restart_count(environ: Mapping[str, str] | None = None) -> int:
  """``JDTENSOR_RESTART_COUNT`` (set by `jdtensor launch`): 0 when unset or
  not a count (it is only shown, never acted on)."""
  raw = environ_or_default(environ).get(JDTENSOR_RESTART_COUNT, "").strip()
  return int(raw) if INT_RE.fullmatch(raw) and not raw.startswith("-") else 0


# Compiled where used (re caches it): only a TPU run reads the shape.
_TPU_SHAPE_RE = r"\s*([0-9]+)x([0-9]+)x([0-9]+)x([0-9]+)\s*"


def read_simulated_tpu_shape(environ: Mapping[str, str] | None = None
                             ) -> tuple[int, int, int, int] | None:
  """``JDTENSOR_SIMULATED_TPU_TOPOLOGY`` as (X, Y, Z, C); None when unset.

  Raises:
    ConfigError: If it is not ``XxYxZxC`` with positive sizes, C is not 1 or 2,
      or X or Y does not split into 2-chip host blocks.
  """
  raw = environ_or_default(environ).get(JDTENSOR_SIMULATED_TPU_TOPOLOGY)
  if raw is None or not raw.strip():
    return None
  match = re.fullmatch(_TPU_SHAPE_RE, raw, re.ASCII)
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


# JAX's platform names (``JAX_PLATFORMS``, ``jax_platforms``) -> DTensor's
# device types.
PLATFORM_DEVICE_TYPES = {"cpu": "CPU", "cuda": "GPU", "rocm": "GPU", "gpu": "GPU",
                         "tpu": "TPU"}


def read_jax_platforms(environ: Mapping[str, str] | None = None,
                       value: str | None = None) -> tuple[str, ...] | None:
  """The platforms JAX is limited to, in its priority order, as JAX reads
  ``JAX_PLATFORMS`` (or `value`, ``jax.config.jax_platforms``): names split
  on commas, lower-cased; None when unset or empty (every platform)."""
  raw = environ_or_default(environ).get(JAX_PLATFORMS) if value is None else value
  names = tuple(n.strip().lower() for n in (raw or "").split(",") if n.strip())
  return names or None


def read_visible_gpus(environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
  """The GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible, as written (indices
  or UUIDs), in its order; None when unset (every GPU)."""
  visible = environ_or_default(environ).get(CUDA_VISIBLE_DEVICES)
  if visible is None:
    return None
  return tuple(v.strip() for v in visible.split(",") if v.strip())


def read_visible_gpu_limit(environ: Mapping[str, str] | None = None) -> int | None:
  """How many GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible; None when unset."""
  visible = read_visible_gpus(environ)
  return None if visible is None else len(visible)


# JAX's GPU client preallocates this share of a GPU's memory by default.
JAX_DEFAULT_MEM_FRACTION = 0.75


def fit_shared_gpu_memory(sharers: int,
                          environ: MutableMapping[str, str] | None = None) -> str:
  """Where `sharers` clients share a GPU (``JDTENSOR_SHARE_GPUS``), gives this
  one an equal part of JAX's default preallocation: sets
  ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (read when the backend starts), unless
  the user chose JAX's memory use. What it did, for the log ('' for one
  client on its GPUs)."""
  if sharers <= 1:
    return ""
  env = cast(MutableMapping[str, str], environ_or_default(environ))
  chosen = [n for n in XLA_PYTHON_CLIENT_MEM_SETTINGS if n in env]
  if chosen:
    return (f"{sharers} clients share a GPU ({JDTENSOR_SHARE_GPUS}); JAX's memory "
            f"use is as set ({', '.join(chosen)})")
  fraction = max(math.floor(JAX_DEFAULT_MEM_FRACTION / sharers * 100) / 100, 0.01)
  env[XLA_PYTHON_CLIENT_MEM_FRACTION] = f"{fraction:.2f}"
  return (f"{sharers} clients share a GPU ({JDTENSOR_SHARE_GPUS}): "
          f"{XLA_PYTHON_CLIENT_MEM_FRACTION}={fraction:.2f}, an equal part of JAX's "
          f"default {JAX_DEFAULT_MEM_FRACTION:.2f}")
