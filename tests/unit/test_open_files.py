"""The open-file limit start-up raises for a run (`runtime.open_files`); the
limits are set in a fresh process, never this one's."""

import json
import subprocess
import sys

import pytest

from jdtensor.runtime.open_files import open_files_needed
from tests.helpers import clean_env


@pytest.mark.parametrize("clients,client,open_now,need", [
    (2, 0, 10, 10 + 256 + 8),
    (2, 1, 10, 10 + 256 + 4),
    (4096, 0, 30, 30 + 256 + 4 * 4096),
    (4096, 17, 1130, 1130 + 256 + 2 * 4096),  # A data loader's files count too.
])
def test_the_need_grows_with_the_clients_and_what_is_open(clients, client, open_now, need):
  assert open_files_needed(clients, client, open_now) == need


_TRY = """
import json, resource, sys
from jdtensor.errors import StartupError
from jdtensor.runtime import open_files
soft, hard, clients, client = map(int, sys.argv[1:])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
try:
  got = open_files.ensure_open_files(clients, client)
  print(json.dumps({"got": list(got), "now": resource.getrlimit(resource.RLIMIT_NOFILE)}))
except StartupError as e:
  print(json.dumps({"error": str(e), "need": open_files.open_files_needed(
      clients, client, open_files._open_now())}))
"""


def _try(soft, hard, clients, client):
  res = subprocess.run([sys.executable, "-c", _TRY, str(soft), str(hard), str(clients),
                        str(client)], env=clean_env(), capture_output=True, text=True,
                       timeout=60)
  assert res.returncode == 0, res.stderr
  return json.loads(res.stdout)


def test_a_low_soft_limit_is_raised_to_the_need_and_no_further():
  out = _try(1024, 20000, 1000, 0)
  need, soft, hard, raised_from = out["got"]
  assert (soft, hard, raised_from) == (need, 20000, 1024) and need > 4000
  assert out["now"] == [need, 20000]


def test_a_soft_limit_that_suffices_is_left_alone():
  out = _try(5000, 20000, 2, 1)
  assert out["got"][1:] == [5000, 20000, None] and out["now"] == [5000, 20000]


def test_a_hard_limit_below_the_need_names_both_and_the_fix():
  out = _try(1024, 2048, 1000, 0)
  need = out["need"]
  assert out["error"] == (
      f"Client 0 of 1000 needs about {need} open files (its links, JAX's connections "
      f"and collectives), but this process may open at most 2048 (the hard "
      f"RLIMIT_NOFILE; soft 1024). Raise the hard limit where the clients start: "
      f"`ulimit -Hn {need}` (as root), Docker's `--ulimit nofile={need}:{need}`, "
      f"systemd's `LimitNOFILE={need}`, or /etc/security/limits.conf.")
