"""Several hosts on one machine: Linux network namespaces joined by veth pairs.

Each host is a namespace with one address on a test subnet; the hosts meet on
a bridge inside a private "switch" namespace, so nothing is added to the
machine's own network and no traffic leaves these namespaces. The subnet is
in 198.18.0.0/15, the range reserved for network benchmarks (RFC 2544), which
no real host uses. Needs root and iproute2 (`.ci/run` installs iproute2);
skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

from jdtensor.heartbeat import leaving
from jdtensor.errors import PEER_FAILURE_EXIT_CODE
from tests.helpers import (LiveClients, clean_env, finish, parse_results,
                           start_clients)

pytestmark = pytest.mark.multihost

SUBNET = "198.18.7"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
  return subprocess.run(["ip", *args], capture_output=True, text=True,
                        timeout=20, check=check)


def _skip_reason() -> str | None:
  if os.geteuid() != 0:
    return "needs root to create network namespaces"
  if shutil.which("ip") is None:
    return "needs iproute2 (the `ip` command)"
  probe = f"jdtprobe{os.getpid()}"
  res = _ip("netns", "add", probe, check=False)
  if res.returncode:
    return f"cannot create network namespaces here: {res.stderr.strip()}"
  _ip("netns", "del", probe, check=False)
  return None


class Hosts:
  """`count` test hosts on one bridge; host i has address 198.18.7.<i>."""

  def __init__(self, count: int):
    tag = f"{os.getpid() % 100000}"
    self.switch = f"jdtsw{tag}"
    self.names = [f"jdth{i}_{tag}" for i in range(1, count + 1)]
    self.links = [f"jdtv{i}_{tag}" for i in range(1, count + 1)]
    self.addresses = [f"{SUBNET}.{i}" for i in range(1, count + 1)]
    try:
      _ip("netns", "add", self.switch)
      _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
      _ip("-n", self.switch, "link", "set", "br0", "up")
      for i, (ns, link, addr) in enumerate(zip(self.names, self.links,
                                               self.addresses)):
        peer = f"jdtp{i + 1}_{tag}"
        _ip("netns", "add", ns)
        _ip("link", "add", link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", link, "netns", ns)
        _ip("link", "set", peer, "netns", self.switch)
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", link)
        _ip("-n", ns, "link", "set", link, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "set", peer, "master", "br0")
        _ip("-n", self.switch, "link", "set", peer, "up")
    except Exception:
      self.remove()
      raise

  def exec_prefix(self, host: int) -> list[str]:
    return ["ip", "netns", "exec", self.names[host]]

  def cut(self, host: int) -> None:
    """Pulls host `host`'s cable: its link disappears, no packet says so."""
    _ip("-n", self.names[host], "link", "del", self.links[host])

  def remove(self) -> None:
    for ns in [*self.names, self.switch]:
      _ip("netns", "del", ns, check=False)


@pytest.fixture
def hosts():
  reason = _skip_reason()
  if reason:
    pytest.skip(reason)
  h = Hosts(2)
  yield h
  h.remove()


def _cluster(hosts: Hosts, per_host: int, **extra: str):
  """The seed's DTENSOR_JOBS shape: host1:10000,host1:10001,host2:10000,..."""
  jobs = [f"{addr}:{10000 + k}" for addr in hosts.addresses for k in range(per_host)]
  envs = [clean_env(DTENSOR_JOBS=",".join(jobs), DTENSOR_CLIENT_ID=str(c),
                    JAX_NUM_CPU_DEVICES="1", JDTENSOR_INIT_TIMEOUT="60",
                    JDTENSOR_SHUTDOWN_TIMEOUT="15", JDTENSOR_COORDINATION_TIMEOUT="15",
                    **{"JDTENSOR_STUCK_TIMEOUT": "10", **extra})
          for c in range(len(jobs))]
  prefixes = [hosts.exec_prefix(c // per_host) for c in range(len(jobs))]
  return envs, prefixes


def test_two_hosts_two_clients_each(hosts):
  envs, prefixes = _cluster(hosts, 2, JDTENSOR_HEARTBEAT_PERIOD="0.5")
  procs = start_clients("basic", envs, prefixes)
  results = finish(procs, timeout=180)
  out = {}
  for c, res in enumerate(results):
    assert res.returncode == 0, res.stdout + res.stderr
    out[c] = parse_results("\n".join(f"[client {c}] {l}"
                                     for l in res.stdout.splitlines()))[c]
  w = "/job:worker/replica:0/task:{t}/device:CPU:0"
  for t in range(4):
    assert out[t]["mesh"] == f"|batch=2,model=2|0,1,2,3|{t}|" + w.format(t=t)
    assert out[t]["psum"] == 10.0  # Crosses the hosts.
    assert out[t]["matmul_ok"] is True
  # The coordinator listens on the first job's host address only.
  assert out[0]["coordinator_listen"] == hosts.addresses[0]


def test_dead_host_survivors_exit_with_a_clear_message(hosts):
  # A cut host sends no FIN: it is "stuck" (alive for all we know), named
  # after the stuck time-out.
  envs, prefixes = _cluster(hosts, 2, JDTENSOR_HEARTBEAT_PERIOD="1",
                            JDTENSOR_STUCK_TIMEOUT="3")
  live = LiveClients("heartbeat_victim", envs, prefixes)
  try:
    assert live.wait_for("RESULT ready", [0, 1, 2, 3], timeout=120), live.err
    time.sleep(0.5)
    start = time.monotonic()
    hosts.cut(1)  # Clients 2 and 3 vanish without a FIN or RST.
    ended = live.wait_exit(start, timeout=45)
  finally:
    live.close()
  # A beat, the stuck time-out (checked each second), the roll call, the report.
  bound = 1 + 3 + 1 + leaving.ROLL_CALL_GRACE + 3
  for c in (0, 1):
    assert live.procs[c].returncode == PEER_FAILURE_EXIT_CODE, live.err[c]
    assert ended[c] < bound, ended
    assert "heartbeat: clients 2, 3 missed beat " in live.err[c], live.err[c]
  for c in (2, 3):  # Cut off: they stop too, one way or another, in time.
    assert c in ended and live.procs[c].returncode != 0, live.err[c]


def test_jdtensor_launch_across_two_hosts(hosts):
  """One launcher per host: they meet at host 1's coordinator address, each
  runs 2 clients, and every psum spans both hosts."""
  from tests.multiprocess.test_nodes import Launchers, nodes_argv  # pylint: disable=g-import-not-at-top
  argv = nodes_argv(2, 2, 1, coordinator=f"{hosts.addresses[0]}:29400")
  run = Launchers(argv, prefixes=[hosts.exec_prefix(0), hosts.exec_prefix(1)],
                  SCENARIO="none", STEPS="5", JDTENSOR_HEARTBEAT_PERIOD="0.5")
  assert run.finish(180) == [0, 0], run.out
  assert sorted(re.findall(r"^\[client (\d)\] DONE$", run.out[0], re.M)) == ["0", "1"]
  assert sorted(re.findall(r"^\[client (\d)\] DONE$", run.out[1], re.M)) == ["2", "3"]


def test_a_failure_on_one_host_stops_the_other_naming_it(hosts):
  """Client 2 (on host 2) raises: host 1's clients stop within seconds, and
  both launchers name client 2 as the root cause."""
  import time  # pylint: disable=g-import-not-at-top
  from tests.multiprocess.test_nodes import Launchers, nodes_argv  # pylint: disable=g-import-not-at-top
  argv = nodes_argv(2, 2, 1, coordinator=f"{hosts.addresses[0]}:29401")
  run = Launchers(argv, prefixes=[hosts.exec_prefix(0), hosts.exec_prefix(1)],
                  SCENARIO="exception", CULPRIT="2", STEPS="200",
                  JDTENSOR_HEARTBEAT_PERIOD="0.5")
  stamp = float(run.wait_for(r"^\[client 2\] MISBEHAVING ([\d.]+)$", 1, 120).group(1))
  assert run.finish(60) == [1, 1], run.out
  assert time.time() - stamp < 30
  why = r"ZeroDivisionError: division by zero \(failure_client\.py:\d+ in misbehave\)"
  assert re.search(rf"^jdtensor launch \(node 0\): client 2 exited with code 1: {why} "
                   r"\(on node 1\); stopped clients ", run.out[0], re.M), run.out[0]
  assert re.search(rf"^jdtensor launch \(node 1\): client 2 exited with code 1: {why}; "
                   r"stopped clients ", run.out[1], re.M), run.out[1]
  for c in (0, 1):
    assert re.search(rf"^\[client {c}\] heartbeat: client 2 failed: ZeroDivisionError",
                     run.out[0], re.M), run.out[0]
