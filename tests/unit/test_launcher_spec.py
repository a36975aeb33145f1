"""The launcher's pure parts: each client's environment, the spec's checks.
(Launches with real processes: tests/multiprocess/test_launcher.py.)"""

import re

import pytest

from jdtensor import launcher


def test_worker_env_is_dtensor_env():
  spec = launcher.LaunchSpec(command=("x",), num_clients=3, devices_per_client=2)
  env = launcher.worker_env(spec, 1, [7001, 7002, 7003],
                            {"KEEP": "1", "JDTENSOR_RESTART_COUNT": "5"})
  assert env["DTENSOR_CLIENT_ID"] == "1" and env["DTENSOR_NUM_CLIENTS"] == "3"
  assert env["DTENSOR_JOB_NAME"] == "worker"
  assert env["DTENSOR_JOBS"] == "localhost:7001,localhost:7002,localhost:7003"
  assert env["JAX_NUM_CPU_DEVICES"] == "2" and env["JAX_PLATFORMS"] == "cpu"
  assert env["KEEP"] == "1"
  assert env["JDTENSOR_RESTART_COUNT"] == "0"  # always set, never inherited
  later = launcher.Attempt((0, 1), ("h:1", "h:2"), "s" * 16, restart_count=2)
  env = launcher.worker_env(spec, 1, [], {}, later)
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
  from jdtensor import _supervisor  # pylint: disable=g-import-not-at-top
  held = _supervisor.HeldPorts(4)
  try:
    for _ in range(200):
      assert not set(launcher.free_ports(4)) & set(held.ports)
  finally:
    held.release()
  assert len(set(held.ports)) == 4 and held.ports == sorted(held.ports)
