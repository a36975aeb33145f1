"""One client of a multi-client test: ``python -m jdtensor.testing._client SPEC``.

Started by `jdtensor.testing.run_in_multi_client` through the launcher (which
sets the DTENSOR_* variables). In order: import the test's module by its path
(with the parent's ``sys.path``), receive the body and its arguments,
``initialize_accelerator_system``, run the body, and write what happened to
``client-<k>.pkl`` in the run's directory: the return value, or where it
failed (import, arguments, initialize, body, result) with the exception and
its traceback. A failure is then raised again, so the client exits non-zero
and jdtensor tells the other clients at once.

``python -m jdtensor.testing._client --warm DIR DEVICE_TYPE``: one client of
a warm cluster (`jdtensor.testing._warm`). It initialises, then runs the jobs
the test process writes into DIR (``job-<k>.pkl``, in order) the same way,
one after the other, each in a checkpoint (`_Checkpoint`): what a body
changed that the next test must not see is put back, and what cannot be put
back (a thread or process it left running, a file it left open) retires the
cluster, said in the job's record. A body
that fails ends the client as above (the cluster goes with it); ``stop``
ends it normally.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
from typing import Any

from jdtensor import _env
from jdtensor.testing import _transport

__all__ = ["main"]


def _write(directory: str, client: int, record: dict[str, Any]) -> None:
  path = os.path.join(directory, f"client-{client}.pkl")
  with open(path + ".tmp", "wb") as f:
    pickle.dump(record, f)
  os.replace(path + ".tmp", path)  # The parent never reads half a record.


def read_records(directory: str, n: int) -> dict[int, dict[str, Any]]:
  """The records `_write` wrote in `directory`, by client (those there)."""
  records = {}
  for client in range(n):
    try:
      with open(os.path.join(directory, f"client-{client}.pkl"), "rb") as f:
        records[client] = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError):
      continue
  return records


def _traceback_text(error: BaseException) -> str:
  """The traceback without this module's frames."""
  tb = error.__traceback__
  while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
    tb = tb.tb_next
  return "".join(traceback.format_exception(type(error), error, tb))


def _import_test_module(name: str, file: str | None) -> None:
  """Imports the module that defines the body, by name where that finds the
  same file, else from its path."""
  if name == "__main__":
    if file is None:  # python -c, a REPL: no globals to bring back.
      sys.modules[_transport.MAIN_ALIAS] = types.ModuleType(_transport.MAIN_ALIAS)
      return
    name = _transport.MAIN_ALIAS
  elif name in sys.modules:
    return
  elif file is not None:
    try:
      found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
      found = None
    if found is not None and found.origin and os.path.exists(found.origin) and (
        os.path.samefile(found.origin, file)):
      importlib.import_module(name)
      return
  if file is None:
    importlib.import_module(name)
    return
  spec = importlib.util.spec_from_file_location(name, file)
  if spec is None or spec.loader is None:
    raise ImportError(f"cannot load {file!r} as a Python module")
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise


def _to_host(value: Any, client: int) -> Any:
  """`value` with every ``jax.Array`` made a NumPy array (the parent must not
  start JAX); one that spans other clients cannot leave this process."""
  if "jax" not in sys.modules:
    return value
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  def host(leaf: Any) -> Any:
    if not isinstance(leaf, jax.Array):
      return leaf
    if not leaf.is_fully_addressable:
      raise TypeError(
          f"client {client} returned a jax.Array of shape {leaf.shape} that "
          f"spans other clients ({leaf.sharding}); return this client's part "
          "(jdtensor.unpack(x), x.addressable_data(0)) or a value every client "
          "has (jax.experimental.multihost_utils.process_allgather(x)).")
    return np.asarray(leaf)
  return jax.tree_util.tree_map(host, value)


def _read_job(path: str) -> tuple[dict[str, Any], bytes]:
  with open(path, "rb") as f:
    header = pickle.load(f)
    return header, f.read()


def _run_job(header: dict[str, Any], payload: bytes, client: int,
             checkpoint: _Checkpoint | None = None) -> None:
  """Imports, receives, initialises (once per process), runs the body and
  writes the record; a failure is recorded, then raised again."""
  sys.path[:] = header["sys_path"] + [p for p in sys.path
                                      if p not in header["sys_path"]]
  stage = "import"
  try:
    _import_test_module(header["module"], header["file"])
    stage = "arguments"
    fn, args, kwargs = _transport.loads(payload)
    stage = "initialize"
    import jdtensor  # pylint: disable=g-import-not-at-top
    if not jdtensor.is_initialized():
      jdtensor.initialize_accelerator_system(header["device_type"])
    stage = "body"
    if checkpoint is not None:
      checkpoint.take()
    value = fn(*args, **kwargs)
    stage = "result"
    data = _transport.dumps(_to_host(value, client))
    stage = "checkpoint"
    retire = checkpoint.restore() if checkpoint is not None else []
  except BaseException as e:
    _write(header["result_dir"], client, _error_record(stage, e))
    raise
  _write(header["result_dir"], client, {"status": "ok", "value": data,
                                        "retire": retire})


def _error_record(stage: str, error: BaseException) -> dict[str, Any]:
  return {"status": "error", "stage": stage, "type": type(error).__name__,
          "message": str(error), "traceback": _traceback_text(error)}


def main(argv: list[str]) -> int:
  if argv[1] == "--warm":
    return _serve(argv[2], argv[3])
  header, payload = _read_job(argv[1])
  _run_job(header, payload, _env.client_id())
  return 0


# -- a warm cluster's client ------------------------------------------------------

# Seconds between looks for the next job: a test waits at most this long for
# its clients to see it.
JOB_POLL = 0.003
# Printed to stdout and stderr after each job (tagged by the launcher): the
# test process takes the job's output as complete once it has them all.
END_OF_JOB = "jdtensor.testing: end of job "
# Stop signals whose handler a body may change (restored after it).
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
            signal.SIGUSR2, signal.SIGALRM)
# Seconds a thread the body started has to end after it returns.
_THREAD_GRACE = 0.5


def _serve(directory: str, device_type: str) -> int:
  """Initialises, then runs the jobs written to `directory` in order until
  ``stop``. A cluster is started before its first test is known (ahead of
  need, `jdtensor.testing._warm`), so start-up comes first; its failure is
  the first job's."""
  client = _env.client_id()
  try:
    import jdtensor  # pylint: disable=g-import-not-at-top
    jdtensor.initialize_accelerator_system(device_type)
  except BaseException as e:
    first = os.path.join(directory, "job-0")
    os.makedirs(first, exist_ok=True)
    _write(first, client, _error_record("initialize", e))
    _end_of_job(0)
    raise
  checkpoint = _Checkpoint()
  job = 0
  while True:
    path = os.path.join(directory, f"job-{job}.pkl")
    while not os.path.exists(path):
      if os.path.exists(os.path.join(directory, "stop")):
        return 0
      time.sleep(JOB_POLL)
    header, payload = _read_job(path)
    try:
      _run_job(header, payload, client, checkpoint)
    finally:
      _end_of_job(job)
    job += 1


def _end_of_job(job: int) -> None:
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
      stream.write(f"{END_OF_JOB}{job}\n")
      stream.flush()
    except (OSError, ValueError):
      pass


def _open_files() -> dict[int, str]:
  """This process's descriptors that are files or directories, by number
  (sockets, pipes and devices are JAX's and the runtime's own)."""
  out = {}
  try:
    names = os.listdir("/proc/self/fd")
  except OSError:
    return out
  for name in names:
    try:
      target = os.readlink(f"/proc/self/fd/{name}")
    except OSError:
      continue
    if target.startswith("/") and not target.startswith(("/dev/", "/proc/")):
      out[int(name)] = target
  return out


def _children() -> set[int]:
  """This process's child processes still running (not zombies)."""
  out = set()
  try:
    tasks = os.listdir("/proc/self/task")
  except OSError:
    return out
  for task in tasks:
    try:
      with open(f"/proc/self/task/{task}/children") as f:
        pids = [int(p) for p in f.read().split()]
    except (OSError, ValueError):
      continue
    for pid in pids:
      try:
        with open(f"/proc/{pid}/stat") as f:
          if f.read().rsplit(")", 1)[1].split()[0] != "Z":
            out.add(pid)
      except (OSError, IndexError):
        continue
  return out


def _heartbeat_now() -> tuple[int, bool] | None:
  """Which heartbeat runs (its identity, whether it is still beating)."""
  from jdtensor import heartbeat  # pylint: disable=g-import-not-at-top
  beat = heartbeat.current()
  return None if beat is None else (id(beat), not beat.stopped.is_set())


class _Checkpoint:
  """What a test body may change in its client, taken before the body and
  put back after it (`restore`): the environment, the working directory,
  signal handlers, ``jax.config``, jdtensor's runtime records (TPU mesh
  names); and what cannot be put back, which retires the cluster: a thread
  or process the body started that is still running, a file it left open, a
  default mesh scope it left open, the accelerator system shut down, the
  heartbeat stopped or replaced."""

  def take(self) -> None:
    from jdtensor import api, runtime  # pylint: disable=g-import-not-at-top
    self.environ = dict(os.environ)
    self.cwd = os.getcwd()
    self.signals = {s: signal.getsignal(s) for s in _SIGNALS}
    self.runtime = runtime.default().test_checkpoint()
    self.mesh = api.get_default_mesh()
    self.heartbeat = _heartbeat_now()
    self.threads = set(threading.enumerate())
    self.children = _children()
    self.files = _open_files()

  def restore(self) -> list[str]:
    """Puts back what can be; returns what cannot (why the cluster must go)."""
    import jax  # pylint: disable=g-import-not-at-top
    from jdtensor import api, runtime  # pylint: disable=g-import-not-at-top
    retire: list[str] = []
    # Whatever the body dispatched finishes here, not in the next test.
    for array in jax.live_arrays():
      try:
        array.block_until_ready()
      except Exception:  # pylint: disable=broad-except
        pass  # Its error was the body's to see.
    if os.environ != self.environ:
      for name in [n for n in os.environ if n not in self.environ]:
        del os.environ[name]
      for name, value in self.environ.items():
        if os.environ.get(name) != value:
          os.environ[name] = value
    if os.getcwd() != self.cwd:
      os.chdir(self.cwd)
    for sig, handler in self.signals.items():
      if signal.getsignal(sig) is not handler and handler is not None:
        signal.signal(sig, handler)
    if not runtime.is_initialized():
      retire.append("the body shut the accelerator system down")
    else:
      retire += runtime.default().restore_test_checkpoint(self.runtime)
    if api.get_default_mesh() is not self.mesh:
      retire.append("a default_mesh scope the body entered is still open")
    if _heartbeat_now() != self.heartbeat:
      retire.append("the body stopped, started or replaced jdtensor's heartbeat")
    late = [t for t in threading.enumerate()
            if t not in self.threads and not t.name.startswith("jdtensor")]
    deadline = time.monotonic() + _THREAD_GRACE
    for thread in late:
      thread.join(max(0.0, deadline - time.monotonic()))
    late = [t for t in late if t.is_alive()]
    if late:
      retire.append("a thread the body started is still running: "
                    + ", ".join(repr(t.name) for t in late))
    children = sorted(_children() - self.children)
    if children:  # A forked worker holds what the client held.
      retire.append("a process the body started is still running: pid "
                    + ", ".join(map(str, children)))
    files = _open_files()
    if any(fd not in self.files or self.files[fd] != target
           for fd, target in files.items()):
      gc.collect()  # A file object the body dropped closes here.
      files = _open_files()
    left = sorted(target for fd, target in files.items()
                  if self.files.get(fd) != target)
    if left:
      retire.append("the body left open: " + ", ".join(left))
    return retire


if __name__ == "__main__":
  sys.exit(main(sys.argv))
