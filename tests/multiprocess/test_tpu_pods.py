"""Simulated TPU pods: real processes, the real psum merge, ring-ordered meshes."""

import io
import sys

import pytest

from jdtensor import launcher
from tests.helpers import (CLIENT, TEST_TIMEOUTS, cluster_env, finish, free_port,
                           parse_results, start_clients)

pytestmark = pytest.mark.multiprocess

T = "/job:worker/replica:0/task:{t}/device:TPU:{i}"


def run_pod(monkeypatch, topology, clients, devices):
  for k, v in TEST_TIMEOUTS.items():
    monkeypatch.setenv(k, v)
  monkeypatch.setenv("JDTENSOR_SIMULATED_TPU_TOPOLOGY", topology)
  out, err = io.StringIO(), io.StringIO()
  res = launcher.launch(launcher.LaunchSpec(
      command=(sys.executable, CLIENT, "tpu"), num_clients=clients,
      devices_per_client=devices, timeout=120), out=out, err=err)
  assert res.exit_code == 0, out.getvalue() + err.getvalue()
  return parse_results(out.getvalue())


def test_two_hosts_2x4x1x2_matches_dtensor(monkeypatch):
  r = run_pod(monkeypatch, "2x4x1x2", 2, 8)
  for t in (0, 1):
    assert r[t]["core_ids"] == list(range(16))  # Same merged table everywhere.
    assert r[t]["topology_shape"] == [2, 4, 1, 2]
    assert r[t]["owners"] == [0] * 8 + [1] * 8
    assert r[t]["psum"] == 136.0
    assert r[t]["ring_values"] == [float(g) for g in range(16)]
  # DTensor's own worked example (create_tpu_mesh on two 2x2-chip hosts).
  assert r[1]["mesh"] == (
      "two_host1|batch=2,model=8|" + ",".join(map(str, range(16))) +
      "|8,9,10,11,14,15,12,13|" + ",".join(T.format(t=1, i=i) for i in range(8)))
  assert r[0]["device_ids"] == [0, 1, 2, 3, 6, 7, 4, 5]
  assert r[1]["device_ids"] == [8, 9, 10, 11, 14, 15, 12, 13]
  assert r[1]["locations"][4] == {"batch": 1, "model": 6}


def test_two_hosts_4x2x1x1(monkeypatch):
  r = run_pod(monkeypatch, "4x2x1x1", 2, 4)
  # Host 0 owns x in {0,1}, host 1 x in {2,3}; core id = x + 4y.
  assert r[0]["core_ids"] == r[1]["core_ids"] == [0, 1, 4, 5, 2, 3, 6, 7]
  assert r[0]["psum"] == r[1]["psum"] == 36.0
  assert r[1]["ring_values"] == [float(g) for g in range(8)]


def test_four_hosts_4x4x1x1(monkeypatch):
  r = run_pod(monkeypatch, "4x4x1x1", 4, 4)
  tables = {tuple(r[t]["core_ids"]) for t in range(4)}
  assert len(tables) == 1
  table = list(tables.pop())
  assert sorted(table) == list(range(16))
  assert table[4:8] == [2, 3, 6, 7]  # Host 1: x in {2,3}, y in {0,1}.
  assert all(r[t]["psum"] == 136.0 for t in range(4))
  ids = [r[t]["device_ids"] for t in range(4)]
  assert sorted(i for block in ids for i in block) == list(range(16))


@pytest.mark.parametrize("topology,clients,devices,message", [
    ("4x4x1x2", 2, 8, "JDTENSOR_SIMULATED_TPU_TOPOLOGY='4x4x1x2' has 4 host(s) of "
     "8 cores, but there are 2 client(s) in DTENSOR_JOBS; run one client per host "
     "(`jdtensor launch -n 4 --devices-per-client 8`)."),
    ("2x4x1x2", 2, 2, "JDTENSOR_SIMULATED_TPU_TOPOLOGY='2x4x1x2' gives each host 8 "
     "cores, but this client is configured for 2 CPU devices"),
    ("3x2x1x1", 2, 2, "JDTENSOR_SIMULATED_TPU_TOPOLOGY='3x2x1x1' does not divide "
     "into hosts: hosts are 2x2-chip blocks, so the x size must be 1 or even, got 3."),
    ("2x2x1", 2, 2, "JDTENSOR_SIMULATED_TPU_TOPOLOGY='2x2x1' is not a TPU slice shape"),
], ids=["hosts-vs-clients", "devices-per-host", "odd-size", "format"])
def test_misconfigured_pods(topology, clients, devices, message):
  jobs = [f"localhost:{free_port()}" for _ in range(clients)]
  envs = [cluster_env(jobs, c, devices=devices,
                      JDTENSOR_SIMULATED_TPU_TOPOLOGY=topology, JDTENSOR_INIT_TIMEOUT="10")
          for c in range(clients)]
  results = finish(start_clients("tpu", envs), timeout=90)
  for res in results:
    assert res.returncode == 1, res.stdout + res.stderr
    assert "ERROR ConfigError: " + message in res.stdout, res.stdout
    assert "Terminating process" not in res.stderr


def test_clients_on_different_slices_are_named():
  jobs = [f"localhost:{free_port()}" for _ in range(2)]
  envs = [cluster_env(jobs, 0, devices=4, JDTENSOR_SIMULATED_TPU_TOPOLOGY="4x2x1x1"),
          cluster_env(jobs, 1, devices=4, JDTENSOR_SIMULATED_TPU_TOPOLOGY="2x4x1x1")]
  results = finish(start_clients("tpu", envs), timeout=90)
  assert all(r.returncode == 1 for r in results), results
  assert any("The TPU core ids merged across clients disagree with "
             "JDTENSOR_SIMULATED_TPU_TOPOLOGY='4x2x1x1' for client(s) 1" in r.stdout
             for r in results), [r.stdout for r in results]
