"""The heartbeat's settings (`jdtensor._env.heartbeat_env`): strict values,
and the stuck time-out, period and coordination time-out that fit together,
each left unset derived from those set."""

import logging

import pytest

from jdtensor import _env
from jdtensor.errors import ConfigError

STUCK = "JDTENSOR_STUCK_TIMEOUT"
PERIOD = "JDTENSOR_HEARTBEAT_PERIOD"
COORDINATION = "JDTENSOR_COORDINATION_TIMEOUT"


def test_configuration_checks():
  read = _env.read_heartbeat_settings
  assert read({}).period == 2.0
  assert read({PERIOD: "0.5"}).period == 0.5
  with pytest.raises(ConfigError, match="^JDTENSOR_HEARTBEAT_PERIOD='0' must be"):
    read({PERIOD: "0"})
  assert read({"JDTENSOR_HEARTBEAT_POLICY": " Raise "}).policy == "raise"
  with pytest.raises(ConfigError) as e:
    read({"JDTENSOR_HEARTBEAT_POLICY": "abort"})
  assert str(e.value) == ("JDTENSOR_HEARTBEAT_POLICY='abort' is not one of "
                          "terminate, raise, log.")
  with pytest.raises(ConfigError, match="^period='-1' must be"):
    read({}, period=-1)
  with pytest.raises(ConfigError, match="^policy='loud' is not one of"):
    read({}, policy="loud")


# (variables, coordination_timeout argument) -> (stuck, period, coordination):
# what is unset follows what is set; nothing a user left unset is refused.
@pytest.mark.parametrize("env,argument,expected", [
    ({}, None, (60, 2, 100)),
    # JAX's own multi-process harness: initialize(heartbeat_timeout_seconds=5).
    ({}, 5, (3, 0.75, 5)),
    ({COORDINATION: "10"}, None, (6, 1.5, 10)),
    ({COORDINATION: "30"}, None, (18, 2, 30)),
    ({COORDINATION: "100"}, None, (60, 2, 100)),
    ({COORDINATION: "500"}, None, (60, 2, 500)),
    ({"JDTENSOR_HEARTBEAT_TIMEOUT": "5"}, None, (3, 0.75, 5)),  # The deprecated name.
    ({COORDINATION: "500"}, 5, (3, 0.75, 5)),  # The argument wins.
    ({STUCK: "300"}, None, (300, 2, 500)),
    ({STUCK: "3"}, None, (3, 0.75, 100)),
    ({STUCK: "3"}, 5, (3, 0.75, 5)),
    ({PERIOD: "0.2"}, 5, (3, 0.2, 5)),
    ({PERIOD: "2"}, 5, (4, 2, 5)),  # Two periods, still below 5.
    ({PERIOD: "40"}, None, (80, 40, 100)),
    ({PERIOD: "90"}, None, (180, 90, 300)),
    ({STUCK: "8", PERIOD: "0.2", COORDINATION: "10"}, None, (8, 0.2, 10)),  # Tests'.
    # JAX takes whole seconds: 0.01 s is 1 s there, and the derivation follows.
    ({COORDINATION: "0.01"}, None, (0.6, 0.15, 1)),
    ({COORDINATION: "4.5"}, None, (3, 0.75, 5)),
], ids=lambda v: repr(v) if not isinstance(v, dict) else ",".join(
    f"{k.split('_')[-2].lower()}={x}" for k, x in v.items()) or "nothing-set")
def test_unset_timeouts_follow_those_set(env, argument, expected):
  settings, coordination = _env.read_heartbeat_and_coordination(
      env, coordination=argument)
  assert (settings.stuck_timeout, settings.period, coordination) == expected
  # Once started, reading the settings again against the coordination
  # time-out in force gives the same (`heartbeat.start` after start-up).
  assert _env.read_heartbeat_settings(env, coordination=coordination) == settings


def test_what_was_derived_is_logged_once(caplog):
  caplog.set_level(logging.INFO, logger="jdtensor")
  _env.read_heartbeat_and_coordination({}, coordination=5)
  assert [r.getMessage() for r in caplog.records] == [
      "jdtensor: derived from what was set: JDTENSOR_STUCK_TIMEOUT 3 s, 0.6 of "
      "coordination_timeout=5 (JAX aborts every client once one is silent that "
      "long; jdtensor must name a stuck client first); JDTENSOR_HEARTBEAT_PERIOD "
      "0.75 s, a quarter of the stuck time-out."]
  caplog.clear()
  _env.read_heartbeat_and_coordination({STUCK: "300"})
  assert [r.getMessage() for r in caplog.records] == [
      "jdtensor: derived from what was set: JDTENSOR_COORDINATION_TIMEOUT 500 s, the "
      "stuck time-out over 0.6 (JAX's own heartbeat must outlast jdtensor's)."]
  caplog.clear()
  _env.read_heartbeat_and_coordination({COORDINATION: "500"})
  assert not caplog.records  # Nothing derived: the defaults fit.


# Only settings the user gave contradict each other.
@pytest.mark.parametrize("env,argument,message", [
    ({STUCK: "300", COORDINATION: "10"}, None,
     "JDTENSOR_STUCK_TIMEOUT='300' must be shorter than "
     "JDTENSOR_COORDINATION_TIMEOUT='10': JAX aborts every client 10 s after one "
     "stops answering, before jdtensor can name it. Set JDTENSOR_STUCK_TIMEOUT below "
     "10 or the coordination time-out above 300, or leave one of them unset: "
     "jdtensor derives it from the other."),
    ({STUCK: "20", PERIOD: "2"}, 20,
     "JDTENSOR_STUCK_TIMEOUT='20' must be shorter than coordination_timeout=20: JAX "
     "aborts every client 20 s after one stops answering, before jdtensor can name "
     "it. Set JDTENSOR_STUCK_TIMEOUT below 20 (at least 4, two heartbeat periods) or "
     "the coordination time-out above 20, or leave one of them unset: jdtensor "
     "derives it from the other."),
    ({PERIOD: "10"}, 5,
     "JDTENSOR_HEARTBEAT_PERIOD='10' needs a stuck time-out of at least 20 s (two "
     "periods), which must be shorter than coordination_timeout=5: JAX aborts every "
     "client 5 s after one stops answering, before jdtensor can name it. Set the "
     "period below 2.5 or the coordination time-out above 20."),
    ({STUCK: "3", PERIOD: "2"}, None,
     "JDTENSOR_STUCK_TIMEOUT='3' must be at least twice the heartbeat period "
     "(JDTENSOR_HEARTBEAT_PERIOD='2'): a beat may take a period to start. Set "
     "JDTENSOR_STUCK_TIMEOUT to at least 4 or the period to at most 1.5."),
], ids=["stuck-vs-variable", "stuck-vs-argument", "period-vs-argument",
        "stuck-vs-period"])
def test_contradicting_settings_are_refused_naming_both(env, argument, message):
  with pytest.raises(ConfigError) as e:
    _env.read_heartbeat_and_coordination(env, coordination=argument)
  assert str(e.value) == message


def test_after_start_up_the_coordination_timeout_in_force_is_fixed():
  """`heartbeat.start(period)` after start-up: JAX's time-out can no longer
  change, so a period too long for it is refused, naming it."""
  with pytest.raises(ConfigError) as e:
    _env.read_heartbeat_settings({}, period=60, coordination=100)
  assert str(e.value) == (
      "period='60' needs a stuck time-out of at least 120 s (two periods), which "
      "must be shorter than the coordination time-out in force (100 s): JAX aborts "
      "every client 100 s after one stops answering, before jdtensor can name it. "
      "Set the period below 50 or the coordination time-out above 120.")


@pytest.mark.parametrize("env,message", [
    ({PERIOD: "1e300"},
     "JDTENSOR_HEARTBEAT_PERIOD='1e300' must be a number of seconds from 0.01 to 3600."),
    ({PERIOD: "1e-6"},
     "JDTENSOR_HEARTBEAT_PERIOD='1e-6' must be a number of seconds from 0.01 to 3600."),
    ({STUCK: "inf"},
     "JDTENSOR_STUCK_TIMEOUT='inf' must be a number of seconds from 1 to 604800."),
    ({"JDTENSOR_STALL_TIMEOUT": "nan"},
     "JDTENSOR_STALL_TIMEOUT='nan' must be 0 (off) or a number of seconds from 1 "
     "to 604800."),
    ({"JDTENSOR_STALL_KILL_ALL_WAITING": "maybe"},
     "JDTENSOR_STALL_KILL_ALL_WAITING='maybe' is not a boolean; use one of "
     "true/false, 1/0 or yes/no (any case), or unset it for the default."),
    ({"JDTENSOR_DEADLOCK_TIMEOUT": "10m"},
     "JDTENSOR_DEADLOCK_TIMEOUT='10m' must be 0 (off) or a number of seconds from 1 "
     "to 604800."),
    ({COORDINATION: "0"},
     "JDTENSOR_COORDINATION_TIMEOUT='0' must be a number of seconds above 0 and at "
     "most 604800 (a week)."),
], ids=["period-huge", "period-tiny", "stuck-inf", "stall-nan", "kill-all-bool",
        "deadlock-unit", "coordination-zero"])
def test_heartbeat_settings_are_strict(env, message):
  with pytest.raises(ConfigError) as e:
    _env.read_heartbeat_and_coordination(env)
  assert str(e.value) == message


def test_heartbeat_settings_defaults_and_agreement_keys():
  s = _env.read_heartbeat_settings({"JDTENSOR_STALL_TIMEOUT": "0", PERIOD: "40"})
  assert (s.period, s.policy, s.stuck_timeout, s.stall_timeout) == (40, "terminate",
                                                                   80, 0)
  assert s.deadlock_timeout == 600
  assert sorted(s.handshake()) == [
      "JDTENSOR_DEADLOCK_TIMEOUT", "JDTENSOR_HEARTBEAT_PERIOD", "JDTENSOR_HEARTBEAT_POLICY", "JDTENSOR_STALL_FLOOR",
      "JDTENSOR_STALL_KILL_ALL_WAITING", "JDTENSOR_STALL_LEARN", "JDTENSOR_STALL_TIMEOUT",
      "JDTENSOR_STRAGGLER_THRESHOLD", "JDTENSOR_STRAGGLER_WINDOW",
      "JDTENSOR_STUCK_TIMEOUT"]
  # The straggler window is at least two periods (80 s here), else 60 s.
  assert (s.straggler_threshold, s.straggler_window) == (30, 80)


@pytest.mark.parametrize("env, expected", [
    ({}, (300.0, 60.0, True)),
    ({"JDTENSOR_STALL_LEARN": "false"}, (300.0, 60.0, False)),
    ({"JDTENSOR_STALL_FLOOR": "10"}, (300.0, 10.0, True)),
    # A stall time-out set below the default floor: the floor follows it.
    ({"JDTENSOR_STALL_TIMEOUT": "5"}, (5.0, 5.0, True)),
    # A floor set above the default ceiling: the ceiling follows it.
    ({"JDTENSOR_STALL_FLOOR": "600"}, (600.0, 600.0, True)),
    ({"JDTENSOR_STALL_TIMEOUT": "0"}, (0.0, 60.0, True)),
    # Both set, the floor above the ceiling: the user's own contradiction.
    ({"JDTENSOR_STALL_TIMEOUT": "5", "JDTENSOR_STALL_FLOOR": "6"},
     "JDTENSOR_STALL_FLOOR='6' is above JDTENSOR_STALL_TIMEOUT='5': the learnt stall "
     "time-out lies between the two; lower the floor or raise JDTENSOR_STALL_TIMEOUT."),
    ({"JDTENSOR_STALL_FLOOR": "0"},
     "JDTENSOR_STALL_FLOOR='0' must be a number of seconds from 1 to"),
    ({"JDTENSOR_STALL_LEARN": "maybe"}, "JDTENSOR_STALL_LEARN"),
], ids=["defaults", "learn-off", "floor", "ceiling-below-floor", "floor-above-ceiling",
        "stall-off", "contradiction", "floor-zero", "learn-bad"])
def test_the_learnt_stall_time_out_settings(env, expected):
  if isinstance(expected, str):
    with pytest.raises(ConfigError) as e:
      _env.read_heartbeat_settings(env)
    assert str(e.value).startswith(expected), str(e.value)
    return
  s = _env.read_heartbeat_settings(env)
  assert (s.stall_timeout, s.stall_floor, s.stall_learn) == expected
