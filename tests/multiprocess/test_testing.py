"""jdtensor.testing as its users use it: pytest on a test file, in a subprocess.

multi_client_examples.py holds the tests (some fail on purpose); one pytest
run executes them all, and each test here checks one outcome and its
message from the JUnit XML report.
"""

import os
import re

import pytest

from tests.helpers import pid_alive, run_pytest

pytestmark = pytest.mark.multiprocess

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def examples():
  return run_pytest(os.path.join(HERE, "clients", "multi_client_examples.py"))


def test_a_passing_4x2_psum_test(examples):
  _, outcomes, out = examples
  assert outcomes["test_psum_4x2"][0] == "passed", out


def test_only_the_failing_client_is_named_with_its_assertion(examples):
  _, outcomes, out = examples
  outcome, message, text = outcomes["test_only_client_2_fails"]
  assert outcome == "failure", out
  lines = text.splitlines()
  assert lines[0] == "client 2: AssertionError: wrong on purpose in client 2", text
  assert lines[1] == "clients 0, 1, 3 stopped as a consequence.", text
  assert "--- client 2 ---" in lines
  # Its traceback points at the test's own line, with pytest's rewritten assert.
  assert re.search(r'File ".*multi_client_examples\.py", line \d+, in '
                   r"test_only_client_2_fails\n    assert k != 2", text)
  assert "assert 2 != 2" in text
  assert "--- client 0 ---" not in text  # Consequences are not reported as failures.
  pids = [int(p) for p in re.findall(r"^\[client \d\] FAILING-TEST-PID (\d+)$",
                                     out, re.M)]
  assert len(pids) == 4 and not any(pid_alive(p) for p in pids)


def test_a_hanging_client_times_out_naming_it_with_its_stack(examples):
  _, outcomes, out = examples
  outcome, _, text = outcomes["test_client_1_hangs"]
  assert outcome == "failure", out
  lines = text.splitlines()
  assert lines[0] == ("test_client_1_hangs: timed out after 8 s: client 1 did "
                      "not finish (client 0 had returned).")
  where = lines[lines.index("--- client 1: where it was ---") + 1:]
  assert where[0] == "Main thread (most recent call first):"
  assert re.match(r'  File ".*multi_client_examples\.py", line \d+ in '
                  r"test_client_1_hangs$", where[1]), text
  pids = [int(p) for p in re.findall(r"^\[client \d\] HANGING-TEST-PID (\d+)$",
                                     out, re.M)]
  assert len(pids) == 2 and not any(pid_alive(p) for p in pids)


def test_parametrize_values_reach_every_client(examples):
  _, outcomes, out = examples
  for case in ("test_parameters_reach_every_client[1-1]",
               "test_parameters_reach_every_client[3-3]"):
    assert outcomes[case][0] == "passed", out
  for scale in (1, 3):
    for client in (0, 1):
      assert f"[client {client}] PARAM client={client} scale={scale}" in out


def test_the_marker_form_and_a_method(examples):
  _, outcomes, out = examples
  assert outcomes["test_marker_form"][0] == "passed", out
  assert outcomes["test_method_sees_its_instance"][0] == "passed", out


def test_fixtures_are_refused_with_a_reason(examples):
  _, outcomes, _ = examples
  outcome, _, text = outcomes["test_marker_with_a_fixture"]
  assert outcome == "failure"
  assert text.strip() == (
      "test_marker_with_a_fixture asks for fixture(s) tmp_path, but a "
      "multi-client test body runs in other processes and gets only "
      "pytest.mark.parametrize values. Create what the body needs inside it "
      "(e.g. tempfile.mkdtemp() instead of tmp_path), or pass it as a parameter.")


def test_run_in_multi_client_returns_values_in_client_order(examples):
  _, outcomes, out = examples
  assert outcomes["test_run_in_multi_client_returns_each_clients_value"][0] == (
      "passed"), out


def test_the_pytest_process_never_starts_jax(examples):
  code, outcomes, out = examples
  assert outcomes["test_the_pytest_process_never_imported_jax"][0] == "passed", out
  assert code == 1  # Exactly the tests that fail on purpose failed.
  assert sorted(k for k, v in outcomes.items() if v[0] != "passed") == [
      "test_client_1_hangs", "test_marker_with_a_fixture",
      "test_only_client_2_fails"]


def test_a_module_that_fails_to_import_in_the_clients():
  code, outcomes, out = run_pytest(os.path.join(HERE, "clients", "multi_client_import_error.py"),
                                   timeout=120)
  outcome, _, text = outcomes["test_never_runs"]
  assert code == 1 and outcome == "failure", out
  lines = text.splitlines()
  first = [line for line in lines if line.startswith("client ")]
  assert first[0] in (
      f"client {c}: ModuleNotFoundError: No module named "
      "'a_module_only_the_parent_has' (while importing the test module)"
      for c in (0, 1))
  assert "the body must not run" not in out


def test_the_timeout_option_and_bad_values():
  path = os.path.join(HERE, "clients", "multi_client_examples.py")
  code, _, out = run_pytest(path, "--jdtensor-timeout=-3", timeout=60)
  assert code == 4, out  # pytest's usage error.
  assert ("--jdtensor-timeout must be a number of seconds > 0, got '-3'") in out
  code, outcomes, out = run_pytest(path, "--jdtensor-timeout=0.5", "-k",
                                   "test_marker_form", timeout=60)
  outcome, _, text = outcomes["test_marker_form"]
  assert outcome == "failure" and "timed out after 0.5 s" in text.splitlines()[0], out


@pytest.fixture(scope="module")
def leaving():
  # -vvv (less -q: -vv): pytest's one line for a failure is never cut to the
  # terminal's width.
  return run_pytest(os.path.join(HERE, "clients", "leaving_examples.py"), "-vvv",
                    timeout=600)


# How client 2 left -> the first line of the test's failure, warm or fresh.
# A verdict the heartbeat reached on client 2 (the stall) is said in the
# launcher's words (`LaunchResult.cause`).
HEADLINES = {
    "exception": re.escape("client 2: ValueError: client 2 leaves on purpose"),
    "exit": re.escape("client 2 exited with code 3."),
    "sigkill": re.escape("client 2 was killed by SIGKILL."),
    "stall": (r"client 2 exited with code 70: client 2 stalled: main thread in "
              r"leaving_examples\.py:\d+ leave <- leaving_examples\.py:\d+ body "
              r"<- leaving_examples\.py:\d+ test_(warm|fresh) for \d+ s, idle \(.*\), "
              r"while clients 0, 1 wait in a collective\."),
}


@pytest.mark.parametrize("mode", ["warm", "fresh"])
@pytest.mark.parametrize("way", ["exception", "exit", "sigkill", "stall"])
def test_the_headline_names_the_client_that_left_first(leaving, way, mode):
  """Whichever way client 2 leaves (its exception, os._exit, SIGKILL, a
  stall the heartbeat names), the failure's first line and pytest's one
  line name client 2, then the clients stopped because of it."""
  _, outcomes, out = leaving
  name = f"test_{mode}[{way}]"
  outcome, _, text = outcomes[name]
  assert outcome == "failure", out
  headline = HEADLINES.get(f"{way}-{mode}", HEADLINES.get(way))
  lines = text.splitlines()
  assert re.fullmatch(headline, lines[0]), text
  assert lines[1] == "clients 0, 1 stopped as a consequence.", text
  summary = [line for line in out.splitlines()
             if line.startswith(f"FAILED tests/multiprocess/clients/leaving_examples.py::{name} - ")]
  assert len(summary) == 1, out
  assert re.fullmatch(f".* - Failed: {headline}", summary[0]), summary[0]
