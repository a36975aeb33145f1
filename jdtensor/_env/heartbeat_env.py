"""The heartbeat's settings (`HeartbeatSettings`), read and checked once.

PURE: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from jdtensor._env.names import (JDTENSOR_COORDINATION_TIMEOUT,
                                 JDTENSOR_HEARTBEAT_PERIOD, JDTENSOR_HEARTBEAT_POLICY,
                                 JDTENSOR_STALL_KILL_ALL_WAITING,
                                 JDTENSOR_STALL_TIMEOUT, JDTENSOR_STRAGGLER_THRESHOLD,
                                 JDTENSOR_STRAGGLER_WINDOW, JDTENSOR_STUCK_TIMEOUT)
from jdtensor._env.parse import MAX_TIMEOUT, environ_or_default, read_bool
from jdtensor._env.runtime_env import _coordination_timeout_variable
from jdtensor.errors import ConfigError

__all__ = ["HEARTBEAT_POLICIES", "HeartbeatSettings", "read_heartbeat_settings"]


HEARTBEAT_POLICIES = ("terminate", "raise", "log")
_PERIOD_RANGE = (0.01, 3600.0)


class HeartbeatSettings(NamedTuple):
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
    straggler_threshold: A client the others wait for in collectives more
      than this share (percent) of the straggler window is named a straggler
      on every client, once (``JDTENSOR_STRAGGLER_THRESHOLD``, default 30;
      0 disables). Never a kill.
    straggler_window: The sliding window, seconds
      (``JDTENSOR_STRAGGLER_WINDOW``, default 60, at least two periods).
  """
  period: float = 2.0
  policy: str = "terminate"
  stuck_timeout: float = 60.0
  stall_timeout: float = 300.0
  stall_kill_all_waiting: bool = False
  straggler_threshold: float = 30.0
  straggler_window: float = 60.0

  def handshake(self) -> dict[str, object]:
    """The values every client must agree on, by variable name."""
    return {JDTENSOR_HEARTBEAT_PERIOD: self.period,
            JDTENSOR_HEARTBEAT_POLICY: self.policy,
            JDTENSOR_STUCK_TIMEOUT: self.stuck_timeout,
            JDTENSOR_STALL_TIMEOUT: self.stall_timeout,
            JDTENSOR_STALL_KILL_ALL_WAITING: self.stall_kill_all_waiting,
            JDTENSOR_STRAGGLER_THRESHOLD: self.straggler_threshold,
            JDTENSOR_STRAGGLER_WINDOW: self.straggler_window}


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
  env = environ_or_default(environ)
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
  raw = env.get(JDTENSOR_STRAGGLER_THRESHOLD)
  threshold = defaults.straggler_threshold if raw is None else _percent(
      JDTENSOR_STRAGGLER_THRESHOLD, raw)
  raw = env.get(JDTENSOR_STRAGGLER_WINDOW)
  window = (max(defaults.straggler_window, 2 * period_value) if raw is None else
            _seconds(JDTENSOR_STRAGGLER_WINDOW, raw, 2 * period_value, MAX_TIMEOUT))
  return HeartbeatSettings(
      period=period_value, policy=policy_value, stuck_timeout=stuck,
      stall_timeout=stall,
      stall_kill_all_waiting=read_bool(JDTENSOR_STALL_KILL_ALL_WAITING, False, env),
      straggler_threshold=threshold, straggler_window=window)


def _percent(name: str, raw: str) -> float:
  try:
    value = float(raw.strip())
  except ValueError:
    value = float("nan")
  if not 0 <= value <= 100:  # Also rejects nan and inf.
    raise ConfigError(f"{name}={raw!r} must be a percentage from 0 (off) to 100, "
                      "e.g. 30.")
  return value
