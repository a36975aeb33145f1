"""The heartbeat's settings (`HeartbeatSettings`), read and checked once.

PURE: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from jdtensor._env.names import (JDTENSOR_COORDINATION_TIMEOUT,
                                 JDTENSOR_HEARTBEAT_PERIOD, JDTENSOR_HEARTBEAT_POLICY,
                                 JDTENSOR_STALL_FLOOR, JDTENSOR_STALL_KILL_ALL_WAITING,
                                 JDTENSOR_DEADLOCK_TIMEOUT,
                                 JDTENSOR_STALL_LEARN, JDTENSOR_STALL_TIMEOUT, JDTENSOR_STRAGGLER_THRESHOLD,
                                 JDTENSOR_STRAGGLER_WINDOW, JDTENSOR_STUCK_TIMEOUT)
from jdtensor._env.parse import MAX_TIMEOUT, environ_or_default, parse_timeout, read_bool
from jdtensor._env.runtime_env import Timeouts, _coordination_timeout_variable
from jdtensor.errors import ConfigError

__all__ = ["HEARTBEAT_POLICIES", "HeartbeatSettings", "STUCK_SHARE_OF_COORDINATION",
           "read_heartbeat_and_coordination", "read_heartbeat_settings",
           "settle_timeouts"]


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
      (``JDTENSOR_STALL_TIMEOUT``, default 300; 0 disables); with
      `stall_learn`, the ceiling of the learnt time-out.
    stall_learn: Learn the stall time-out from the run
      (``JDTENSOR_STALL_LEARN``, default true;
      `jdtensor.heartbeat.verdicts.StallTimeout`): for a pause that began
      once the run showed its rhythm, the longest idle pause of a client's
      own code that the others waited for, times `STALL_SAFETY_FACTOR`,
      between `stall_floor` and `stall_timeout`.
    stall_floor: The learnt time-out's floor (``JDTENSOR_STALL_FLOOR``,
      default 60, at most `stall_timeout`; one not set is lowered to it): a
      rare idle pause shorter than this (a slow data load, a file system
      hiccup) is never a stall, however steady the run was before.
    stall_kill_all_waiting: When every client has waited in a collective for
      the stall timeout (a long computation, or a deadlock), fail the run
      instead of only logging each client's stack
      (``JDTENSOR_STALL_KILL_ALL_WAITING``, default false).
    deadlock_timeout: When every client has waited in a collective this
      long with its process idle (a deadlock: clients that issued different
      collectives, or a collective one of them never reaches), the run ends
      with every client's stack (``JDTENSOR_DEADLOCK_TIMEOUT``, default 600:
      NCCL's watchdog's 10 minutes; 0: never, only the warning at the stall
      time-out). A long computation keeps its process busy and is never
      taken for one, on CPU; on a GPU or TPU a single device call longer
      than this would be.
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
  deadlock_timeout: float = 600.0
  stall_learn: bool = True
  stall_floor: float = 60.0
  straggler_threshold: float = 30.0
  straggler_window: float = 60.0

  def handshake(self) -> dict[str, object]:
    """The values every client must agree on, by variable name."""
    return {JDTENSOR_HEARTBEAT_PERIOD: self.period,
            JDTENSOR_HEARTBEAT_POLICY: self.policy,
            JDTENSOR_STUCK_TIMEOUT: self.stuck_timeout,
            JDTENSOR_STALL_TIMEOUT: self.stall_timeout,
            JDTENSOR_STALL_KILL_ALL_WAITING: self.stall_kill_all_waiting,
            JDTENSOR_DEADLOCK_TIMEOUT: self.deadlock_timeout,
            JDTENSOR_STALL_LEARN: self.stall_learn,
            JDTENSOR_STALL_FLOOR: self.stall_floor,
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


# A stuck time-out the user did not set is this share of a coordination
# time-out they did set, when the default does not fit below it: 60 s against
# JAX's default 100 s. The rest is the time jdtensor has to name the stuck
# client (a roll call, a period or two) before JAX aborts every client.
STUCK_SHARE_OF_COORDINATION = 0.6
# A heartbeat period the user did not set is a quarter of the stuck time-out,
# at most the default 2 s: a beat may take a period to start, and a stuck
# client should miss more than one beat before it is named.
_PERIODS_PER_STUCK_TIMEOUT = 4


class _Setting(NamedTuple):
  """A value and how the user gave it: ``shown`` names the variable or
  argument with its raw text (``"JDTENSOR_STUCK_TIMEOUT='300'"``), or is None
  when the value is jdtensor's default or derived from other settings."""
  value: float
  shown: str | None


def settle_timeouts(stuck: _Setting | None, period: _Setting | None,
                    coordination: _Setting | None
                    ) -> tuple[float, float, float, list[str]]:
  """The stuck time-out, the heartbeat period and JAX's coordination time-out
  that fit together, each left unset derived from those set.

  The rules, for a frozen client to be named before JAX aborts every client
  and for a beat to have time to start (``stuck >= 2 * period``):

  * stuck unset: the default 60 s, but at most `STUCK_SHARE_OF_COORDINATION`
    of a coordination time-out that was set, and at least two periods that
    were set;
  * period unset: a quarter of the stuck time-out, at most 2 s;
  * coordination unset: the default 100 s (JAX's), or the stuck time-out over
    `STUCK_SHARE_OF_COORDINATION`, in whole seconds (what JAX takes), if that
    is longer.

  Only settings the user gave can contradict each other; then a `ConfigError`
  names both, with their values and the fix.

  Args:
    stuck, period, coordination: What the user set (None: unset).

  Returns:
    (stuck, period, coordination, notes): the notes say, for the log, each
    value derived from another setting rather than left at its default.
  """
  defaults = HeartbeatSettings()
  notes: list[str] = []
  # JAX takes its heartbeat time-out in whole seconds (startup rounds up).
  coordination_value = (float(math.ceil(coordination.value)) if coordination is not None
                        else Timeouts().coordination)
  if stuck is not None:
    stuck_value = stuck.value
  else:
    stuck_value = defaults.stuck_timeout
    if coordination is not None and stuck_value >= coordination_value:
      stuck_value = STUCK_SHARE_OF_COORDINATION * coordination_value
      notes.append(f"{JDTENSOR_STUCK_TIMEOUT} {stuck_value:g} s, "
                   f"{STUCK_SHARE_OF_COORDINATION:g} of {coordination.shown} (JAX "
                   "aborts every client once one is silent that long; jdtensor must "
                   "name a stuck client first)")
    if period is not None and stuck_value < 2 * period.value:
      stuck_value = 2 * period.value
      notes.append(f"{JDTENSOR_STUCK_TIMEOUT} {stuck_value:g} s, two periods of "
                   f"{period.shown}")
  if period is not None:
    period_value = period.value
  else:
    period_value = min(defaults.period, stuck_value / _PERIODS_PER_STUCK_TIMEOUT)
    if period_value != defaults.period:
      notes.append(f"{JDTENSOR_HEARTBEAT_PERIOD} {period_value:g} s, a quarter of "
                   f"the stuck time-out")
  if stuck is not None and period is not None and stuck_value < 2 * period_value:
    raise ConfigError(
        f"{stuck.shown} must be at least twice the heartbeat period "
        f"({period.shown}): a beat may take a period to start. Set "
        f"{JDTENSOR_STUCK_TIMEOUT} to at least {2 * period_value:g} or the period "
        f"to at most {stuck_value / 2:g}.")
  if stuck_value < coordination_value:
    return stuck_value, period_value, coordination_value, notes
  if coordination is None:
    coordination_value = float(math.ceil(stuck_value / STUCK_SHARE_OF_COORDINATION))
    notes.append(f"{JDTENSOR_COORDINATION_TIMEOUT} {coordination_value:g} s, the "
                 f"stuck time-out over {STUCK_SHARE_OF_COORDINATION:g} (JAX's own "
                 "heartbeat must outlast jdtensor's)")
    return stuck_value, period_value, coordination_value, notes
  if stuck is None:  # Two periods of a period that was set.
    raise ConfigError(
        f"{period.shown} needs a stuck time-out of at least {stuck_value:g} s "  # type: ignore[union-attr]
        f"(two periods), which must be shorter than {coordination.shown}: JAX "
        f"aborts every client {coordination_value:g} s after one stops answering, "
        f"before jdtensor can name it. Set the period below "
        f"{coordination_value / 2:g} or the coordination time-out above "
        f"{stuck_value:g}.")
  low = f" (at least {2 * period_value:g}, two heartbeat periods)" if period else ""
  raise ConfigError(
      f"{stuck.shown} must be shorter than {coordination.shown}: JAX aborts every "
      f"client {coordination_value:g} s after one stops answering, before jdtensor "
      f"can name it. Set {JDTENSOR_STUCK_TIMEOUT} below {coordination_value:g}{low} "
      f"or the coordination time-out above {stuck_value:g}, or leave one of them "
      "unset: jdtensor derives it from the other.")


def read_heartbeat_settings(environ: Mapping[str, str] | None = None, *,
                            period: float | None = None,
                            policy: str | None = None,
                            coordination: float | None = None,
                            coordination_name: str | None = None) -> HeartbeatSettings:
  """The heartbeat's settings: explicit arguments win over the variables.

  Args:
    environ: The variables (default ``os.environ``).
    period, policy: Arguments that win over their variables.
    coordination: JAX's coordination time-out in force (already started):
      the stuck time-out must be shorter (a frozen process stops JAX's
      heartbeat too, and JAX then aborts every client first), and a stuck
      time-out left unset is derived below it.
    coordination_name: The argument that gave `coordination`, for messages.

  Raises:
    ConfigError: For a value out of range, or settings the user gave that
      contradict each other (see `settle_timeouts`); the message names the
      variables (or arguments).
  """
  env = environ_or_default(environ)
  if coordination is None:
    return _read(env, period, policy, None)[0]
  name = coordination_name or _coordination_timeout_variable(env)
  shown = (f"{name}={coordination:g}" if name is not None else
           f"the coordination time-out in force ({coordination:g} s)")
  return _read(env, period, policy, _Setting(coordination, shown))[0]


def read_heartbeat_and_coordination(environ: Mapping[str, str] | None = None, *,
                                    coordination: float | None = None
                                    ) -> tuple[HeartbeatSettings, float]:
  """Before start-up: the heartbeat's settings and JAX's coordination time-out,
  each left unset derived from those set (`settle_timeouts`), and the
  derivations logged once.

  Args:
    environ: The variables (default ``os.environ``).
    coordination: The ``coordination_timeout`` argument, which wins over
      ``JDTENSOR_COORDINATION_TIMEOUT``.

  Returns:
    (settings, coordination time-out to give JAX).

  Raises:
    ConfigError: As `read_heartbeat_settings`, and for a bad coordination
      time-out.
  """
  env = environ_or_default(environ)
  given: _Setting | None = None
  if coordination is not None:
    given = _Setting(parse_timeout("coordination_timeout", coordination),
                     f"coordination_timeout={coordination!r}")
  else:
    variable = _coordination_timeout_variable(env)
    if variable is not None:
      given = _Setting(parse_timeout(variable, env[variable]),
                       f"{variable}={env[variable]!r}")
  settings, coordination_value, notes = _read(env, None, None, given)
  if notes:
    import logging  # pylint: disable=g-import-not-at-top
    logging.getLogger("jdtensor").info(
        "jdtensor: derived from what was set: %s.", "; ".join(notes))
  return settings, coordination_value


def _read(env: Mapping[str, str], period: float | None, policy: str | None,
          coordination: _Setting | None
          ) -> tuple[HeartbeatSettings, float, list[str]]:
  defaults = HeartbeatSettings()

  def pick(name: str, arg: object) -> tuple[str, str] | None:
    """(name to show, raw value) of an argument or variable; None if unset."""
    if arg is not None:  # The argument's name: period=..., policy=...
      return name.lower().removeprefix("jdtensor_heartbeat_"), str(arg)
    raw = env.get(name)
    return None if raw is None else (name, raw)
  got = pick(JDTENSOR_HEARTBEAT_PERIOD, period)
  period_set = None if got is None else _Setting(
      _seconds(got[0], got[1], *_PERIOD_RANGE), f"{got[0]}={got[1]!r}")
  got = pick(JDTENSOR_HEARTBEAT_POLICY, policy)
  policy_value = defaults.policy if got is None else got[1].strip().lower()
  if got is not None and policy_value not in HEARTBEAT_POLICIES:
    raise ConfigError(f"{got[0]}={got[1]!r} is not one of "
                      f"{', '.join(HEARTBEAT_POLICIES)}.")
  raw = env.get(JDTENSOR_STUCK_TIMEOUT)
  stuck_set = None if raw is None else _Setting(
      _seconds(JDTENSOR_STUCK_TIMEOUT, raw, 1.0, MAX_TIMEOUT),
      f"{JDTENSOR_STUCK_TIMEOUT}={raw!r}")
  stuck, period_value, coordination_value, notes = settle_timeouts(
      stuck_set, period_set, coordination)
  raw = env.get(JDTENSOR_STALL_TIMEOUT)
  stall = (defaults.stall_timeout if raw is None else
           _seconds(JDTENSOR_STALL_TIMEOUT, raw, 1.0, MAX_TIMEOUT, zero_ok=True))
  raw = env.get(JDTENSOR_STALL_FLOOR)
  if raw is None:  # The default never exceeds the ceiling the user set.
    floor = min(defaults.stall_floor, stall) if stall > 0 else defaults.stall_floor
  else:
    floor = _seconds(JDTENSOR_STALL_FLOOR, raw, 1.0, MAX_TIMEOUT)
    if 0 < stall < floor:
      if JDTENSOR_STALL_TIMEOUT not in env:  # The ceiling follows the floor set.
        stall = floor
      else:
        raise ConfigError(
            f"{JDTENSOR_STALL_FLOOR}={raw!r} is above "
            f"{JDTENSOR_STALL_TIMEOUT}={env[JDTENSOR_STALL_TIMEOUT]!r}: the learnt "
            "stall time-out lies between the two; lower the floor or raise "
            f"{JDTENSOR_STALL_TIMEOUT}.")
  raw = env.get(JDTENSOR_DEADLOCK_TIMEOUT)
  deadlock = (defaults.deadlock_timeout if raw is None else
              _seconds(JDTENSOR_DEADLOCK_TIMEOUT, raw, 1.0, MAX_TIMEOUT, zero_ok=True))
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
      deadlock_timeout=deadlock,
      stall_learn=read_bool(JDTENSOR_STALL_LEARN, True, env), stall_floor=floor,
      straggler_threshold=threshold, straggler_window=window), coordination_value, notes


def _percent(name: str, raw: str) -> float:
  try:
    value = float(raw.strip())
  except ValueError:
    value = float("nan")
  if not 0 <= value <= 100:  # Also rejects nan and inf.
    raise ConfigError(f"{name}={raw!r} must be a percentage from 0 (off) to 100, "
                      "e.g. 30.")
  return value
