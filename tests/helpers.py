"""Subprocess helpers for tests: every wait has a deadline, nothing is left behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from jdtensor.launcher.processes import stop_process_groups

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Variables a test subprocess must not inherit from the developer's shell.
_SCRUBBED_PREFIXES = ("DTENSOR_", "JDTENSOR_", "JAX_", "XLA_FLAGS")


def clean_env(**overrides: str) -> dict[str, str]:
  """The current environment without DTENSOR_/JDTENSOR_/JAX_ variables."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(_SCRUBBED_PREFIXES) and not k.lower().endswith("_proxy")}
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  env.update(overrides)
  return env


@dataclass
class Result:
  returncode: int
  stdout: str
  stderr: str


def run_python(code: str, env: dict[str, str] | None = None,
               timeout: float = 60.0) -> Result:
  """Runs `code` in a fresh interpreter with a hard deadline.

  On expiry the whole process group gets SIGTERM, then SIGKILL after 3 s, and
  the test fails with the output so far.
  """
  proc = subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent(code)], env=env or clean_env(),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True, cwd=REPO)
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    stop_process_groups([proc], grace=3)
    out, err = proc.communicate(timeout=3)
    raise AssertionError(
        f"subprocess exceeded {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
  return Result(proc.returncode, out, err)


# The scenario clients, one per suite (`python <client> SCENARIO`).
CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "startup_client.py")
_CLIENTS = [CLIENT, os.path.join(REPO, "tests", "multiprocess", "clients", "heartbeat_client.py"),
            os.path.join(REPO, "tests", "faults", "fault_client.py")]


def client_for(scenario: str) -> str:
  """The client script that defines ``scenario_<scenario>``."""
  for path in _CLIENTS:
    with open(path) as f:
      if f"\ndef scenario_{scenario}()" in f.read():
        return path
  raise ValueError(f"no client defines scenario {scenario!r}")
# Short runtime time-outs for tests (JAX's own harness uses 10/5/15 s).
# The stuck time-out must be shorter than JAX's coordination time-out.
TEST_TIMEOUTS = {"JDTENSOR_INIT_TIMEOUT": "30", "JDTENSOR_COORDINATION_TIMEOUT": "10",
                 "JDTENSOR_STUCK_TIMEOUT": "8",
                 "JDTENSOR_SHUTDOWN_TIMEOUT": "15", "JDTENSOR_HEARTBEAT_PERIOD": "0.2"}


def free_port() -> int:
  from jdtensor.launcher import free_ports  # pylint: disable=g-import-not-at-top
  return free_ports(1)[0]


def parse_results(text: str) -> dict[int, dict[str, object]]:
  """``[client k] RESULT key=json`` lines -> {k: {key: value}}."""
  import json  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  out: dict[int, dict[str, object]] = {}
  for m in re.finditer(r"^\[client (\d+)\] RESULT (\w+)=(.*)$", text, re.M):
    out.setdefault(int(m.group(1)), {})[m.group(2)] = json.loads(m.group(3))
  return out


def start_clients(scenario: str, envs: list[dict[str, str]],
                  prefixes: list[list[str]] | None = None) -> list[subprocess.Popen]:
  """Starts one scenario client per env, each in its own process group.

  `prefixes` (one per client) run it through a wrapper, e.g.
  ``["ip", "netns", "exec", "host1"]``.
  """
  prefixes = prefixes or [[] for _ in envs]
  return [subprocess.Popen([*prefix, sys.executable, client_for(scenario), scenario],
                           env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True, cwd=REPO)
          for env, prefix in zip(envs, prefixes)]


def finish(procs: list[subprocess.Popen], timeout: float) -> list[Result]:
  """Waits for every process on one shared deadline; kills what is left."""
  import time  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + timeout
  results, expired = [], False
  for proc in procs:
    try:
      out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      expired = True
      stop_process_groups([proc], grace=3)
      out, err = proc.communicate(timeout=10)
    results.append(Result(proc.returncode, out, err))
  if expired:
    raise AssertionError(f"clients exceeded {timeout} s: {results}")
  return results


def cluster_env(jobs: list[str], client: int, devices: int = 1,
                secret: bool = True, **extra: str) -> dict[str, str]:
  """One hand-started client's environment; every client of `jobs` shares a
  run secret (derived from them) unless `secret` is False."""
  import hashlib  # pylint: disable=g-import-not-at-top
  env = {"DTENSOR_JOBS": ",".join(jobs), "DTENSOR_CLIENT_ID": str(client),
         "JAX_NUM_CPU_DEVICES": str(devices), **TEST_TIMEOUTS}
  if secret:
    env["JDTENSOR_RUN_SECRET"] = hashlib.sha256(
        ("test run " + ",".join(jobs)).encode()).hexdigest()
  return clean_env(**{**env, **extra})


def pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  # A zombie is dead for our purposes.
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"
  except OSError:
    return False


class LiveClients:
  """Scenario clients whose output is read as it comes (for kill tests)."""

  def __init__(self, scenario: str, envs: list[dict[str, str]],
               prefixes: list[list[str]] | None = None):
    import threading  # pylint: disable=g-import-not-at-top
    self.procs = start_clients(scenario, envs, prefixes)
    self.out = ["" for _ in envs]
    self.err = ["" for _ in envs]
    self.ended: dict[int, float] = {}
    self._lock = threading.Lock()
    self._threads = []
    for i, proc in enumerate(self.procs):
      for stream, sink in ((proc.stdout, self.out), (proc.stderr, self.err)):
        t = threading.Thread(target=self._pump, args=(i, stream, sink), daemon=True)
        t.start()
        self._threads.append(t)

  def _pump(self, i, stream, sink):
    for line in iter(stream.readline, ""):
      with self._lock:
        sink[i] += line

  def wait_for(self, marker: str, clients: list[int], timeout: float) -> bool:
    import time  # pylint: disable=g-import-not-at-top
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      with self._lock:
        if all(marker in self.out[i] for i in clients):
          return True
      time.sleep(0.02)
    return False

  def wait_exit(self, start: float, timeout: float) -> dict[int, float]:
    """Seconds from `start` (monotonic) to each client's exit; kills leftovers."""
    import time  # pylint: disable=g-import-not-at-top
    deadline = start + timeout
    while time.monotonic() < deadline and len(self.ended) < len(self.procs):
      for i, proc in enumerate(self.procs):
        if i not in self.ended and proc.poll() is not None:
          self.ended[i] = time.monotonic() - start
      time.sleep(0.01)
    self.close()
    return self.ended

  def close(self) -> None:
    stop_process_groups(self.procs, grace=3)
    for t in self._threads:
      t.join(timeout=5)


def kill_when_ready(scenario: str, envs: list[dict[str, str]], victim: int,
                    sig: int = signal.SIGKILL, prefixes: list[list[str]] | None = None,
                    exit_timeout: float = 30) -> tuple["LiveClients", dict[int, float]]:
  """Starts clients, waits until all print ``RESULT ready``, signals `victim`.

  Returns:
    The clients (closed) and each one's seconds from the signal to its exit.
  """
  import time  # pylint: disable=g-import-not-at-top
  live = LiveClients(scenario, envs, prefixes)
  try:
    if not live.wait_for("RESULT ready", list(range(len(envs))), timeout=120):
      raise AssertionError(f"clients never became ready: {live.err}")
    time.sleep(0.5)
    start = time.monotonic()
    os.kill(live.procs[victim].pid, sig)
    ended = live.wait_exit(start, timeout=exit_timeout)
  finally:
    live.close()
  return live, ended


def start_launcher(scenario: str, n: int = 2, marker: str = "RESULT ready=",
                   **env: str) -> tuple[subprocess.Popen, list[int]]:
  """`python -m jdtensor launch -n N` of a scenario client; waits for every client's
  pid (printed as ``<marker><pid>``)."""
  import time  # pylint: disable=g-import-not-at-top
  proc = subprocess.Popen(
      [sys.executable, "-m", "jdtensor", "launch", "-n", str(n), "--grace", "2",
       "--timeout", "120", "--", sys.executable, client_for(scenario), scenario],
      env=clean_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, cwd=REPO, start_new_session=True)
  pids, deadline = [], time.monotonic() + 60
  while len(pids) < n and time.monotonic() < deadline:
    line = proc.stdout.readline()
    if marker in line:
      pids.append(int(line.rsplit(marker, 1)[1].split()[0]))
  return proc, pids


def sigterm_launcher(proc: subprocess.Popen, pids: list[int]
                     ) -> tuple[int, str, float]:
  """SIGTERMs a launcher once its clients are up; (returncode, stderr, seconds)."""
  import time  # pylint: disable=g-import-not-at-top
  try:
    if len(pids) < 2:
      raise AssertionError(f"the launcher's clients did not start: {pids}")
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err, time.monotonic() - start
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate(timeout=10)


def launch_clients(command: list[str], n: int, devices: int = 1,
                   timeout: float = 120, grace: float = 3, **env: str):
  """Runs `command` on n clients through the launcher, in this process.

  Returns:
    (LaunchResult, the clients' tagged stdout, their tagged stderr plus the
    launcher's summary line, monotonic time the launcher returned).
  """
  import io  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  from jdtensor import launcher  # pylint: disable=g-import-not-at-top
  out, err = io.StringIO(), io.StringIO()
  res = launcher.launch(launcher.LaunchSpec(
      command=tuple(command), num_clients=n, devices_per_client=devices,
      timeout=timeout, grace=grace), out=out, err=err,
      env=clean_env(**{**TEST_TIMEOUTS, **env}))
  return res, out.getvalue(), err.getvalue(), time.monotonic()


# A private mount namespace whose /dev is a tmpfs with the host's everyday
# nodes bound back in and `count` fake NVIDIA device nodes added: what a GPU
# node shows a process before JAX starts (jdtensor counts /dev/nvidia<N>).
_FAKE_GPU_NODE = r"""
set -e
real=$(mktemp -d)
mount --bind /dev "$real"
mount -t tmpfs tmpfs /dev
for n in null zero random urandom full tty ptmx shm pts; do
  if [ -d "$real/$n" ]; then mkdir "/dev/$n"; mount --bind "$real/$n" "/dev/$n"
  elif [ -e "$real/$n" ]; then touch "/dev/$n"; mount --bind "$real/$n" "/dev/$n"; fi
done
ln -s /proc/self/fd /dev/fd
i=0
while [ "$i" -lt "$FAKE_GPUS" ]; do touch "/dev/nvidia$i"; i=$((i + 1)); done
touch /dev/nvidiactl
exec "$@"
"""


def fake_gpu_node_command(count: int, command: list[str]) -> list[str]:
  """`command` run on a faked GPU node: `count` fake ``/dev/nvidia<N>`` nodes
  in a private mount namespace (the host's /dev is untouched). Skips the
  test where mount namespaces cannot be made (no root, no ``unshare``)."""
  import shutil  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top
  if shutil.which("unshare") is None or subprocess.run(
      ["unshare", "-m", "true"], capture_output=True, timeout=10).returncode != 0:
    pytest.skip("needs a private mount namespace (root and unshare) to fake GPU nodes")
  return ["env", f"FAKE_GPUS={count}", "unshare", "-m", "sh", "-c", _FAKE_GPU_NODE,
          "sh", *command]


class TrickleServer:
  """Accepts one upload at a time and reads 64 KiB/s of it (a slow link)."""

  def __init__(self) -> None:
    self.sock = socket.create_server(("127.0.0.1", 0))
    self.sock.settimeout(0.5)
    self.port = self.sock.getsockname()[1]
    self.received = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._serve, daemon=True)
    self._thread.start()

  def _serve(self) -> None:
    while not self._stop.is_set():
      try:
        conn, _ = self.sock.accept()
      except OSError:
        continue
      with conn:
        conn.settimeout(0.5)
        # A small receive buffer, so that the sender waits on the link.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        while not self._stop.is_set():
          try:
            chunk = conn.recv(6554)  # 64 KiB/s at 10 reads a second.
          except TimeoutError:
            continue
          except OSError:
            break
          if not chunk:
            break
          self.received += len(chunk)
          time.sleep(0.1)

  def close(self) -> None:
    self._stop.set()
    self._thread.join(5)
    self.sock.close()


def run_pytest(path, *args, timeout=240):
  """pytest on `path` in a fresh process group (deadline: `timeout`);
  returns (exit code, {test name: (outcome, message, text)}, output)."""
  report = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                        f"jdtensor-junit-{os.getpid()}-{os.path.basename(path)}.xml")
  proc = subprocess.Popen(
      [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
       f"--junitxml={report}", path, *args],
      cwd=REPO, env=clean_env(**TEST_TIMEOUTS), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    out, _ = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, 9)
    out, _ = proc.communicate(timeout=10)
    raise AssertionError(f"pytest exceeded {timeout} s:\n{out}")
  outcomes = {}
  if not os.path.exists(report):  # A usage error: pytest ran nothing.
    return proc.returncode, outcomes, out
  try:
    for case in ET.parse(report).getroot().iter("testcase"):
      bad = case.find("failure")
      if bad is None:
        bad = case.find("error")
      outcomes[case.get("name")] = (
          "passed" if bad is None else bad.tag,
          "" if bad is None else bad.get("message", ""),
          "" if bad is None else (bad.text or ""))
  finally:
    os.remove(report)
  return proc.returncode, outcomes, out
