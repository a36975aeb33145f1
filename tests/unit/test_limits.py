"""What a run needs of the machine (`jdtensor._limits`): the open-file limit
start-up raises for a client, and what `jdtensor launch` refuses at once; the
limits are set in a fresh process, never this one's."""

import json
import subprocess
import sys

import pytest

from jdtensor._limits import MachineLimits, launch_capacity_problem, open_files_needed
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
from jdtensor import _limits as open_files
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


# -- what `jdtensor launch` needs of the machine ----------------------------------------

ROOMY = MachineLimits(open_now=6, files_soft=1024, files_hard=1 << 20, pid_max=4 << 20,
                      processes=300, nproc=None, ports=(32768, 60999))
FILES_FIX = ("Raise the hard limit where you launch: `ulimit -Hn {need}` (as root), "
             "Docker's `--ulimit nofile={need}:{need}`, systemd's `LimitNOFILE={need}`, "
             "or /etc/security/limits.conf; or start at most {fit} clients here.")


@pytest.mark.parametrize("case,n,total,client_0,picks,limits,expected", [
    ("fits", 4096, 4096, True, True, ROOMY, None),
    ("launcher files", 5000, 5000, False, True, ROOMY._replace(files_hard=20000),
     "-n 5000: the clients need about 20,070 open files: 20,070 in this launcher "
     "(4 per client: its output, its port, its log); but a process here may open at "
     "most 20,000 (the hard RLIMIT_NOFILE; soft 1,024). "
     + FILES_FIX.format(need=20070, fit="4,982")),
    ("client 0's files", 100000, 100000, True, True, ROOMY._replace(files_hard=20000),
     "-n 100000: the clients need about 400,320 open files: 400,070 in this launcher "
     "(4 per client: its output, its port, its log) and 400,320 in client 0 (its "
     "links and JAX's connections to every client); but a process here may open at "
     "most 20,000 (the hard RLIMIT_NOFILE; soft 1,024). "
     + FILES_FIX.format(need=400320, fit="4,920")),
    ("client 0 here, of 8 nodes", 1000, 8000, True, True, ROOMY._replace(files_hard=20000),
     "-n 1000: the clients need about 32,320 open files: 4,070 in this launcher "
     "(4 per client: its output, its port, its log) and 32,320 in client 0 (its "
     "links and JAX's connections to every client); but a process here may open at "
     "most 20,000 (the hard RLIMIT_NOFILE; soft 1,024). "
     + FILES_FIX.format(need=32320, fit="0")),
    ("not client 0's node", 1000, 8000, False, True, ROOMY._replace(files_hard=20000),
     None),
    ("process ids", 40000, 40000, False, True, ROOMY._replace(pid_max=32768),
     "-n 40000: this machine has room for 32,468 more processes at most (32,768 process "
     "ids, /proc/sys/kernel/pid_max; 300 in use). Start fewer clients here, or spread "
     "them over more machines (--nnodes)."),
    ("user's processes", 2000, 2000, False, True, ROOMY._replace(nproc=1500),
     "-n 2000: this user may run at most 1,500 processes and threads (the soft "
     "RLIMIT_NPROC), fewer than the clients alone. Raise it (`ulimit -u`, "
     "limits.conf's nproc) or start fewer clients here."),
    ("ports picked", 30000, 30000, False, True, ROOMY,
     "-n 30000: the launcher picks each client a free port from the ephemeral range "
     "32768-60999 (28,232 ports, /proc/sys/net/ipv4/ip_local_port_range), too few for "
     "the clients. Give --port P (clients use P..P+n-1), or start fewer clients here."),
    ("ports given", 30000, 30000, False, False, ROOMY, None),
    ("no limits known", 30000, 30000, True, False,
     MachineLimits(6, None, None, None, 0, None, None), None),
])
def test_a_launch_beyond_the_machine_is_refused_with_its_numbers(
    case, n, total, client_0, picks, limits, expected):
  del case
  assert launch_capacity_problem(n, total, client_0, picks, limits) == expected


def test_the_launcher_refuses_at_once_and_starts_nothing(tmp_path):
  """`-n 100000` with a hard limit of 20,000 open files: refused in well under
  a second (it ran 51 s into a raw EMFILE), exit code 2, no client started."""
  import time
  marker = tmp_path / "started"
  script = (f"import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, "
            f"(1024, 20000)); from jdtensor.cli import main; "
            f"sys.exit(main(['launch', '-n', '100000', '--', 'touch', {str(marker)!r}]))")
  start = time.monotonic()
  res = subprocess.run([sys.executable, "-c", script], env=clean_env(),
                       capture_output=True, text=True, timeout=60)
  took = time.monotonic() - start
  assert res.returncode == 2, res.stderr
  assert took < 5, took
  assert not marker.exists()
  line, = res.stderr.splitlines()
  assert line.startswith("jdtensor launch: -n 100000: the clients need about 400,3"), line
  assert ("a process here may open at most 20,000 (the hard RLIMIT_NOFILE; soft 1,024). "
          + FILES_FIX.format(need=400320, fit="4,920")) in line, line
