"""Warm clusters: a multi-client test's client processes, kept for the next.

A cluster is one launch (`jdtensor.launcher`, on a thread of the test
process) of N ``python -m jdtensor.testing._client --warm DIR DEVICE_TYPE``
clients, which initialise as they start.
A test is a job: its spec and body written to ``DIR/job-<k>.pkl``; each
client runs it and writes its record to ``DIR/job-<k>/client-<c>.pkl``,
then prints `_client.END_OF_JOB` on both streams, so that the job's output
is known to be complete. The launcher keeps every guarantee of a fresh run:
a failing client ends the cluster with the others and the root cause named;
the job's time-out is the launcher's (`run_attempt`'s ``timeout_at``), with
every client's stacks.

A cluster is reused by tests of the same shape (`Shape`: clients, devices,
device type, the clients' environment) until a job fails, times out, is
interrupted, or leaves behind what its clients could not put back: then it
is retired (stopped), and new clients of its shape start at once for the
next test. At most `MAX_CLUSTERS` are kept (the one used longest ago goes).
Clusters are stopped at the end of the pytest session (or module,
``--jdtensor-clusters``), and at exit.

PURE of JAX: the test process never imports it.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any, IO

from jdtensor import launcher
from jdtensor.launcher.spec import Attempt, Interrupt, LaunchResult, LaunchSpec, NodeFailure
from jdtensor.launcher.supervisor import Signals, run_attempt
from jdtensor.testing._client import END_OF_JOB, read_records

__all__ = ["Shape", "Cluster", "JobResult", "cluster_for", "retire_all"]

# Seconds a job's output may trail its records (the clients print the end
# marker right after writing them; the launcher's readers pass it on).
_OUTPUT_TRAIL = 5.0
# Seconds the test process waits for a retired cluster to end by itself
# (``stop``) before stopping it.
_STOP_WAIT = 10.0
# Seconds a cluster stopped at once (`Cluster.kill`: Ctrl-C, an interrupted
# session) may take to end: the launcher's poll, SIGKILL, reaping each
# client, its output's end. Then the test process goes on without it: each
# client dies with the test process anyway (``PR_SET_PDEATHSIG``).
KILL_WAIT = 10.0
# Seconds between the launcher's stop signals while a cluster is killed: the
# second one cuts the launcher's grace short, but only once its stop has
# begun (a signal before that counts as the first).
_KILL_NUDGE = 0.05
# Seconds between looks at a job's records.
_POLL = 0.002
# Seconds for a cluster to end by itself once a client's body failed (the
# heartbeat ends the others within a second or two), then again, past the
# grace, once the others were told to stop.
_SETTLE = 2.0

# Variables that differ from test to test without meaning anything to the
# clients (pytest's name of the running test).
_NOT_SHAPE = frozenset({"PYTEST_CURRENT_TEST"})


@dataclasses.dataclass(frozen=True)
class Shape:
  """What makes two tests' clients interchangeable."""
  num_clients: int
  devices_per_client: int | None
  device_type: str
  env: tuple[tuple[str, str], ...]
  executable: str

  @staticmethod
  def of(num_clients: int, devices_per_client: int | None, device_type: str,
         env: Mapping[str, str]) -> Shape:
    """The shape of a test whose clients get environment `env`."""
    # The whole environment: a test that sets a variable (monkeypatch.setenv)
    # gets clients that see it, as fresh ones would.
    seen = tuple(sorted((k, v) for k, v in env.items() if k not in _NOT_SHAPE))
    return Shape(num_clients, devices_per_client, device_type, seen, sys.executable)

  def describe(self) -> str:
    devices = "" if self.devices_per_client is None else f" x {self.devices_per_client}"
    return f"{self.num_clients}{devices} {self.device_type}"


class _Switch:
  """The launcher's output stream: the lines go to the current job's sink,
  less the clients' end-of-job markers, which are counted."""

  def __init__(self) -> None:
    self.sink: IO[str] | None = None
    self.lock = threading.Lock()
    self.ends: dict[int, int] = {}  # Job -> markers seen.
    self._partial = ""

  def write(self, text: str) -> int:
    with self.lock:
      text, self._partial = self._partial + text, ""
      lines = text.split("\n")
      self._partial = lines.pop()
      kept = []
      for line in lines:
        _, _, rest = line.partition("] ")
        if rest.startswith(END_OF_JOB) and rest[len(END_OF_JOB):].isdigit():
          job = int(rest[len(END_OF_JOB):])
          self.ends[job] = self.ends.get(job, 0) + 1
        else:
          kept.append(line + "\n")
      sink = self.sink
    if kept and sink is not None:
      try:
        sink.write("".join(kept))
        sink.flush()
      except (OSError, ValueError):
        pass
    return len(text)

  def flush(self) -> None:
    pass


@dataclasses.dataclass
class JobResult:
  """One job's end: the clients' records, and, where the cluster ended
  during the job (a failure, a time-out), the launcher's result and the
  root cause it told (`cause`: the client, and `jdtensor._report.root_cause`'s
  words for it as the launcher's summary names it, e.g. ``client 2 was
  killed by SIGKILL``; its client is None for a time-out)."""
  records: dict[int, dict[str, Any]]
  result: LaunchResult | None
  retired: list[str]  # Why the cluster was retired after a passing job.
  cause: NodeFailure | None = None


class Cluster:
  """One warm cluster (see the module docstring)."""

  def __init__(self, shape: Shape, env: Mapping[str, str], grace: float):
    self.shape = shape
    self.dir = tempfile.mkdtemp(prefix="jdtensor-warm-")
    self.jobs = 0
    self.out, self.err = _Switch(), _Switch()
    self.interrupt = Interrupt()
    self.result: LaunchResult | None = None
    self.cause: NodeFailure | None = None  # The launcher's root cause.
    self.error: BaseException | None = None
    self.retired = False
    self._deadline: tuple[float, float] | None = None
    spec = LaunchSpec(
        (sys.executable, "-m", "jdtensor.testing._client", "--warm", self.dir,
         shape.device_type),
        num_clients=shape.num_clients, devices_per_client=shape.devices_per_client,
        device_type=shape.device_type, timeout=None, grace=grace)
    try:
      self._spec = launcher.startable(spec, env)
    except BaseException:
      shutil.rmtree(self.dir, ignore_errors=True)  # Nothing started: nothing left.
      raise
    self.env, self.grace = dict(env), grace
    self._start_lock = threading.Lock()
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name=f"jdtensor-warm-cluster-{shape.describe()}")

  def _run(self) -> None:
    try:
      with Signals(self.interrupt) as signals:  # No handlers off the main thread.
        self.result = run_attempt(self._spec, Attempt.local(self._spec), self.out,
                                  self.err, self.env, signals,
                                  on_failure=self._failed,
                                  timeout_at=lambda: self._deadline)
    except BaseException as e:  # pylint: disable=broad-except
      self.error = e

  def _failed(self, failure: NodeFailure) -> None:
    """The launcher's root cause, told once a client failed (as data: its
    client, and `jdtensor._report.root_cause`'s words for it)."""
    if self.cause is None:
      self.cause = failure

  def start(self) -> None:
    """Starts the clients, once (before a job is known: ahead of need)."""
    with self._start_lock:
      if not self._thread.ident:
        self._thread.start()

  @property
  def alive(self) -> bool:
    """Whether it takes jobs: not retired, and starting or running."""
    return not self.retired and (not self._thread.ident or self._thread.is_alive())

  @property
  def ended(self) -> bool:
    """Whether no client of it runs: never started, or its launch returned."""
    return not self._thread.is_alive()

  def run_job(self, header: dict[str, Any], payload: bytes, timeout: float,
              out: IO[str], err: IO[str]) -> JobResult:
    """Runs one test on the cluster (started on the first); its output goes
    to `out` and `err`. Retires the cluster where the job leaves it unfit
    for the next (see the module docstring)."""
    job = self.jobs
    self.jobs += 1
    result_dir = os.path.join(self.dir, f"job-{job}")
    os.makedirs(result_dir, exist_ok=True)  # A failed start-up made job 0's.
    path = os.path.join(self.dir, f"job-{job}.pkl")
    with open(path + ".tmp", "wb") as f:
      pickle.dump({**header, "result_dir": result_dir}, f)
      f.write(payload)
    self.out.sink, self.err.sink = out, err
    self._deadline = (time.monotonic() + timeout, timeout)
    os.replace(path + ".tmp", path)  # A client never reads half a job.
    self.start()
    n = self.shape.num_clients
    try:
      records = self._wait_for_records(result_dir, n)
      late = time.monotonic() > self._deadline[0]  # The launcher times it out.
      if not late and records is not None and all(
          r.get("status") == "ok" for r in records.values()):
        self._deadline = None
        self._wait_for_output(job, n)
        retired = [f"client {c}: {why}" for c, r in sorted(records.items())
                   for why in r.get("retire", ())]
        if retired:
          _replace(self)
          self.retire()
        return JobResult(records, None, retired)
      # The next test of this shape gets clients started now, while this
      # cluster ends: a failure costs at most one cold start, mostly hidden.
      _replace(self)
      # A client failed (its record says so) or the cluster ended: the
      # launcher's result names the root cause. A client whose body raised
      # ends by itself, and the others with it; one that left with code 0
      # (sys.exit(0)) leaves the others waiting for a job: they are stopped.
      if records is not None and not late:
        self._thread.join(_SETTLE)
        if self._thread.is_alive():
          self._write_stop()  # Those waiting for a job end normally.
          self._thread.join(self._spec.grace + _SETTLE)
        if self._thread.is_alive():
          self.interrupt.received(signal.SIGTERM)
      self._thread.join()
    except BaseException:
      self.kill()  # Ctrl-C, pytest-timeout: nothing is left.
      raise
    finally:
      self.out.sink = self.err.sink = None
    self.retired = True
    records = read_records(result_dir, n)
    shutil.rmtree(self.dir, ignore_errors=True)
    if self.error is not None:
      raise self.error
    return JobResult(records, self.result, [], self.cause)

  def _wait_for_records(self, result_dir: str, n: int) -> dict[int, dict[str, Any]] | None:
    """Every client's record of the job; as soon as one is a failure, the
    records so far; None if the cluster ended first."""
    while True:
      names = os.listdir(result_dir)
      done = [f for f in names if f.endswith(".pkl")]
      if len(done) == n:
        return read_records(result_dir, n)
      if done:
        records = read_records(result_dir, n)
        if any(r.get("status") != "ok" for r in records.values()):
          return records
      if not self._thread.is_alive():
        return None
      time.sleep(_POLL)

  def _wait_for_output(self, job: int, n: int) -> None:
    """Until every client's end-of-job marker came on both streams."""
    deadline = time.monotonic() + _OUTPUT_TRAIL
    while time.monotonic() < deadline and self._thread.is_alive():
      if self.out.ends.get(job, 0) >= n and self.err.ends.get(job, 0) >= n:
        return
      time.sleep(_POLL)

  def stop_soon(self) -> None:
    """Tells the clients to end once they wait for a job (`retire` waits)."""
    if self._thread.is_alive():
      self._write_stop()

  def _write_stop(self) -> bool:
    """Tells the clients that wait for a job to end; False if it could not."""
    try:
      with open(os.path.join(self.dir, "stop"), "w"):
        return True
    except OSError:
      return False

  def retire(self, kill: bool = False) -> None:
    """No more jobs: the clients end normally (``stop``, `_STOP_WAIT`), or
    with `kill` at once (`kill`); waits for them, bounded."""
    self.retired = True
    if kill or not self._thread.is_alive() or not self._write_stop():
      self.kill()
      return
    self.wait(time.monotonic() + _STOP_WAIT)
    self.kill()  # Still running: they are stopped now.

  def wait(self, deadline: float) -> None:
    """Until the cluster has ended, or `deadline` (monotonic)."""
    if self._thread.ident:  # A thread never started has nothing to end.
      self._thread.join(max(0.0, deadline - time.monotonic()))

  def kill(self, deadline: float | None = None) -> None:
    """Stops the clients at once (SIGTERM, then SIGKILL without the
    launcher's grace) and waits for the cluster to end, until `deadline`
    (monotonic; default `KILL_WAIT` from now)."""
    self.retired = True
    if deadline is None:
      deadline = time.monotonic() + KILL_WAIT
    # The launcher takes a second stop signal as "no grace", but only once
    # its stop has begun: it is told again until the cluster has ended.
    while self._thread.is_alive() and time.monotonic() < deadline:
      self.interrupt.received(signal.SIGTERM)
      self._thread.join(min(_KILL_NUDGE, max(0.0, deadline - time.monotonic())))
    shutil.rmtree(self.dir, ignore_errors=True)


# Warm clusters kept at once; a new shape past it retires the one used
# longest ago. Each client is a JAX process (about 170 MB on CPU), so a suite
# of many shapes must not keep them all.
MAX_CLUSTERS = 3

_clusters: collections.OrderedDict[Shape, Cluster] = collections.OrderedDict()
_lock = threading.Lock()


def cluster_for(shape: Shape, env: Mapping[str, str], grace: float) -> Cluster:
  """The warm cluster of `shape`; a new one where there is none fit."""
  with _lock:
    cluster = _clusters.get(shape)
    if cluster is None or not cluster.alive:
      cluster = _clusters[shape] = Cluster(shape, env, grace)
    _clusters.move_to_end(shape)
    old = [_clusters.popitem(last=False)[1]
           for _ in range(max(0, len(_clusters) - MAX_CLUSTERS))]
  for idle in old:
    idle.retire()
  return cluster


def _replace(cluster: Cluster) -> None:
  """A cluster that is going: a new one of its shape, started at once."""
  with _lock:
    if _clusters.get(cluster.shape) is not cluster:
      return  # Already replaced, or no longer kept.
    try:
      new = Cluster(cluster.shape, cluster.env, cluster.grace)
    except Exception:  # pylint: disable=broad-except
      del _clusters[cluster.shape]  # The next test starts one, and says why not.
      return
    _clusters[cluster.shape] = new
  new.start()


def retire_all(kill: bool = False) -> None:
  """Stops every warm cluster (the end of a session, module, or process):
  the clients end normally, or with `kill` at once (an interrupted
  session); all at once, each waited for on one shared deadline."""
  with _lock:
    clusters = list(_clusters.values())
  try:
    if not kill:
      for cluster in clusters:
        cluster.stop_soon()
      deadline = time.monotonic() + _STOP_WAIT
      for cluster in clusters:
        cluster.retired = True
        cluster.wait(deadline)
    deadline = time.monotonic() + KILL_WAIT
    for cluster in clusters:  # Those still running: all told at once.
      cluster.interrupt.received(signal.SIGTERM)
    for cluster in clusters:
      cluster.kill(deadline)
  finally:
    # Forgotten only once stopped: a Ctrl-C that cut this short leaves the
    # rest for the session's end (or exit) to stop.
    with _lock:
      for shape, cluster in list(_clusters.items()):
        if cluster in clusters and cluster.ended:
          del _clusters[shape]


atexit.register(retire_all)
