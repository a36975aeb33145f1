"""The launcher and start-up under careless use: closed
terminals and impatient Ctrl-C's, huge output, inherited environments,
mixed address families. Each group is one parametrised test with deadlines,
asserting exit codes, timing and the exact lines."""

import glob
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.helpers import REPO, clean_env, pid_alive
from jdtensor.launcher.processes import stop_process_groups

pytestmark = pytest.mark.multiprocess

PREEMPT_CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "preempt_client.py")


class LiveLauncher:
  """`jdtensor launch` in its own session, its output read as it comes;
  every wait has a deadline, and `close` leaves nothing running."""

  def __init__(self, tmp_path, args, command, tty=False, **env):
    self.tmp = tmp_path
    self.env = clean_env(PYTHONPATH=REPO, TMPDIR=str(tmp_path),
                         XDG_RUNTIME_DIR=str(tmp_path), **env)
    argv = [sys.executable, "-m", "jdtensor", "launch", *args, "--", *command]
    self.lines: list[str] = []
    self._lock = threading.Lock()
    self._hanging_up = threading.Event()
    if tty:
      # The launcher leads a session whose controlling terminal is a pty:
      # closing its other end is an ssh session dropping (SIGHUP, and every
      # later write fails).
      self.master, slave = os.openpty()
      self.proc = subprocess.Popen(["setsid", "--ctty", *argv], stdin=slave,
                                   stdout=slave, stderr=slave, env=self.env, cwd=REPO)
      os.close(slave)
      streams = [self.master]
    else:
      self.master = None
      self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env=self.env, cwd=REPO, start_new_session=True)
      streams = [self.proc.stdout, self.proc.stderr]
    self._threads = [threading.Thread(target=self._pump, args=(s,), daemon=True)
                     for s in streams]
    for t in self._threads:
      t.start()

  def _pump(self, stream):
    buf = b""
    poller = None
    if isinstance(stream, int):  # The pty: polled, so that `hang_up` can close it.
      poller = select.poll()
      poller.register(stream, select.POLLIN)
    while True:
      if poller is not None:
        if self._hanging_up.is_set():
          break
        if not poller.poll(50):
          continue
      try:
        chunk = (os.read(stream, 65536) if poller is not None else stream.read1(65536))
      except OSError:
        chunk = b""
      if not chunk:
        break
      buf += chunk
      *done, buf = buf.split(b"\n")
      with self._lock:
        self.lines += [d.decode(errors="replace").rstrip("\r") for d in done]

  def hang_up(self) -> None:
    """Closes the terminal's other end: the kernel sends the launcher SIGHUP."""
    self._hanging_up.set()
    for t in self._threads:
      t.join(timeout=5)
    os.close(self.master)
    self.master = None

  def text(self) -> str:
    with self._lock:
      return "\n".join(self.lines)

  def wait_for(self, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      with self._lock:
        if predicate(list(self.lines)):
          return
      if self.proc.poll() is not None:
        break
      time.sleep(0.02)
    raise AssertionError(f"not seen within {timeout} s:\n{self.text()}")

  def count(self, text: str) -> int:
    with self._lock:
      return sum(text in line for line in self.lines)

  def wait(self, timeout: float) -> int:
    try:
      return self.proc.wait(timeout=timeout)
    finally:
      self.close()

  def close(self) -> None:
    if self.proc.poll() is None:
      stop_process_groups([self.proc], grace=3)
    if self.master is not None:
      try:
        os.close(self.master)
      except OSError:
        pass
      self.master = None
    for t in self._threads:
      t.join(timeout=5)

  def left_behind(self) -> list[str]:
    """The launcher's report folders and run registrations still there."""
    return (glob.glob(os.path.join(self.tmp, "jdtensor-launch-*"))
            + glob.glob(os.path.join(self.tmp, "jdtensor", "run-*")))

  def client_pids(self) -> list[int]:
    """Every process of this launch still running (its session's)."""
    out = subprocess.run(["pgrep", "-f", PREEMPT_CLIENT], capture_output=True,
                         text=True, timeout=10).stdout
    return [int(p) for p in out.split()]


def saved_steps(text):
  import re
  return {int(c): int(s) for c, s in re.findall(r"^\[client (\d)\] SAVED step (\d+)$",
                                                 text, re.M)}


STOPPING = ("jdtensor launch: received {name}: stopping clients 0, 1, 2 (SIGTERM, "
            "then SIGKILL after 30 s); {again} to kill them now")


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT",
                                 "a closed terminal"])
def test_every_stop_signal_saves_summarises_and_leaves_nothing(tmp_path, how):
  """A dropped ssh session, Ctrl-C, a scheduler's SIGTERM, SIGQUIT: the same
  stop (every client saves the same step), the notice, the summary, and no
  report folder or registration left behind."""
  tty = how == "a closed terminal"
  logs = ["--log-dir", str(tmp_path / "logs")] if tty else []
  run = LiveLauncher(tmp_path, ["-n", "3", "--timeout", "100", *logs],
                     [sys.executable, PREEMPT_CLIENT], tty=tty,
                     SAVE_SECONDS="1", JDTENSOR_HEARTBEAT_PERIOD="0.5")
  try:
    run.wait_for(lambda lines: sum("RUNNING" in l for l in lines) == 3, 60)
    name = "SIGHUP" if tty else how
    start = time.monotonic()
    if tty:
      run.hang_up()
    else:
      run.proc.send_signal(getattr(signal, how))
    code = run.wait(40)
  finally:
    run.close()
  took = time.monotonic() - start
  assert code == 128 + getattr(signal, name), run.text()
  assert took < 10, (took, run.text())
  assert not run.left_behind(), run.left_behind()
  assert not run.client_pids()
  if tty:  # Nobody reads the terminal any more: the clients' logs tell.
    text = "\n".join(f"[client {k}] {line}" for k in range(3) for line in
                     (tmp_path / "logs" / f"client-{k}.log").read_text().splitlines())
  else:
    text = run.text()
  steps = saved_steps(text)
  assert sorted(steps) == [0, 1, 2] and len(set(steps.values())) == 1, text
  if tty:
    return
  again = "press Ctrl-C again" if how == "SIGINT" else f"send {how} again"
  lines = text.splitlines()
  assert STOPPING.format(name=how, again=again) in lines, text
  assert lines[-1] == f"jdtensor launch: received {how}; stopped clients 0, 1, 2", text


@pytest.mark.parametrize("second", ["SIGINT", "SIGTERM"])
def test_a_second_stop_signal_kills_at_once(tmp_path, second):
  """Clients whose save would take 20 s: the second signal ends the grace."""
  run = LiveLauncher(tmp_path, ["-n", "3", "--timeout", "100"],
                     [sys.executable, PREEMPT_CLIENT],
                     SAVE_SECONDS="20", JDTENSOR_HEARTBEAT_PERIOD="0.5")
  try:
    run.wait_for(lambda lines: sum("RUNNING" in l for l in lines) == 3, 60)
    run.proc.send_signal(signal.SIGINT)
    run.wait_for(lambda lines: any("stopping clients" in l for l in lines), 10)
    time.sleep(1)
    start = time.monotonic()
    run.proc.send_signal(getattr(signal, second))
    code = run.wait(30)
  finally:
    run.close()
  took = time.monotonic() - start
  assert code == 128 + signal.SIGINT, run.text()
  assert took < 3, (took, run.text())
  lines = run.text().splitlines()
  cut = "SIGINT again"
  assert f"jdtensor launch: received {cut}: killing the clients now (SIGKILL)" in lines
  assert lines[-1] == ("jdtensor launch: received SIGINT; stopped clients 0, 1, 2 "
                       f"(clients 0, 1, 2 killed at once: {cut})"), lines
  assert "SAVED" not in run.text()
  assert not run.left_behind()


def test_ctrl_z_is_refused_and_the_run_goes_on(tmp_path):
  run = LiveLauncher(tmp_path, ["-n", "2", "--timeout", "100"],
                     [sys.executable, PREEMPT_CLIENT], STEPS="100000",
                     SAVE_SECONDS="0", JDTENSOR_HEARTBEAT_PERIOD="0.5")
  try:
    run.wait_for(lambda lines: sum("RUNNING" in l for l in lines) == 2, 60)
    run.proc.send_signal(signal.SIGTSTP)
    run.wait_for(lambda lines: any("Ctrl-Z" in l for l in lines), 10)
    time.sleep(1)
    with open(f"/proc/{run.proc.pid}/stat") as f:
      assert f.read().split(")")[-1].split()[0] != "T"  # Not stopped.
    run.proc.send_signal(signal.SIGTERM)
    code = run.wait(30)
  finally:
    run.close()
  assert code == 128 + signal.SIGTERM, run.text()
  assert ("jdtensor launch: Ctrl-Z ignored: the clients run on (paused for longer "
          "than the heartbeat's stuck time-out, they would count themselves stuck); "
          "Ctrl-C stops the run") in run.text().splitlines()
  assert len(saved_steps(run.text())) == 2, run.text()


def test_what_a_sigkilled_launcher_left_is_removed_by_the_next_launch(tmp_path):
  run = LiveLauncher(tmp_path, ["-n", "2", "--timeout", "100"],
                     [sys.executable, PREEMPT_CLIENT], JDTENSOR_HEARTBEAT_PERIOD="0.5")
  try:
    run.wait_for(lambda lines: sum("RUNNING" in l for l in lines) == 2, 60)
    run.proc.kill()
    run.wait(10)
  finally:
    run.close()
  deadline = time.monotonic() + 10
  while run.client_pids() and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not run.client_pids()
  assert len(run.left_behind()) == 2, run.left_behind()  # Its folder, its record.
  again = subprocess.run([sys.executable, "-m", "jdtensor", "launch", "-n", "1", "--",
                          "true"], env=run.env, cwd=REPO, capture_output=True,
                         text=True, timeout=60)
  assert again.returncode == 0, again.stderr
  assert not run.left_behind(), run.left_behind()


# A client that writes `size` bytes to stdout: one line without a newline,
# or lines of 99 bytes; and one UTF-8 character of 3 bytes at every 1,000th
# byte, so that a piece's cut must fall between characters.
WRITER = """
import sys
size, shape = int(sys.argv[1]), sys.argv[2]
unit = ("x" * 97 + "\\u20ac") if shape == "one line" else ("x" * 98 + "\\n")
text = (unit * (size // 100 + 1))[:size]
sys.stdout.write(text); sys.stdout.flush()
"""
# The launcher in-process, saying how much memory it held at its peak
# (VmHWM: ru_maxrss would count the forking pytest's pages, kept over exec).
MEASURED_LAUNCHER = ("import re, sys; from jdtensor.cli import main; code = "
                     "main(sys.argv[1:]); print('MAXRSS_KB', re.search(r'VmHWM:\\s*(\\d+)', "
                     "open('/proc/self/status').read()).group(1), file=sys.stderr); "
                     "sys.exit(code)")


@pytest.mark.parametrize("size_mb, shape", [(1, "one line"), (32, "one line"),
                                            (32, "short lines")])
def test_output_handling_is_linear_and_bounded(tmp_path, size_mb, shape):
  """Time and memory linear in the bytes, whatever the lines: a long line
  is passed on in tagged pieces of at most 64 KiB, whole characters each,
  and the client's log keeps it exactly as written."""
  from jdtensor.launcher.output import MAX_SEGMENT
  size = size_mb << 20
  out_path = tmp_path / "out.txt"
  start = time.monotonic()
  with open(out_path, "w") as out:
    proc = subprocess.run(
        [sys.executable, "-c", MEASURED_LAUNCHER, "launch", "-n", "1", "--log-dir",
         str(tmp_path / "logs"), "--", sys.executable, "-c", WRITER, str(size), shape],
        stdout=out, stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO,
        env=clean_env(PYTHONPATH=REPO, PYTHONIOENCODING="utf-8"))
  took = time.monotonic() - start
  assert proc.returncode == 0, proc.stderr
  written = (("x" * 97 + "\u20ac") if shape == "one line" else ("x" * 98 + "\n"))
  written = (written * (size // 100 + 1))[:size]
  log = (tmp_path / "logs" / "client-0.log").read_text(encoding="utf-8")
  assert log.split("\n", 1)[1].rstrip("\n") == written.rstrip("\n")
  lines = out_path.read_text(encoding="utf-8").splitlines()
  assert all(l.startswith("[client 0] ") for l in lines)
  pieces = [l[len("[client 0] "):] for l in lines]
  if shape == "one line":
    assert "".join(pieces) == written
    sizes = [len(p.encode()) for p in pieces]
    assert max(sizes) <= MAX_SEGMENT and min(sizes[:-1], default=MAX_SEGMENT) >= MAX_SEGMENT - 3
  else:
    assert pieces == written.removesuffix("\n").split("\n")
  assert took < 5 + size_mb * 0.5, took  # 32 MB in one line took 10 s quadratic.
  max_rss_mb = int(proc.stderr.split("MAXRSS_KB ")[1].split()[0]) / 1024
  assert max_rss_mb < 60, max_rss_mb  # About 22 MB: the launcher never holds the line.


INHERITED_CLIENT = os.path.join(REPO, "tests", "multiprocess", "clients", "inherited_env_client.py")
INHERITED = ("StartupError: this process (pid {pid}) inherited client {k}'s DTENSOR_* "
             "variables from process {parent}, which is client {k} of this run already; "
             "a child process (a data-loader worker, a multiprocessing 'spawn' or 'fork' "
             "child) cannot join as the same client. Call initialize_accelerator_system "
             "only in the client's own process (a worker needs no multi-client runtime), "
             "or remove DTENSOR_* from the child's environment to run it on its own.")
JAX_FIRST = ("StartupError: jax.distributed is already initialized in this process "
             "(jax.distributed.initialize ran before initialize_accelerator_system), so "
             "jdtensor cannot start the multi-client runtime DTENSOR_* describes. Call only "
             "one of them: initialize_accelerator_system() (it calls "
             "jax.distributed.initialize with DTENSOR_*'s values; jax.process_index() and "
             "multihost_utils work as before), or jax.distributed.initialize without "
             "DTENSOR_* set.")


@pytest.mark.parametrize("mode", ["jax-first", "spawn", "fork"])
def test_a_second_runtime_in_a_process_is_refused_at_once(mode):
  """jax.distributed up already, or a worker that inherited a client's
  DTENSOR_*: one clear error at once, not a port "in use" after 10 s."""
  proc = subprocess.run(
      [sys.executable, "-m", "jdtensor", "launch", "-n", "2", "--timeout", "90", "--grace",
       "5", "--", sys.executable, INHERITED_CLIENT], capture_output=True, text=True,
      timeout=120, cwd=REPO, env=clean_env(PYTHONPATH=REPO, SCENARIO=mode))
  import re
  refused = re.findall(r"^\[client (\d)\] REFUSED ([\d.]+) (.*)$", proc.stdout, re.M)
  assert len(refused) == 2, proc.stdout + proc.stderr
  for client, seconds, error in refused:
    assert float(seconds) < 1.0, refused
    if mode == "jax-first":
      assert error == JAX_FIRST
    else:
      pid, parent = re.search(r"pid (\d+)\) .* from process (\d+),", error).groups()
      assert error == INHERITED.format(pid=pid, k=client, parent=parent)
  if mode == "jax-first":
    assert proc.returncode == 3, proc.stderr
    summary = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"jdtensor launch: client \d exited with code 3: "
                        + re.escape(JAX_FIRST) + r" \(startup\.py:\d+ in "
                        r"_refuse_a_second_runtime\); stopped clients none "
                        r"\(also: client \d exited with code 3\)", summary), summary
  else:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("CHILD exit 3") == 2, proc.stdout


START_ONLY = "import jdtensor; jdtensor.initialize_accelerator_system('CPU'); print('STARTED')"
TAKEN = ("StartupError: Client 0 cannot start the coordinator for "
         "DTENSOR_JOBS[0]='localhost:{port}': 127.0.0.1:{port} is already in use by "
         "another process; stop it, or choose a free port for DTENSOR_JOBS[0] "
         "(`jdtensor launch` picks free ports). (host.py:{{line}} in _listen)")
BAD_PERIOD = ("ConfigError: JDTENSOR_HEARTBEAT_PERIOD='abc' must be a number of "
              "seconds from 0.01 to 3600. (heartbeat_env.py:{line} in _seconds)")


@pytest.mark.parametrize("cause", ["taken port", "bad variable"])
def test_a_start_up_failure_summary_gives_its_reason(cause):
  """The summary of a run that failed to start says why, as one that failed
  later does, not only "exited with code 1"."""
  import re
  import socket
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    args = ["--port", str(port)] if cause == "taken port" else []
    env = {} if cause == "taken port" else {"JDTENSOR_HEARTBEAT_PERIOD": "abc"}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "jdtensor", "launch", "-n", "2", "--timeout", "60",
         "--grace", "5", *args, "--", sys.executable, "-c", START_ONLY],
        capture_output=True, text=True, timeout=90, cwd=REPO,
        env=clean_env(PYTHONPATH=REPO, **env))
    took = time.monotonic() - start
  assert proc.returncode == 1, proc.stderr
  assert took < 30, took
  assert "STARTED" not in proc.stdout
  summary = proc.stderr.strip().splitlines()[-1]
  if cause == "taken port":
    expected = (re.escape("jdtensor launch: client 0 exited with code 1: "
                          + TAKEN.format(port=port)).replace(r"\{line\}", r"\d+")
                + re.escape("; stopped clients 1"))
  else:
    expected = (r"jdtensor launch: client (\d) exited with code 1: "
                + re.escape(BAD_PERIOD).replace(r"\{line\}", r"\d+")
                + r"; stopped clients none \(also: client (?!\1)\d exited with code 1\)")
  assert re.fullmatch(expected, summary), summary


def _family_of(host):
  import socket
  family = socket.getaddrinfo(host.strip("[]"), 0, type=socket.SOCK_STREAM)[0][0]
  return "IPv6" if family == socket.AF_INET6 else "IPv4"


def _free_port_on(host):
  import socket
  family = socket.AF_INET6 if _family_of(host) == "IPv6" else socket.AF_INET
  with socket.socket(family, socket.SOCK_STREAM) as s:
    s.bind((host.strip("[]"), 0))
    return s.getsockname()[1]


def _ipv6_loopback():
  import socket
  try:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
      s.bind(("::1", 0))
    return True
  except OSError:
    return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
@pytest.mark.parametrize("hosts", [("[::1]", "[::1]"), ("localhost", "127.0.0.1"),
                                   ("[::1]", "localhost"), ("127.0.0.1", "[::1]")])
def test_mixed_address_families_are_refused_at_start_up(hosts):
  """gloo cannot connect IPv4 to IPv6: a mix in DTENSOR_JOBS failed at the
  first collective (`ss1.ss_family == ss2.ss_family. 10 vs 2`); one family
  works, a mix is refused by client 0 at the handshake, on every client."""
  from tests.helpers import cluster_env, finish, start_clients
  jobs = [f"{h}:{_free_port_on(h)}" for h in hosts]
  start = time.monotonic()
  results = finish(start_clients("one_collective", [cluster_env(jobs, k) for k in range(2)]),
                   timeout=60)
  took = time.monotonic() - start
  families = [_family_of(h) for h in hosts]
  if families[0] == families[1]:
    for k, res in enumerate(results):
      assert res.returncode == 0, res.stderr
      assert "RESULT gathered=[0, 1]" in res.stdout, res.stdout
    return
  expected = (f"StartupError: Client 1's DTENSOR_JOBS[1]={jobs[1]!r} is an {families[1]} "
              f"address but client 0's DTENSOR_JOBS[0]={jobs[0]!r} is {families[0]}: "
              "JAX's CPU collectives (gloo) connect every client to every other at its "
              f"DTENSOR_JOBS address and cannot connect {families[1]} to {families[0]}. "
              "Give every DTENSOR_JOBS entry one address family: IPv4 (127.0.0.1, or "
              "host names that resolve to IPv4 first) or IPv6 ([::1], or names that "
              "resolve to IPv6 first).")
  assert took < 20, took  # Not the first collective's failure, nor a time-out.
  last = [res.stderr.strip().splitlines()[-1] for res in results]
  assert [res.returncode for res in results] == [1, 1], last
  assert last[0] == "jdtensor.errors." + expected, last
  assert last[1] == ("jdtensor.errors.StartupError: Client 1: start-up refused by client 0: "
                     + expected.removeprefix("StartupError: ")), last
