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
