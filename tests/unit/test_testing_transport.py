"""jdtensor.testing's pure parts: functions by value, option checks."""

import math
import re
import threading

import pytest

from jdtensor.testing import MultiClientOptions, _transport, multi_client


def module_level(x):
  return x + 1


def test_module_level_functions_travel_by_reference_unless_asked():
  assert _transport.loads(_transport.dumps(module_level)) is module_level
  copy = _transport.loads(_transport.dumps(module_level, by_value=(module_level,)))
  assert copy is not module_level and copy(1) == 2
  assert copy.__qualname__ == "module_level" and copy.__globals__ is globals()


def test_nested_functions_and_lambdas_keep_closures_defaults_and_modules():
  offset = 10

  def helper(y, *, scale=3):
    return y * scale + offset

  def body(x, extra=5):
    return helper(x) + extra + int(math.sqrt(16))
  copy = _transport.loads(_transport.dumps(body))
  assert copy(2) == body(2) == 25
  assert copy.__defaults__ == (5,) and copy.__name__ == "body"
  closes_over_a_module = (lambda m: lambda: m.pi)(math)
  assert _transport.loads(_transport.dumps(closes_over_a_module))() == math.pi


def test_a_cell_not_yet_assigned_stays_empty():
  def outer():
    def inner():
      return later  # noqa: F821  # Assigned after inner is made.
    copy = _transport.loads(_transport.dumps(inner))
    later = 1  # pylint: disable=unused-variable
    return copy
  with pytest.raises(NameError):
    outer()()


def test_what_cannot_travel_says_why():
  lock = threading.Lock()
  with pytest.raises(TypeError, match=r"^cannot be sent to the clients \(pickle: "):
    _transport.dumps(lambda: lock)

  def recursive(n):
    return 1 if n == 0 else recursive(n - 1)
  with pytest.raises(TypeError) as e:
    _transport.dumps(recursive)
  assert str(e.value) == ("a nested function that refers to itself (or a cycle of "
                          "them) cannot be sent to the clients; define it at "
                          "module level.")


@pytest.mark.parametrize("kwargs,message", [
    ({"num_clients": 0}, "multi_client: num_clients must be an int in 1..64, got 0."),
    ({"num_clients": True}, "multi_client: num_clients must be an int in 1..64, "
                            "got True."),
    ({"devices_per_client": 2.0}, "multi_client: devices_per_client must be an int "
                                  "in 1..4096, got 2.0."),
    ({"timeout": -1}, "multi_client: timeout must be a number of seconds > 0, got -1."),
    ({"timeout": float("nan")}, "multi_client: timeout must be a number of seconds "
                                "> 0, got nan."),
    ({"device_type": "XPU"}, "multi_client: device_type must be 'CPU', 'GPU' or "
                             "'TPU', got 'XPU'."),
    ({"env": {"DTENSOR_JOBS": "x:1"}}, "multi_client: env sets DTENSOR_JOBS, which "
                                       "the runner sets for each client; use "
                                       "num_clients, devices_per_client and "
                                       "device_type instead."),
    ({"devices_per_client": 2, "env": {"XLA_FLAGS":
                                       "--xla_force_host_platform_device_count=4"}},
     "multi_client: devices_per_client=2 conflicts with XLA_FLAGS="
     "'--xla_force_host_platform_device_count=4' in the environment, which gives "
     "JAX 4 CPU device(s) per process; give the count once: drop "
     "devices_per_client to use the environment's 4, or remove the device count "
     "from the environment."),
])
def test_bad_options_are_refused_when_the_test_is_defined(kwargs, message):
  with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
    MultiClientOptions(**kwargs)
  with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
    multi_client(**kwargs)


def test_env_must_map_strings_to_strings():
  with pytest.raises(TypeError, match=re.escape("'N' -> 3 does not")):
    MultiClientOptions(env={"N": 3})


def test_the_decorator_keeps_the_signature_pytest_reads():
  @multi_client(num_clients=3)
  def test_x(a, b=2):
    del a, b
  import inspect  # pylint: disable=g-import-not-at-top
  assert list(inspect.signature(test_x).parameters) == ["a", "b"]
  fn, options = test_x.jdtensor_multi_client
  assert fn.__name__ == "test_x" and options.num_clients == 3
  bare = multi_client(module_level)
  assert bare.jdtensor_multi_client[1] == MultiClientOptions()


def _record(kind, message):
  return {"status": "error", "stage": "body", "type": kind, "message": message,
          "traceback": f"Traceback (most recent call last):\n{kind}: {message}\n"}


_GLOO = "UNKNOWN: Gloo AllGather failed: Read error: Connection reset by peer"


@pytest.mark.parametrize("codes,raised,head,failures", [
    # Client 2 asserts; the others are stopped waiting (no exception).
    ([75, 75, 1, 75], {2: "AssertionError"},
     ["client 2: AssertionError: boom", "clients 0, 1, 3 stopped as a consequence."],
     [2]),
    # Client 2 asserts after a collective: client 0's next collective raises
    # "Connection reset by peer", and its exit guard blames client 2 (code 75).
    ([75, 75, 1, 75], {2: "AssertionError", 0: "ValueError"},
     ["client 2: AssertionError: boom", "clients 0, 1, 3 stopped as a consequence."],
     [2]),
    # Stopped by the runner (heartbeat off), one of them after raising: only
    # the heartbeat's code 75 blames another client, so its error is its own.
    ([-15, -9, 1], {2: "AssertionError", 0: "KeyError"},
     ["client 0: KeyError: boom", "client 2: AssertionError: boom",
      "client 1 stopped as a consequence."], [0, 2]),
    # Two clients fail by themselves: both are named.
    ([1, 75, 1], {0: "KeyError", 2: "AssertionError"},
     ["client 0: KeyError: boom", "client 2: AssertionError: boom",
      "client 1 stopped as a consequence."], [0, 2]),
    # Nobody failed by itself (every raiser left with 75): nothing is hidden.
    ([75, 75], {0: "ValueError", 1: "ValueError"},
     [f"client 0: ValueError: {_GLOO}", f"client 1: ValueError: {_GLOO}"], [0, 1]),
])
def test_the_report_names_the_clients_that_failed_by_themselves(codes, raised, head,
                                                                failures):
  from jdtensor import launcher, testing
  records = {c: _record(kind, _GLOO if kind == "ValueError" else "boom")
             for c, kind in raised.items()}
  result = launcher.LaunchResult(returncodes=codes, exit_code=1,
                                 reason="jdtensor launch: the summary")
  error = testing._failure("test_x", MultiClientOptions(num_clients=len(codes)),
                           60.0, result, records, [])
  text = str(error)
  lines = text.splitlines()
  assert lines[:len(head)] == head and lines[len(head)] == "", text
  assert sorted(error.failures) == failures
  for c in failures:
    assert f"--- client {c} ---" in lines, text
  after = sorted(set(raised) - set(failures))
  if after:
    # What a consequence raised is kept, one line each, not as a failure.
    i = lines.index("What the clients stopped as a consequence raised:")
    assert lines[i + 1:i + 1 + len(after)] == [
        f"  client {c}: ValueError: {_GLOO}" for c in after], text
    assert all(f"--- client {c} ---" not in lines for c in after), text
  else:
    assert "What the clients stopped as a consequence raised:" not in text
  assert lines[-1] == "jdtensor launch: the summary"
