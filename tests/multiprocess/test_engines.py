"""Under a real engine: Open MPI's `mpirun` and a one-node SLURM (`srun`,
`sbatch`) start the clients (no jdtensor launcher, no report folder),
cluster detection finds who is who, and the engine's own summary names the
client jdtensor names.

`.ci/run` installs Debian's ``openmpi-bin``, ``slurm-wlm`` and ``munge``
where they are missing; the SLURM tests start ``munged``, ``slurmctld`` and
``slurmd`` on this machine (a configuration that works in a container:
``proctrack/linuxproc``, ``task/none``) and stop them after. Without the
engine (or without root, for SLURM's daemons), a test skips with that
reason.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, clean_env, finish, free_port

pytestmark = pytest.mark.multiprocess

MPIRUN = shutil.which("mpirun")
CLIENT = os.path.join(REPO, "benchmarks", "_gpu_check_client.py")
SECRET = "engine-test-secret-0123456789"


def client_variables(scen: str, detection: str) -> dict[str, str]:
  """What every client of the GPU check's client on CPU devices is given
  (SCENARIO: what client 1 does at step 3)."""
  return {"JDTENSOR_CLUSTER_DETECTION": detection, "SCENARIO": scen, "CULPRIT": "1",
          "DEVICE": "CPU", "WAIT_ON": "CPU", "JDTENSOR_RUN_SECRET": SECRET,
          "JDTENSOR_HEARTBEAT_PERIOD": "0.5", "JDTENSOR_STALL_TIMEOUT": "5"}


def mpirun(scen: str, detection: str = "ompi", n: int = 3, timeout: float = 90):
  """`mpirun -np n` of the GPU check's client; (return code, stdout +
  stderr)."""
  if MPIRUN is None:
    pytest.skip("mpirun is not installed (apt-get install openmpi-bin)")
  variables = client_variables(scen, detection)
  command = [MPIRUN, "--oversubscribe", "-np", str(n)]
  if os.geteuid() == 0:
    command.append("--allow-run-as-root")
  for name in [*variables, "PYTHONPATH", "JAX_PLATFORMS"]:
    command += ["-x", name]
  command += [sys.executable, CLIENT]
  proc = subprocess.Popen(command, env=clean_env(**variables), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          start_new_session=True)
  result = finish([proc], timeout)[0]
  return result.returncode, result.stdout


def first_failed(out: str) -> tuple[int, str]:
  """(rank, what) mpirun's summary names as the first process to fail."""
  exited = re.search(r"The first process to do so was:\s+Process name: \[\[\d+,\d+\],(\d+)\]"
                     r"\s+Exit code:\s+(\d+)", out)
  if exited:
    return int(exited.group(1)), f"exit code {exited.group(2)}"
  signalled = re.search(r"mpirun noticed that process rank (\d+) with PID \d+ on node "
                        r"\S+ exited on signal (\d+)", out)
  assert signalled, out
  return int(signalled.group(1)), f"signal {signalled.group(2)}"


@pytest.mark.parametrize("detection", ["ompi", "auto"])
def test_mpirun_starts_the_clients_and_a_cross_client_psum_runs(detection):
  code, out = mpirun("none", detection)
  assert code == 0, out
  assert out.count("PSUM 3 over 3 CPU devices") == 3 and out.count("DONE") == 3, out
  assert "not authenticated" not in out, out


# What client 1 does, mpirun's exit status and summary, and what every other
# client says (one line each, no traceback of theirs).
CASES = {
    "kill": (137, "signal 9", r"heartbeat: client 1 missed beat \d+ \(last seen [0-9.]+ s "
             r"ago; its process ended without saying goodbye\)"),
    "raise": (1, "exit code 1", r"heartbeat: client 1 failed: RuntimeError: gpu_check: "
              r"client 1 raises at step 3 \(_gpu_check_client.py:\d+ in <module>\)"),
    "stall": (70, "exit code 70", r"heartbeat: client 1 stalled: main thread in "
              r"_gpu_check_client.py:\d+ next_batch <- _gpu_check_client.py:\d+ <module> "
              r"for 5 s, idle \(\d+% of a core, [\d.]+ [KM]?i?B/s read or written\), "
              r"while clients 0, 2 wait in a collective"),
}


@pytest.mark.parametrize("scen", sorted(CASES))
def test_mpirun_names_the_client_jdtensor_names(scen):
  """The engine's "first process to fail" is the culprit, not a survivor
  that left because of it (the survivors wait for the culprit's end, up to
  a grace); the survivors say so in one line each."""
  status, first, line = CASES[scen]
  code, out = mpirun(scen)
  assert code == status, out
  assert first_failed(out) == (1, first), out
  assert len(re.findall(line, out)) >= 2, out  # Both survivors.
  # The culprit's own traceback only (an exception's), none of a survivor's.
  assert out.count("Traceback (most recent call last)") == (scen == "raise"), out
  assert "Gloo all-reduce failed" not in out, out
  assert_each_shows_its_stack(out, scen)


def assert_each_shows_its_stack(out, scen):
  """Under an engine, each client still running at the verdict shows where
  its main thread was, on its own stderr (a staller too; a survivor whose
  collective failed with the dead client may be leaving already)."""
  showing = {int(c) for c in re.findall(
      r"heartbeat: client (\d)'s main thread when the verdict was named \([^)]+\): "
      r"(?:\S+:\d+ |its script has ended)", out)}
  assert showing == ({0, 1, 2} if scen == "stall" else {0, 2}), out
  assert re.search(r"client 1's main thread when the verdict was named \(own code\): "
                   r"_gpu_check_client\.py:\d+ next_batch", out) or scen != "stall", out


# -- SLURM --------------------------------------------------------------------

SLURM_CONF = """\
ClusterName=jdtensor
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=5
NodeName={host} CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _stop_pid_file(path: str) -> None:
  try:
    with open(path, encoding="utf-8") as f:
      pid = int(f.read().strip())
  except (OSError, ValueError):
    return
  for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
    try:
      os.kill(pid, sig)
    except ProcessLookupError:
      return
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
      try:
        os.kill(pid, 0)
      except ProcessLookupError:
        return
      time.sleep(0.1)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  """A one-node SLURM on this machine for the module's tests: its
  ``SLURM_CONF``. munged is started if none runs (and left running: other
  users of this machine's munge may need it)."""
  missing = [d for d in ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo")
             if shutil.which(d) is None]
  if missing:
    pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing; "
                "apt-get install slurm-wlm munge)")
  if os.geteuid() != 0:
    pytest.skip("starting slurmd needs root")
  if subprocess.run(["pgrep", "-x", "munged"], capture_output=True,
                    timeout=10).returncode != 0:
    os.makedirs("/run/munge", exist_ok=True)
    started = subprocess.run(["munged", "--force"], capture_output=True, text=True,
                             timeout=30)
    if started.returncode != 0:
      pytest.skip(f"munged did not start: {started.stderr.strip()}")
  folder = str(tmp_path_factory.mktemp("slurm"))
  for sub in ("state", "spool"):
    os.makedirs(os.path.join(folder, sub))
  conf = os.path.join(folder, "slurm.conf")
  with open(conf, "w", encoding="utf-8") as f:
    f.write(SLURM_CONF.format(host=socket.gethostname(), ctld_port=free_port(),
                              d_port=free_port(), dir=folder))
  env = {**os.environ, "SLURM_CONF": conf}
  try:
    for daemon in ("slurmctld", "slurmd"):
      subprocess.run([daemon, "-f", conf], env=env, check=True, timeout=30,
                     capture_output=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
      state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, text=True,
                             capture_output=True, timeout=10).stdout.strip()
      if state == "idle":
        break
      time.sleep(0.5)
    else:
      logs = "".join(open(os.path.join(folder, n), encoding="utf-8").read()[-2000:]
                     for n in ("slurmctld.log", "slurmd.log")
                     if os.path.exists(os.path.join(folder, n)))
      raise AssertionError(f"the SLURM node did not become idle in 30 s:\n{logs}")
    yield conf
  finally:
    for daemon in ("slurmd", "slurmctld"):
      _stop_pid_file(os.path.join(folder, f"{daemon}.pid"))


def srun(conf: str, scen: str, detection: str = "slurm", n: int = 3,
         timeout: float = 90, batch: bool = False):
  """`srun -n n` of the GPU check's client (or `sbatch --wait` of a script
  that runs it so); (return code, srun's output, or the job's file)."""
  env = clean_env(**client_variables(scen, detection), SLURM_CONF=conf)
  step = ["srun", "-n", str(n), sys.executable, CLIENT]
  if batch:
    folder = os.path.dirname(conf)
    script, out = os.path.join(folder, f"job-{scen}.sh"), os.path.join(folder, f"job-{scen}.out")
    with open(script, "w", encoding="utf-8") as f:
      f.write("#!/bin/bash\n" + " ".join(step) + "\n")
    command = ["sbatch", "--wait", "-n", str(n), "-o", out, script]
  else:
    command = step
  proc = subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, start_new_session=True)
  result = finish([proc], timeout)[0]
  if batch:
    with open(out, encoding="utf-8") as f:
      return result.returncode, f.read()
  return result.returncode, result.stdout


@pytest.mark.parametrize("detection,batch", [("slurm", False), ("auto", False),
                                             ("slurm", True)],
                         ids=["srun", "srun-auto", "sbatch"])
def test_srun_and_sbatch_start_the_clients_and_a_psum_runs(slurm, detection, batch):
  code, out = srun(slurm, "none", detection, batch=batch)
  assert code == 0, out
  assert out.count("PSUM 3 over 3 CPU devices") == 3 and out.count("DONE") == 3, out
  assert "not authenticated" not in out, out


@pytest.mark.parametrize("scen", sorted(CASES))
def test_srun_names_the_client_jdtensor_names(slurm, scen):
  """srun's error lines come as the tasks end: the culprit's first (its
  exit code, or "Killed"); srun's own exit status is the highest of the
  tasks' (SLURM's rule), so a SIGKILL's 137 and otherwise the survivors' 75.
  The survivors say so in one line each."""
  _, first, line = CASES[scen]
  code, out = srun(slurm, scen)
  errors = re.findall(r"srun: error: \S+: tasks? ([\d,-]+): (.*)", out)
  assert errors, out
  if scen == "kill":
    assert code == 137 and ("1", "Killed") in errors, out
  else:
    assert code == 75, out
    assert errors[0] == ("1", f"Exited with {first}"), out
    assert ("0,2", "Exited with exit code 75") in errors, out
  assert len(re.findall(line, out)) >= 2, out
  assert out.count("Traceback (most recent call last)") == (scen == "raise"), out
  assert "Gloo all-reduce failed" not in out, out
  assert_each_shows_its_stack(out, scen)


def test_scancel_signal_term_saves_the_same_step_on_every_client(slurm):
  """A preemption under SLURM (``scancel --signal=TERM``): JAX takes SIGTERM
  as its preemption notice, and every client saves the same step at
  `multihost_utils.reached_preemption_sync_point` (orbax's
  ``reached_preemption``), then the job ends 0."""
  folder = os.path.dirname(slurm)
  script, out = os.path.join(folder, "preempt.sh"), os.path.join(folder, "preempt.out")
  with open(script, "w", encoding="utf-8") as f:
    f.write(f"#!/bin/bash\nsrun {sys.executable} "
            f"{os.path.join(REPO, 'tests', 'multiprocess', 'clients', 'preempt_client.py')}\n")
  env = clean_env(JDTENSOR_CLUSTER_DETECTION="slurm", JDTENSOR_RUN_SECRET=SECRET,
                  SLURM_CONF=slurm, STEPS="100000")
  submitted = subprocess.run(["sbatch", "--parsable", "-n", "3", "-o", out, script],
                             env=env, text=True, capture_output=True, timeout=30)
  assert submitted.returncode == 0, submitted.stderr
  job = submitted.stdout.strip().split(";")[0]

  def state() -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=env, text=True,
                          capture_output=True, timeout=10).stdout.strip()
  try:
    deadline = time.monotonic() + 60
    while state() != "RUNNING" and time.monotonic() < deadline:
      time.sleep(0.2)
    time.sleep(8)  # Start-up and some steps.
    subprocess.run(["scancel", "--signal=TERM", job], env=env, check=True, timeout=30)
    deadline = time.monotonic() + 60
    while state() and time.monotonic() < deadline:
      time.sleep(0.2)
    assert not state(), f"job {job} still {state()} 60 s after the preemption"
  finally:
    subprocess.run(["scancel", job], env=env, timeout=30)
  with open(out, encoding="utf-8") as f:
    text = f.read()
  saved = re.findall(r"SAVED step (\d+)", text)
  assert len(saved) == 3 and len(set(saved)) == 1, text
  assert "DONE without a preemption" not in text, text
