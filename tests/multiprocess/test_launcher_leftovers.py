"""Nothing a run made outlives it: the folders of a SIGKILLed launcher go
with the next launch, and the processes a client orphans (a data loader's
worker, a daemon that left its session) end with the run, reaped, also
when the launcher is a container's pid 1.

No JAX: plain Python clients, started by the real launcher (in this process
or as ``jdtensor launch``); every process is waited for with a deadline.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers import REPO, clean_env, launch_clients

pytestmark = pytest.mark.multiprocess

# A client that leaves a daemon behind: it forks, the child leaves the
# session (setsid) and forks the daemon, which drops the client's
# environment (so nothing carries the run folder) and its output, and
# sleeps; the client prints the daemon's pid and ends with code 0.
DAEMON_CLIENT = textwrap.dedent("""
    import os, sys
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
      os.setsid()
      if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
          os.dup2(null, fd)
        os.execve("/bin/sleep", ["sleep", "600"], {})
      os._exit(0)
    os.close(w)
    os.waitpid(child, 0)
    print("DAEMON", int(os.read(r, 32)), flush=True)
    """)

# A client that orphans a process every 0.1 s (each ends 50 ms later), then
# counts the zombies whose parent is pid 1 (the launcher, in its own pid
# namespace) and ends with code 3.
ORPHANS_CLIENT = textwrap.dedent("""
    import os, sys, time
    for _ in range(30):
      child = os.fork()
      if child == 0:
        if os.fork() == 0:
          time.sleep(0.05)
          os._exit(0)
        os._exit(0)
      os.waitpid(child, 0)
      time.sleep(0.1)
    time.sleep(1.0)
    zombies = 0
    for name in os.listdir("/proc"):
      try:
        with open(f"/proc/{name}/stat") as f:
          state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
      except (OSError, ValueError):
        continue
      zombies += state == "Z" and ppid == "1"
    print("ZOMBIES", zombies, flush=True)
    sys.exit(3)
    """)


def _gone(pid: int) -> bool:
  """No such process, not even a zombie (its parent reaped it)."""
  return not os.path.exists(f"/proc/{pid}")


def test_a_clients_setsid_daemon_ends_with_the_run_and_is_reaped():
  """A daemon that left the client's session and environment is not found
  by the run folder; the launcher adopts it (a child subreaper) and stops it
  at the run's end, then reaps it: no process and no zombie is left."""
  res, out, err, _ = launch_clients([sys.executable, "-c", DAEMON_CLIENT], 1, grace=5)
  daemon = int(out.split("DAEMON ", 1)[1].split()[0]) if "DAEMON " in out else None
  try:
    assert res.exit_code == 0 and daemon is not None, (out, err)
    assert _gone(daemon), open(f"/proc/{daemon}/stat").read()
  finally:
    if daemon is not None and not _gone(daemon):
      os.kill(daemon, signal.SIGKILL)


def test_a_launcher_at_pid_1_reaps_its_clients_orphans_while_it_runs():
  """As a container's init (pid 1 of its own pid namespace), orphans come to
  the launcher: it reaps them as they end (no zombies pile up), and its
  client's own exit status is intact (3, not stolen by the reaping)."""
  prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
  if subprocess.run([*prefix, "true"], capture_output=True, timeout=10,
                    check=False).returncode:
    pytest.skip("needs pid namespaces (root and unshare) to start a launcher as pid 1")
  proc = subprocess.run(
      [*prefix, sys.executable, "-m", "jdtensor", "launch", "-n", "1", "--grace", "2",
       "--timeout", "60", "--", sys.executable, "-c", ORPHANS_CLIENT],
      capture_output=True, text=True, timeout=90, cwd=REPO, env=clean_env())
  assert proc.returncode == 3, proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == (
      "jdtensor launch: client 0 exited with code 3; stopped clients none"), proc.stderr
  zombies = int(proc.stdout.split("ZOMBIES ", 1)[1].split()[0])
  assert zombies <= 3, proc.stdout  # 30 orphans ended over 3 s.


def test_a_sigkilled_launchers_cache_and_trace_folders_go_with_the_next_launch(tmp_path):
  """A launcher SIGKILLed mid-run leaves its report folder, its run's
  compilation cache and its trace's parts; the next launch of the same
  user removes them all, and nothing else (a folder of the user's named
  like ours stays)."""
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  (tmp / "jdtensor-trace-mine").mkdir()  # The user's own: never removed.
  env = clean_env(TMPDIR=str(tmp), XDG_RUNTIME_DIR=str(tmp_path))
  # One client on CPU with a restart: the run has a compilation cache.
  proc = subprocess.Popen(
      [sys.executable, "-m", "jdtensor", "launch", "-n", "1", "--max-restarts", "1",
       "--trace", str(tmp_path / "run.json"), "--", sys.executable, "-c",
       "import time; print('UP', flush=True); time.sleep(60)"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
      start_new_session=True)
  try:
    deadline = time.monotonic() + 60
    while "UP" not in proc.stdout.readline() and time.monotonic() < deadline:
      assert proc.poll() is None, proc.stderr.read()
    made = {prefix: glob.glob(str(tmp / f"{prefix}*")) for prefix in
            ("jdtensor-launch-", "jdtensor-compile-cache-", "jdtensor-trace-")}
    assert all(made.values()), made
    proc.kill()  # The launcher alone: its guardians end its client.
    proc.communicate(timeout=10)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate(timeout=10)
  left = sorted(os.listdir(tmp))
  assert len(left) == 4, left  # What the SIGKILL left, and the user's folder.
  later = subprocess.run(
      [sys.executable, "-m", "jdtensor", "launch", "-n", "1", "--", sys.executable,
       "-c", "pass"], capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
  assert later.returncode == 0, later.stderr
  assert sorted(os.listdir(tmp)) == ["jdtensor-trace-mine"]
  assert os.listdir(tmp_path / "jdtensor") == []  # No record left either.
