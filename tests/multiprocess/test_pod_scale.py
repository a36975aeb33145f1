"""What a pod-scale run needs of one client, tried with a few: descriptors
past 1024 (select() cannot watch them), the open-file limit."""

import os
import re
import sys

import pytest

from tests.helpers import launch_clients

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(os.path.dirname(__file__), "clients", "many_files_client.py")


@pytest.mark.parametrize("bad", [None, 2], ids=["runs", "sigkill-named"])
def test_clients_holding_1100_open_files_start_run_and_name_a_killed_peer(bad):
  extra = {} if bad is None else {"CULPRIT": str(bad)}
  res, out, err, _ = launch_clients([sys.executable, CLIENT], 3, 1, timeout=90,
                                    FILES="1100", **extra)
  fds = sorted(int(line.split()[-1]) for line in out.splitlines() if " FDS " in line)
  assert len(fds) == 3 and min(fds) > 1100, out + err
  if bad is None:
    assert res.exit_code == 0, out + err
    assert out.count("DONE") == 3, out
  else:
    assert res.first_failure == bad, out + err
    assert "jdtensor launch: client 2 was killed by SIGKILL" in err, err
    assert all(res.returncodes[c] == 75 for c in (0, 1)), (res.returncodes, err)


def test_the_pod_scale_benchmark_at_small_sizes():
  """benchmarks/bench_pod_scale.py with the real handshake, links, exchange,
  watchdog and verdicts, at sizes this machine runs in seconds: a beat costs
  a client the same few bytes at any size, client 0 an outcome's worth per
  client every few beats; a SIGKILLed client and a staller are named by every survivor."""
  from benchmarks import bench_pod_scale  # pylint: disable=g-import-not-at-top
  text = bench_pod_scale.main(["--clients", "8,32", "--processes", "2",
                               "--cpu-beats", "2"])
  rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ")][1:]
  assert [int(r[0][2:]) for r in rows] == [8, 32], text
  for r in rows:
    n, fds = int(r[0][2:]), int(r[3])
    sends, receives, zero_sends = int(r[4]), int(r[5]), int(r[6])
    zero_cpu, other_cpu = (float(v.strip(" |")) for v in r[8:10])
    # The last survivor's seconds, then (the first's / the median's).
    killed, stalled = (float(v.strip(" |").split()[0]) for v in r[10:12])
    assert all(re.fullmatch(r"[0-9.]+ \([0-9.]+ / [0-9.]+\)", v.strip(" |"))
               for v in r[10:12]), text
    assert fds >= n - 1, text  # Client 0 holds a link per client.
    assert (sends, receives) == (25, 12), text  # A row in, an outcome out.
    # Without news, an outcome to every client every ACK_EVERY beats.
    assert zero_sends == round((n - 1) * receives / bench_pod_scale.ACK_EVERY), text
    assert zero_cpu < 2.0 and other_cpu < 0.5, text
    assert killed < 1.0, text  # Every survivor named the SIGKILLed client.
    # The staller is named at the first beat past its time-out.
    assert 0.0 <= stalled < bench_pod_scale.PERIOD + 1.0, text
  assert re.fullmatch(r"pod scale: 32 clients: detection [0-9.]+ s, client 0 heartbeat "
                      r"[0-9.]+% of a core, "
                      f"{round(31 * 12 / bench_pod_scale.ACK_EVERY)} bytes a beat at client 0",
                      text.splitlines()[-1]), text


def test_the_hub_beat_benchmark_at_a_small_size():
  """benchmarks/bench_hub_beat.py: client 0's real links, exchange and
  decider beat against a driver process holding the other clients' links,
  both ways (an outcome every beat, and the default)."""
  from benchmarks import bench_hub_beat  # pylint: disable=g-import-not-at-top
  text = bench_hub_beat.main(["--clients", "16", "--beats", "1"])
  rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| 16 ")]
  assert [r[1] for r in rows] == [
      "every beat", f"every {bench_hub_beat.ACK_EVERY} beats (default)"], text
  for r in rows:
    user, system, share = float(r[2]), float(r[3]), float(r[4].strip(" |"))
    assert user >= 0 and system >= 0 and 0 <= share < 1.0, text
