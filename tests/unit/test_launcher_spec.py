"""The launcher's pure parts: each client's environment, the spec's checks.
(Launches with real processes: tests/multiprocess/test_launcher.py.)"""

import re

import pytest

from jdtensor import _env, launcher
from jdtensor.launcher import spec as spec_mod
from jdtensor.errors import ConfigError


def test_worker_env_is_dtensor_env():
  spec = launcher.LaunchSpec(command=("x",), num_clients=3, devices_per_client=2)
  env = spec_mod.worker_env(spec, 1, [7001, 7002, 7003],
                            {"KEEP": "1", "JDTENSOR_RESTART_COUNT": "5"})
  assert env["DTENSOR_CLIENT_ID"] == "1" and env["DTENSOR_NUM_CLIENTS"] == "3"
  assert env["DTENSOR_JOB_NAME"] == "worker"
  assert env["DTENSOR_JOBS"] == "localhost:7001,localhost:7002,localhost:7003"
  assert env["JAX_NUM_CPU_DEVICES"] == "2" and env["JAX_PLATFORMS"] == "cpu"
  assert env["KEEP"] == "1"
  assert env["JDTENSOR_RESTART_COUNT"] == "0"  # always set, never inherited
  later = spec_mod.Attempt((0, 1), ("h:1", "h:2"), "s" * 16, restart_count=2)
  env = spec_mod.worker_env(spec, 1, [], {}, later)
  assert env["JDTENSOR_RESTART_COUNT"] == "2" and env["DTENSOR_JOBS"] == "h:1,h:2"
  assert env["JDTENSOR_RUN_SECRET"] == "s" * 16
  ports = launcher.free_ports(4)
  assert ports == sorted(ports) and len(set(ports)) == 4


@pytest.mark.parametrize("kwargs,message", [
    ({"command": ()}, "LaunchSpec.command is empty"),
    ({"command": ("x",), "num_clients": 0}, "num_clients must be >= 1, got 0."),
    ({"command": ("x",), "devices_per_client": 0}, "devices_per_client must be >= 1"),
    ({"command": ("x",), "device_type": "XPU"}, "device_type must be CPU, GPU or TPU"),
    ({"command": ("x",), "port": 70000}, "port must leave room for 2 ports"),
    ({"command": ("x",), "timeout": 0},
     "timeout must be a finite number of seconds > 0, got 0."),
    ({"command": ("x",), "timeout": float("inf")},
     "timeout must be a finite number of seconds > 0, got inf."),
    ({"command": ("x",), "grace": float("inf")},
     "grace must be a finite number of seconds >= 0, got inf."),
])
def test_spec_validation(kwargs, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    launcher.LaunchSpec(**kwargs)


def test_held_ports_are_never_handed_out_again_until_released():
  """Two launchers on one host (multi-node on loopback) pick their clients'
  ports while the other's are held: never the same port."""
  from jdtensor.launcher import spec  # pylint: disable=g-import-not-at-top
  held = spec.HeldPorts(4)
  try:
    for _ in range(200):
      assert not set(launcher.free_ports(4)) & set(held.ports)
  finally:
    held.release()
  assert len(set(held.ports)) == 4 and held.ports == sorted(held.ports)


# -- the device-count rule: the argument, else the environment's, else JAX's 1 --

_FLAG8 = "--xla_force_host_platform_device_count=8"


@pytest.mark.parametrize("requested,environ,count", [
    (None, {}, None),  # JAX's default (1); the launcher sets nothing.
    (2, {}, 2),
    (None, {"XLA_FLAGS": _FLAG8}, 8),
    (None, {"XLA_FLAGS": f"--xla_cpu_use_thunk_runtime=true {_FLAG8}"}, 8),
    (None, {"JAX_NUM_CPU_DEVICES": "4"}, 4),
    # JAX's precedence: JAX_NUM_CPU_DEVICES over the XLA flag.
    (None, {"JAX_NUM_CPU_DEVICES": "4", "XLA_FLAGS": _FLAG8}, 4),
    (8, {"XLA_FLAGS": _FLAG8}, 8),  # Given both ways, agreeing.
    (2, {"JAX_NUM_CPU_DEVICES": "2"}, 2),
    (None, {"JAX_NUM_CPU_DEVICES": "-1"}, None),  # JAX's own "default".
    (3, {"JAX_NUM_CPU_DEVICES": "-1"}, 3),
], ids=["default", "argument", "xla-flags", "xla-flags-among-others",
        "jax-num-cpu-devices", "jax-var-wins-over-flag", "both-agree-flag",
        "both-agree-var", "jax-default", "jax-default-and-argument"])
def test_the_device_count_rule(requested, environ, count):
  spec = launcher.LaunchSpec(command=("x",), devices_per_client=requested)
  resolved = spec.resolved(environ)
  assert resolved.devices_per_client == count
  env = spec_mod.worker_env(resolved, 0, [7001, 7002], environ)
  if count is None:  # Nothing set: JAX's default of 1.
    assert env.get("JAX_NUM_CPU_DEVICES") == environ.get("JAX_NUM_CPU_DEVICES")
  elif requested is not None:
    assert env["JAX_NUM_CPU_DEVICES"] == str(count)
  else:  # The user's own setting reaches the client untouched.
    assert {k: env[k] for k in environ} == environ


@pytest.mark.parametrize("environ,where", [
    ({"XLA_FLAGS": _FLAG8}, f"XLA_FLAGS='{_FLAG8}'"),
    ({"JAX_NUM_CPU_DEVICES": "8"}, "JAX_NUM_CPU_DEVICES='8'"),
])
def test_a_device_count_given_twice_differently_is_an_error_naming_both(environ,
                                                                        where):
  spec = launcher.LaunchSpec(command=("x",), devices_per_client=2)
  with pytest.raises(ConfigError) as e:
    spec.resolved(environ, "--devices-per-client")
  assert str(e.value) == (
      f"--devices-per-client 2 conflicts with {where} in the environment, which "
      "gives JAX 8 CPU device(s) per process; give the count once: drop "
      "--devices-per-client to use the environment's 8, or remove the device "
      "count from the environment.")
  with pytest.raises(ConfigError, match=r"^devices_per_client=2 conflicts with "):
    spec.resolved(environ)
  # Another device type has no CPU device count to resolve: a TPU run is
  # kept as is; a GPU run's count is of GPUs (tests/unit/test_launcher_gpus.py).
  tpu = launcher.LaunchSpec(command=("x",), devices_per_client=2, device_type="TPU")
  assert tpu.resolved(environ) is tpu


@pytest.mark.parametrize("raw", ["abc", "0", "", "٤", "2.5"])
def test_a_jax_num_cpu_devices_jax_refuses_is_refused_before_any_client(raw):
  spec = launcher.LaunchSpec(command=("x",))
  with pytest.raises(ConfigError) as e:
    spec.resolved({"JAX_NUM_CPU_DEVICES": raw}, "--devices-per-client")
  assert str(e.value) == (
      f"JAX_NUM_CPU_DEVICES={raw!r} in the environment is not a CPU device count "
      "(JAX refuses it when it is imported); set a positive integer, or unset "
      "it and give --devices-per-client.")


def test_without_cpu_device_count_keeps_xla_s_other_flags():
  assert _env.without_cpu_device_count(
      {"XLA_FLAGS": f"--a=1 {_FLAG8} --b", "JAX_NUM_CPU_DEVICES": "3", "K": "v"}
  ) == {"XLA_FLAGS": "--a=1 --b", "K": "v"}
  assert _env.without_cpu_device_count({"XLA_FLAGS": _FLAG8}) == {}


def test_a_command_no_client_could_start_is_named_once_with_what_to_do(tmp_path):
  from jdtensor.launcher.processes import why_it_cannot_start
  script = tmp_path / "train.py"
  script.write_text("print('hi')\n")
  tool = tmp_path / "tool"
  tool.write_text("#!/bin/sh\n")
  tool.chmod(0o755)
  env = {"PATH": str(tmp_path)}
  hint = "to run a Python script, give the interpreter: jdtensor launch ... -- python"
  assert why_it_cannot_start(str(script), env) == f"it is not executable; {hint} {script}"
  assert why_it_cannot_start("train.py", env) == f"it is not executable; {hint} train.py"
  assert why_it_cannot_start("train.py", {"PATH": "/nonexistent"}) == (
      f"no such command in the clients' PATH; {hint} train.py")
  assert why_it_cannot_start(str(tmp_path / "nope"), env) == "no such file"
  assert why_it_cannot_start("nope", env) == "no such command in the clients' PATH"
  assert why_it_cannot_start(str(tmp_path), env) == "it is a directory"
  # What execvp would run is never refused: by path, by PATH, a later PATH
  # entry after a non-executable one, and the default PATH when none is set.
  assert why_it_cannot_start(str(tool), {}) is None
  assert why_it_cannot_start("tool", env) is None
  other = tmp_path / "other"
  other.mkdir()
  (other / "tool").write_text("")
  assert why_it_cannot_start("tool", {"PATH": f"{other}:{tmp_path}"}) is None
  assert why_it_cannot_start("sh", {}) is None
