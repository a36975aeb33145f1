"""jdtensor's pytest plugin (registered with pytest's ``pytest11`` entry point).

* ``@pytest.mark.multi_client(num_clients=2, devices_per_client=None,
  timeout=None, device_type="CPU", env=None, fresh=False)``: the test body runs in
  `num_clients` client processes, as with `jdtensor.testing.multi_client`
  (positional arguments: num_clients, devices_per_client).
* ``--jdtensor-timeout SECONDS``: the time-out of multi-client tests that do
  not give one (default 120).
* ``--jdtensor-clusters {session,module,fresh}``: how long a warm cluster's
  clients are kept (`jdtensor.testing`): the whole session (the default),
  one test module, or not at all (every test starts its own, as
  ``fresh=True`` does for one test).

Tests made with `jdtensor.testing.multi_client` run through the same hook, so
that parametrize values are told apart from fixtures. The plugin never
imports JAX.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from typing import Any

import pytest

from jdtensor import testing

_MARKER = "multi_client"
_MARKER_HELP = (
    "multi_client(num_clients=2, devices_per_client=None, timeout=None, "
    "device_type='CPU', env=None, fresh=False): run the test body in "
    "num_clients jdtensor client processes, a warm cluster's unless fresh "
    "(see jdtensor.testing).")


def _timeout_option(raw: str) -> float:
  try:
    return testing._check_timeout("--jdtensor-timeout", float(raw))  # pylint: disable=protected-access
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"--jdtensor-timeout must be a number of seconds > 0, got {raw!r}") from None


def pytest_addoption(parser: Any) -> None:
  group = parser.getgroup("jdtensor", "jdtensor multi-client tests")
  group.addoption("--jdtensor-timeout", type=_timeout_option, default=None,
                  metavar="SECONDS",
                  help="time-out of multi-client tests that do not set one "
                       f"(default {testing.DEFAULT_TIMEOUT:g}).")
  group.addoption("--jdtensor-clusters", choices=_SCOPES, default="session",
                  help="how long multi-client tests' warm clusters are kept: "
                       "the session (default), a test module, or fresh "
                       "clients for every test.")


_SCOPES = ("session", "module", "fresh")


def pytest_configure(config: Any) -> None:
  config.addinivalue_line("markers", _MARKER_HELP)
  testing.WARM.fresh = config.getoption("jdtensor_clusters", "session") == "fresh"


def pytest_runtest_teardown(item: Any, nextitem: Any) -> None:
  """With ``--jdtensor-clusters module``: the module's clusters end with it."""
  if item.config.getoption("jdtensor_clusters", "session") != "module":
    return
  if nextitem is None or getattr(nextitem, "module", None) is not getattr(
      item, "module", None):
    _warm_clusters().retire_all()


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
  """Every warm cluster ends with the session (Ctrl-C and a failed session
  included; `atexit` is the last resort): after Ctrl-C at once, so that the
  run ends within seconds (`jdtensor.testing._warm.KILL_WAIT` at most)."""
  interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
  _warm_clusters().retire_all(kill=interrupted)


def _warm_clusters() -> Any:
  from jdtensor.testing import _warm  # pylint: disable=g-import-not-at-top
  return _warm


def _marker_options(item: Any) -> testing.MultiClientOptions | None:
  marker = item.get_closest_marker(_MARKER)
  if marker is None:
    return None
  names = ("num_clients", "devices_per_client")
  if len(marker.args) > len(names):
    raise ValueError(f"@pytest.mark.{_MARKER} takes at most 2 positional "
                     f"arguments ({', '.join(names)}), got {len(marker.args)}.")
  kwargs = dict(zip(names, marker.args))
  unknown = sorted(set(marker.kwargs) - {f.name for f in _fields()})
  if unknown:
    raise TypeError(f"@pytest.mark.{_MARKER}: unknown argument(s) "
                    f"{', '.join(unknown)}; it takes "
                    f"{', '.join(f.name for f in _fields())}.")
  overlap = sorted(set(kwargs) & set(marker.kwargs))
  if overlap:
    raise TypeError(f"@pytest.mark.{_MARKER}: {overlap[0]} given twice.")
  return testing.MultiClientOptions(**kwargs, **marker.kwargs)


def _fields() -> tuple[Any, ...]:
  return dataclasses.fields(testing.MultiClientOptions)


def _parameters(item: Any, fn: Any, bound: bool) -> dict[str, Any]:
  """The test's arguments: parametrize values only; fixtures are an error.

  Arguments with defaults are not fixtures (pytest's rule); `bound`: `fn`'s
  first argument is the test class's instance.
  """
  params = getattr(getattr(item, "callspec", None), "params", {})
  arguments = [(name, p) for name, p in inspect.signature(fn).parameters.items()
               if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
  wanted = [name for name, p in arguments[1 if bound else 0:]
            if p.default is p.empty or name in params]
  fixtures = [name for name in wanted if name not in params]
  if fixtures:
    raise TypeError(
        f"{item.name} asks for fixture(s) {', '.join(fixtures)}, but a "
        "multi-client test body runs in other processes and gets only "
        "pytest.mark.parametrize values. Create what the body needs inside "
        "it (e.g. tempfile.mkdtemp() instead of tmp_path), or pass it as a "
        "parameter.")
  return {name: item.funcargs[name] for name in wanted}


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: Any) -> bool | None:
  """Runs multi-client tests in their clients; leaves the rest to pytest."""
  obj = pyfuncitem.obj
  made = getattr(getattr(obj, "__func__", obj), "jdtensor_multi_client", None)
  problem = None
  try:
    if made is not None:
      fn, options = made
    else:
      options = _marker_options(pyfuncitem)
      if options is None:
        return None
      fn = getattr(obj, "__func__", obj)
    instance = getattr(obj, "__self__", None)
    kwargs = _parameters(pyfuncitem, fn, bound=instance is not None)
    if options.timeout is None:
      timeout = pyfuncitem.config.getoption("jdtensor_timeout")
      if timeout is not None:
        options = dataclasses.replace(options, timeout=timeout)
    args = (instance,) if instance is not None else ()
    testing._run(fn, args, kwargs, options)  # pylint: disable=protected-access
  except (testing.MultiClientTestError, TypeError, ValueError) as e:
    # A client failed, or the test, its options or its arguments are bad.
    problem = str(e)
  if problem is not None:  # Outside the except: pytest shows no chain.
    pytest.fail(problem, pytrace=False)
  return True
