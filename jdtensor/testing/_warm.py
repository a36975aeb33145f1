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
from jdtensor.launcher.spec import Attempt, Interrupt, LaunchResult, LaunchSpec
from jdtensor.launcher.supervisor import Signals, run_attempt
from jdtensor.testing._client import END_OF_JOB, read_records

__all__ = ["Shape", "Cluster", "JobResult", "cluster_for", "retire_all"]

# Seconds a job's output may trail its records (the clients print the end
# marker right after writing them; the launcher's readers pass it on).
_OUTPUT_TRAIL = 5.0
# Seconds the test process waits for a retired cluster to end by itself
# (``stop``) before stopping it.
_STOP_WAIT = 10.0
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
  during the job (a failure, a time-out), the launcher's result."""
  records: dict[int, dict[str, Any]]
  result: LaunchResult | None
  retired: list[str]  # Why the cluster was retired after a passing job.


class Cluster:
  """One warm cluster (see the module docstring)."""

  def __init__(self, shape: Shape, env: Mapping[str, str], grace: float):
    self.shape = shape
    self.dir = tempfile.mkdtemp(prefix="jdtensor-warm-")
    self.jobs = 0
    self.out, self.err = _Switch(), _Switch()
    self.interrupt = Interrupt()
    self.result: LaunchResult | None = None
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
                                  timeout_at=lambda: self._deadline)
    except BaseException as e:  # pylint: disable=broad-except
      self.error = e

  def start(self) -> None:
    """Starts the clients, once (before a job is known: ahead of need)."""
    with self._start_lock:
      if not self._thread.ident:
        self._thread.start()

  @property
  def alive(self) -> bool:
    return not self.retired and (not self._thread.ident or self._thread.is_alive())

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
      self.retire(kill=True)  # Ctrl-C, pytest-timeout: nothing is left.
      raise
    finally:
      self.out.sink = self.err.sink = None
    self.retired = True
    records = read_records(result_dir, n)
    shutil.rmtree(self.dir, ignore_errors=True)
    if self.error is not None:
      raise self.error
    return JobResult(records, self.result, [])

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
    """No more jobs: the clients end normally (``stop``), or with `kill` at
    once; waits for them, bounded."""
    self.retired = True
    if self._thread.is_alive():
      kill = not self._write_stop() or kill
      for _ in range(2):
        if kill:
          # Twice: the launcher's stop without its grace (a second Ctrl-C).
          self.interrupt.received(signal.SIGTERM)
          self.interrupt.received(signal.SIGTERM)
        self._thread.join(_STOP_WAIT)
        if not self._thread.is_alive():
          break
        kill = True
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


def retire_all() -> None:
  """Stops every warm cluster (the end of a session, module, or process)."""
  with _lock:
    clusters = list(_clusters.values())
    _clusters.clear()
  for cluster in clusters:
    cluster.stop_soon()  # All at once; then each is waited for.
  for cluster in clusters:
    cluster.retire()


atexit.register(retire_all)
