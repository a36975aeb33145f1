"""What a pod-scale run needs of one client, tried with a few: descriptors
past 1024 (select() cannot watch them), the open-file limit."""

import os
import sys

import pytest

from tests.helpers import launch_clients

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(os.path.dirname(__file__), "many_files_client.py")


@pytest.mark.parametrize("bad", [None, 2], ids=["runs", "sigkill-named"])
def test_clients_holding_1100_open_files_start_run_and_name_a_killed_peer(bad):
  extra = {} if bad is None else {"BAD": str(bad)}
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
  """benchmarks/bench_pod_scale.py with the real handshake and exchange, at
  sizes this machine runs in a second."""
  from benchmarks import bench_pod_scale  # pylint: disable=g-import-not-at-top
  text = bench_pod_scale.main(["--clients", "8,32", "--processes", "2"])
  rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ")][1:]
  assert [int(r[0][2:]) for r in rows] == [8, 32], text
  for r in rows:
    n, fds = int(r[0][2:]), int(r[3])
    sends, receives, zero_sends = int(r[4]), int(r[5]), int(r[6])
    assert fds >= n - 1, text  # Client 0 holds a link per client.
    assert zero_sends == (n - 1) * receives, text  # The sum goes to every client.
    assert sends < 100 <= receives, text  # A row is small, the sum is not.
  assert text.splitlines()[-1].startswith("pod scale: 32 clients: start-up "), text
