"""Real multi-client tests, as easy as a unit test.

A test body runs in N fresh processes, one per DTensor client, started the
way `jdtensor launch` starts them (and with its guarantees: a ``[client k]``
tag on every output line, the others stopped when one fails, no process left
behind, a deadline), each with ``DTENSOR_*`` set and
``initialize_accelerator_system(device_type)`` already called::

  import jax
  from jdtensor.testing import multi_client

  @multi_client(num_clients=4, devices_per_client=2)
  def test_psum():
    assert jax.device_count() == 8

The pytest plugin (installed with jdtensor) adds the same as a marker,
``@pytest.mark.multi_client(num_clients=4, devices_per_client=2)``, and a
``--jdtensor-timeout`` option. `run_in_multi_client` is the plain function,
for code ported from TF DTensor's multi-client tests; it returns each
client's return value.

The parent process never imports JAX. The body is sent to the clients by
value (its code, defaults and closure values); its module is imported in
every client by its path, so module-level helpers, imports and classes are
there as usual. Arguments and return values are pickled; a ``jax.Array``
return value comes back as a NumPy array.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from jdtensor import _env, launcher
from jdtensor._report import describe_exit
from jdtensor._ids import ids_text
from jdtensor.device_spec import DEVICE_TYPES
from jdtensor.errors import LAUNCH_TIMEOUT_EXIT_CODE, PEER_FAILURE_EXIT_CODE, ConfigError
from jdtensor.testing import _transport

__all__ = ["multi_client", "run_in_multi_client", "MultiClientTestError",
           "MultiClientOptions", "DEFAULT_TIMEOUT", "WarmClusterRetired"]

DEFAULT_TIMEOUT = 120.0
# At most this many clients: each is a full JAX process.
MAX_CLIENTS = 64
# Lines of a client's output quoted in a failure report.
_TAIL_LINES = 30

_F = TypeVar("_F", bound=Callable[..., Any])


class MultiClientTestError(AssertionError):
  """A multi-client test body failed, timed out or could not start.

  Attributes:
    failures: Client -> ``(where, exception type, message, traceback)`` for
      every client whose body (or set-up) raised by itself: not one that
      raised because another client had failed (exit code 75), unless no
      client failed by itself.
    returncodes: Each client's exit code (negative: killed by that signal).
    summary: The first line of the message.
  """

  def __init__(self, message: str, failures: dict[int, tuple[str, str, str, str]],
               returncodes: list[int | None]):
    super().__init__(message)
    self.failures = failures
    self.returncodes = returncodes
    self.summary = message.splitlines()[0] if message else ""


@dataclasses.dataclass(frozen=True)
class MultiClientOptions:
  """How a multi-client test runs (see `multi_client`).

  `timeout` None means the ``--jdtensor-timeout`` option (pytest), else
  `DEFAULT_TIMEOUT`.
  """
  num_clients: int = 2
  devices_per_client: int | None = None
  timeout: float | None = None
  device_type: str = "CPU"
  env: Mapping[str, str] | None = None
  fresh: bool = False

  def __post_init__(self) -> None:
    for name, low, high in (("num_clients", 1, MAX_CLIENTS),
                            ("devices_per_client", 1, 4096)):
      value = getattr(self, name)
      if value is None and name == "devices_per_client":
        continue
      if isinstance(value, bool) or not isinstance(value, int) or not (
          low <= value <= high):
        raise ValueError(f"multi_client: {name} must be an int in {low}..{high}, "
                         f"got {value!r}.")
    if self.timeout is not None:
      _check_timeout("timeout", self.timeout)
    if not isinstance(self.fresh, bool):
      raise ValueError(f"multi_client: fresh must be True or False, got {self.fresh!r}.")
    if not isinstance(self.device_type, str) or (
        self.device_type.upper() not in DEVICE_TYPES):
      raise ValueError(f"multi_client: device_type must be 'CPU', 'GPU' or 'TPU', "
                       f"got {self.device_type!r}.")
    if self.env is not None:
      if not isinstance(self.env, Mapping):
        raise TypeError(f"multi_client: env must be a mapping of str to str, got "
                        f"{type(self.env).__name__}.")
      bad = [k for k, v in self.env.items()
             if not isinstance(k, str) or not isinstance(v, str)]
      if bad:
        raise TypeError(f"multi_client: env must map str to str; {bad[0]!r} -> "
                        f"{self.env[bad[0]]!r} does not.")
      owned = sorted(k for k in self.env if k in _LAUNCHER_OWNED)
      if owned:
        raise ValueError(f"multi_client: env sets {', '.join(owned)}, which the "
                         "runner sets for each client; use num_clients, "
                         "devices_per_client and device_type instead.")
    if self.device_type.upper() == "CPU":
      # A count in `env` is this test's; it must agree with devices_per_client.
      try:
        _env.resolve_cpu_device_count(self.devices_per_client,
                                      "devices_per_client", self.env or {})
      except ConfigError as e:
        raise ConfigError(f"multi_client: {e}") from None


# Set per client by the launcher; a test cannot choose them.
_LAUNCHER_OWNED = frozenset({
    _env.DTENSOR_CLIENT_ID, _env.DTENSOR_NUM_CLIENTS, _env.DTENSOR_JOB_NAME,
    _env.DTENSOR_JOBS, _env.JDTENSOR_RUN_SECRET, _env.JDTENSOR_REPORT_DIR})


def _check_timeout(name: str, value: Any) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
      math.isfinite(value) and value > 0):
    raise ValueError(f"multi_client: {name} must be a number of seconds > 0, got "
                     f"{value!r}.")
  return float(value)


# A test has no checkpoint to save: its clients are stopped within seconds
# (a JAX client takes SIGTERM as a preemption notice and runs on until killed).
_TEST_GRACE = 5.0

def run_in_multi_client(fn: Callable[..., Any], num_clients: int = 2,
                        devices_per_client: int | None = None, *,
                        args: Sequence[Any] = (),
                        kwargs: Mapping[str, Any] | None = None,
                        device_type: str = "CPU",
                        timeout: float | None = None,
                        env: Mapping[str, str] | None = None,
                        fresh: bool = False) -> list[Any]:
  """Runs ``fn(*args, **kwargs)`` in `num_clients` client processes.

  Each client has ``DTENSOR_*`` set and ``initialize_accelerator_system(
  device_type)`` called (with `devices_per_client` simulated CPU devices for
  CPU), as under ``jdtensor launch``. The clients are a warm cluster's
  (started by the first run of the same shape and kept, see the module
  docstring) unless `fresh`.

  Args:
    fn: The body: a function (module-level, nested or a lambda). Its module
      is imported in every client; a script's ``if __name__ == "__main__":``
      block does not run there.
    num_clients: Number of clients (1..64).
    devices_per_client: Simulated CPU devices per client. None (the
      default): the count `env` gives JAX (``JAX_NUM_CPU_DEVICES`` or
      ``XLA_FLAGS``'s ``--xla_force_host_platform_device_count``), else this
      process's environment's, else 1. Given, it overrides this process's
      count (that one is the test process's own) and must agree with
      `env`'s (``ConfigError`` otherwise).
    args: Positional arguments for `fn` (picklable).
    kwargs: Keyword arguments for `fn` (picklable).
    device_type: ``CPU``, ``GPU`` or ``TPU``.
    timeout: Seconds for the whole run (start-up included); then every
      client still running prints its stacks and is stopped. Default
      `DEFAULT_TIMEOUT`.
    env: Extra environment variables for the clients.
    fresh: Start new client processes for this run, and end them after it
      (a test of start-up itself, of exit codes, of a killed client).

  Returns:
    Each client's return value, in client order (``jax.Array`` values as
    NumPy arrays).

  Raises:
    MultiClientTestError: A client failed (its exception, traceback and the
      clients stopped as a consequence are in the message), or the run
      timed out (naming the clients that had not finished, with their stacks).
    TypeError: `fn` or its arguments cannot be sent to the clients.
    ValueError: A bad option.
    RuntimeError: Called inside a client.
  """
  __tracebackhide__ = True  # pylint: disable=unused-variable
  options = MultiClientOptions(num_clients, devices_per_client, timeout,
                               device_type, env, fresh)
  return _run(fn, tuple(args), dict(kwargs or {}), options)


def multi_client(num_clients: int | Callable[..., Any] = 2,
                 devices_per_client: int | None = None, timeout: float | None = None,
                 device_type: str = "CPU",
                 env: Mapping[str, str] | None = None, fresh: bool = False) -> Any:
  """Runs the decorated pytest test's body in `num_clients` client processes.

  ``@multi_client`` alone uses the defaults. The test passes only if every
  client's body returns normally; otherwise the failure names each failing
  client with its exception and traceback (``client 2: AssertionError: ...``)
  and the clients stopped as a consequence. ``pytest.mark.parametrize``
  values reach every client; other fixtures are not supported (the body runs
  in other processes) and are reported as an error.

  Args:
    num_clients: Number of clients (1..64).
    devices_per_client: Simulated CPU devices per client; None (the
      default) as in `run_in_multi_client`.
    timeout: Seconds for the whole test; default ``--jdtensor-timeout``, else
      `DEFAULT_TIMEOUT` (120).
    device_type: ``CPU``, ``GPU`` or ``TPU``.
    env: Extra environment variables for the clients.
    fresh: New client processes for this test alone (see
      `run_in_multi_client`); by default a warm cluster's.
  """
  if callable(num_clients) and not isinstance(num_clients, int):
    return multi_client()(num_clients)  # Used bare: @multi_client.
  options = MultiClientOptions(num_clients, devices_per_client, timeout,
                               device_type, env, fresh)

  def decorate(fn: _F) -> _F:
    if not inspect.isfunction(fn):
      raise TypeError(f"multi_client decorates a test function, got "
                      f"{type(fn).__name__}.")

    @functools.wraps(fn)
    def test(*args: Any, **kwargs: Any) -> None:
      # Called directly (or by pytest without jdtensor's plugin): the
      # arguments are whatever the caller passed.
      __tracebackhide__ = True  # pylint: disable=unused-variable
      _run(fn, args, kwargs, options)
    test.jdtensor_multi_client = (fn, options)  # type: ignore[attr-defined]
    return test  # type: ignore[return-value]
  return decorate


# -- running ----------------------------------------------------------------------

def _in_client() -> bool:
  """Whether this process is a multi-client test's client."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  return getattr(spec, "name", None) == "jdtensor.testing._client"


def _run(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
         options: MultiClientOptions) -> list[Any]:
  __tracebackhide__ = True  # pylint: disable=unused-variable
  if _in_client():
    raise RuntimeError("run_in_multi_client was called inside a multi-client "
                       "test client; start multi-client runs from the test "
                       "process only.")
  if not callable(fn):
    raise TypeError(f"fn must be callable, got {type(fn).__name__}.")
  body = getattr(fn, "__func__", fn)  # A bound method: its function and self.
  if body is not fn:
    args = (fn.__self__, *args)  # type: ignore[union-attr]
  if not inspect.isfunction(body):
    raise TypeError(f"fn must be a Python function, got {type(fn).__name__}.")
  name = body.__qualname__
  try:
    payload = _transport.dumps((body, args, kwargs), by_value=(body,))
  except TypeError as e:
    raise TypeError(f"{name}: its arguments, defaults or closure {e}") from None
  module = sys.modules.get(body.__module__)
  file = getattr(module, "__file__", None)
  if file is not None and not os.path.isfile(file):
    file = None  # python - (``<stdin>``) or a notebook: no file to import.
  timeout = options.timeout if options.timeout is not None else DEFAULT_TIMEOUT
  header = {"module": body.__module__, "file": file,
            "sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path],
            "device_type": options.device_type.upper()}
  if not (options.fresh or WARM.fresh):
    return _run_warm(name, header, payload, options, timeout)
  workdir = tempfile.mkdtemp(prefix="jdtensor-test-")
  try:
    spec_path = os.path.join(workdir, "spec.pkl")
    with open(spec_path, "wb") as f:
      pickle.dump({**header, "result_dir": workdir}, f)
      f.write(payload)
    # With JDTENSOR_TRACE_DIR set, a failing run leaves its trace there.
    traces = _env.read_trace_dir()
    trace = os.path.join(workdir, "trace.json") if traces else None
    spec = launcher.LaunchSpec(
        (sys.executable, "-m", "jdtensor.testing._client", spec_path),
        num_clients=options.num_clients,
        devices_per_client=options.devices_per_client,
        device_type=options.device_type.upper(), timeout=timeout,
        grace=_TEST_GRACE, trace=trace)
    out, err = _Tee(sys.stdout), _Tee(sys.stderr)
    result = launcher.launch(spec, out, err, _client_env(options))
    kept = None
    if trace is not None and traces is not None and result.exit_code != 0:
      kept = _keep_trace(trace, traces, name)
    if result.exit_code == 128 + signal.SIGINT:
      raise KeyboardInterrupt
    # Not imported at the top: ``python -m jdtensor.testing._client`` imports
    # this package first, and must find the module not yet loaded.
    from jdtensor.testing import _client  # pylint: disable=g-import-not-at-top
    records = _client.read_records(workdir, options.num_clients)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  values = [records.get(c, {}).get("value") for c in range(options.num_clients)]
  if result.exit_code == 0 and all(
      records.get(c, {}).get("status") == "ok" for c in range(options.num_clients)):
    return [_transport.loads(v) for v in values]
  failure = _failure(name, options, timeout, result, records, err.lines,
                     result.cause or None)
  if kept is not None:
    failure.args = (f"{failure.args[0]}\n(trace of the failed run: {kept})",)
  raise failure


def _keep_trace(trace: str, folder: str, name: str) -> str | None:
  """Moves a failed run's trace into `folder`, named after the test; where."""
  safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
  path = os.path.join(folder, f"{safe}-{os.getpid()}-{int(time.time())}.json")
  try:
    os.makedirs(folder, exist_ok=True)
    shutil.move(trace, path)
  except OSError:
    return None
  return path


class WarmSettings:
  """Whether runs reuse warm clusters (`fresh` False, the default), set by
  the pytest plugin's ``--jdtensor-clusters``."""

  def __init__(self) -> None:
    self.fresh = False


WARM = WarmSettings()


def _run_warm(name: str, header: dict[str, Any], payload: bytes,
              options: MultiClientOptions, timeout: float) -> list[Any]:
  """`_run` on the warm cluster of the test's shape (`jdtensor.testing._warm`)."""
  __tracebackhide__ = True  # pylint: disable=unused-variable
  from jdtensor.testing import _warm  # pylint: disable=g-import-not-at-top
  env = _client_env(options)
  shape = _warm.Shape.of(options.num_clients, options.devices_per_client,
                         options.device_type.upper(), env)
  cluster = _warm.cluster_for(shape, env, _TEST_GRACE)
  out, err = _Tee(sys.stdout), _Tee(sys.stderr)
  job = cluster.run_job(header, payload, timeout, out, err)
  records = job.records
  if job.result is None:
    if job.retired:
      warnings.warn(
          f"{name}: passed, but its warm cluster ({shape.describe()}) was "
          "retired after it (the next test of this shape starts new clients): "
          + "; ".join(job.retired), WarmClusterRetired, stacklevel=2)
    return [_transport.loads(records[c]["value"]) for c in range(options.num_clients)]
  if job.result.exit_code == 128 + signal.SIGINT:
    raise KeyboardInterrupt
  cause = job.cause
  said = (cause.what if cause is not None and cause.client is not None
          and cause.client == job.result.first_failure else None)
  raise _failure(name, options, timeout, job.result, records, err.lines, said)


class WarmClusterRetired(UserWarning):
  """A passing test left its warm cluster unfit for the next test (a thread
  still running, a file left open, ...): the cluster was replaced."""


def _client_env(options: MultiClientOptions) -> dict[str, str]:
  import jdtensor  # pylint: disable=g-import-not-at-top
  env = dict(os.environ)
  if options.devices_per_client is not None or _env.read_cpu_device_count(
      options.env or {}) is not None:
    # The test's own count wins over the one this (pytest) process was given.
    env = _env.without_cpu_device_count(env)
  # The clients import jdtensor from where this process did.
  root = os.path.dirname(os.path.dirname(os.path.abspath(jdtensor.__file__)))
  env["PYTHONPATH"] = os.pathsep.join(
      [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
  env.update(options.env or {})
  return env


class _Tee:
  """Writes the clients' tagged lines through (pytest captures them) and
  keeps them for the failure report."""

  def __init__(self, stream: Any):
    self._stream = stream
    self.lines: list[str] = []

  def write(self, text: str) -> int:
    self.lines.extend(text.splitlines())
    try:
      return self._stream.write(text)
    except (OSError, ValueError):
      return len(text)

  def flush(self) -> None:
    try:
      self._stream.flush()
    except (OSError, ValueError):
      pass


# -- the failure report -----------------------------------------------------------

_STAGES = {
    "import": "while importing the test module",
    "arguments": "while receiving the test's arguments",
    "initialize": "in initialize_accelerator_system",
    "body": "",
    "result": "while sending its return value back",
    "checkpoint": "while putting back what the test changed (warm cluster)",
}


def _clients(ids: Sequence[int]) -> str:
  return (f"client {ids[0]}" if len(ids) == 1 else
          "clients " + ids_text(ids))


def _first_line(text: str) -> str:
  lines = text.strip().splitlines()
  return lines[0] if lines else ""


def _tail(lines: Sequence[str], client: int, count: int = _TAIL_LINES) -> list[str]:
  prefix = f"[client {client}] "
  mine = [line[len(prefix):] for line in lines if line.startswith(prefix)]
  return mine[-count:]


_THREAD_HEADER = re.compile(
    r"(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")


def _main_thread_stack(lines: Sequence[str], client: int) -> list[str]:
  """The test body's stack from the client's SIGUSR1 dump (faulthandler's
  format), without the runner's own frames; [] if there is none."""
  mine = _tail(lines, client, count=len(lines))
  block: list[str] = []
  for line in mine:
    if _THREAD_HEADER.match(line):
      block = [line]
    elif block and line.startswith("  File "):
      block.append(line)
    elif block:
      if any("jdtensor/testing/_client.py" in f for f in block):
        break
      block = []
  if not any("jdtensor/testing/_client.py" in f for f in block):
    return []
  return ["Main thread (most recent call first):"] + [f for f in block[1:]
                       if "jdtensor/testing/_client.py" not in f
                       and "<frozen runpy>" not in f]


def _failure(name: str, options: MultiClientOptions, timeout: float,
             result: launcher.LaunchResult, records: dict[int, dict[str, Any]],
             err_lines: list[str], cause: str | None = None) -> MultiClientTestError:
  """The failure report; its first line names the culprit.

  The culprit is the launcher's root cause (`LaunchResult.first_failure`:
  `jdtensor._report.root_cause` of the clients' exit codes and reports), said
  with its own exception where its body raised, else with `cause` (the
  launcher's words for it, as its summary names it) or how it ended.
  """
  n = options.num_clients
  codes = result.returncodes or [None] * n
  raised = {c: (r["stage"], r["type"], r["message"], r["traceback"])
            for c, r in records.items() if r.get("status") == "error"}
  culprit = result.first_failure if result.first_failure in range(n) else None
  # A client that raised but left with code 75 raised because another client
  # failed (a collective's "Connection reset by peer" once that client was
  # gone): jdtensor's exit guard blamed the other client. It is reported as
  # a consequence, unless no client failed by itself.
  failures = {c: f for c, f in raised.items()
              if codes[c] != PEER_FAILURE_EXIT_CODE or c == culprit}
  if not failures and culprit is None:
    failures = raised
  raised_after = {c: f for c, f in raised.items() if c not in failures}
  finished = [c for c in range(n) if records.get(c, {}).get("status") == "ok"]
  head: list[str] = []
  detail: list[str] = []
  if result.exit_code == LAUNCH_TIMEOUT_EXIT_CODE and not failures and culprit is None:
    late = [c for c in range(n) if c not in finished]
    head.append(f"{name}: timed out after {timeout:g} s: {_clients(late)} did not "
                "finish" + (f" ({_clients(finished)} had returned)" if finished else
                            "") + ".")
    for c in late:
      stack = _main_thread_stack(err_lines, c)
      detail += [f"--- client {c}: where it was ---"] + (
          stack or _tail(err_lines, c) or ["(no output)"])
  else:
    # The culprit first, then any other client that failed by itself.
    named = ([culprit] if culprit is not None else []) + sorted(
        c for c in failures if c != culprit)
    for c in named:
      if c in failures:
        stage, kind, message, _ = failures[c]
        where = _STAGES.get(stage, stage)
        head.append(f"client {c}: {kind}: {_first_line(message)}"
                    + (f" ({where})" if where else ""))
      else:  # It left without an exception of its own: its exit, its verdict.
        code = codes[c]
        if cause is not None:
          said = cause
        elif code is not None:
          said = f"client {c} {describe_exit(code)}"
        else:
          said = f"client {c} was named the cause by the other clients"
        head.append(f"{said}.")
        detail += [f"--- client {c}: last output ---"] + (
            _tail(err_lines, c) or ["(no output)"])
    # Stopped because of the failure: by jdtensor's heartbeat (exit code 75),
    # or by the runner, whichever came first.
    stopped_codes = (PEER_FAILURE_EXIT_CODE, -signal.SIGTERM, -signal.SIGKILL)
    consequences = [c for c in range(n) if c not in named and c not in finished
                    and named and codes[c] in stopped_codes]
    others = [c for c in range(n) if c not in named and c not in finished
              and c not in consequences]
    if consequences:
      head.append(f"{_clients(consequences)} stopped as a consequence.")
    for c in others:
      code = codes[c]
      how = "still running" if code is None else describe_exit(code)
      head.append(f"client {c} did not return: {how}.")
      detail += [f"--- client {c}: last output ---"] + (
          _tail(err_lines, c) or ["(no output)"])
    if not head:  # Every body returned, but a client exited non-zero after.
      head.append(f"{name}: every client returned, but the run failed: "
                  f"{result.reason or 'exit code ' + str(result.exit_code)}.")
    for c, (stage, kind, message, text) in sorted(failures.items()):
      detail += [f"--- client {c} ---", text.rstrip()]
    if raised_after:
      detail.append("What the clients stopped as a consequence raised:")
      detail += [f"  client {c}: {kind}: {_first_line(message)}"
                 for c, (_, kind, message, _) in sorted(raised_after.items())]
  if result.reason:
    detail.append(result.reason)
  message = "\n".join(head + [""] + detail) if detail else "\n".join(head)
  return MultiClientTestError(message, failures, list(codes))
