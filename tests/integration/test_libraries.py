"""flax, optax, orbax, Keras 3, grain and multihost_utils on jdtensor.

Every run is real: ``jdtensor launch -n 4 --devices-per-client 2`` with the
heartbeat beating every 50 ms, compared with the same script in one process
with 8 CPU devices. The libraries are never jdtensor's dependencies: this
group runs where they are installed (``pip install -e '.[integration]'``;
`.ci/run` does it in its own virtual environment) and is skipped otherwise.
"""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import REPO, TEST_TIMEOUTS, clean_env, parse_results

pytestmark = pytest.mark.integration

CLIENT = os.path.join(REPO, "tests", "integration", "library_client.py")
HEARTBEAT = {"JDTENSOR_HEARTBEAT_PERIOD": "0.05", "KERAS_BACKEND": "jax"}


def need(*modules):
  """Skips unless every module is installed (found, not imported: the
  libraries load in the clients, not in the pytest process)."""
  for module in modules:
    try:
      found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # Its parent package is missing.
      found = False
    if not found:
      pytest.skip(f"{module} is not installed (pip install -e '.[integration]')")


def launched(mode, timeout=240, **env):
  """MODE on 4 clients x 2 devices through the CLI; (returncode, results, output)."""
  proc = subprocess.run(
      [sys.executable, "-m", "jdtensor", "launch", "-n", "4", "--devices-per-client",
       "2", "--timeout", str(timeout - 20), "--", sys.executable, CLIENT, mode],
      capture_output=True, text=True, timeout=timeout, cwd=REPO,
      env=clean_env(**{**TEST_TIMEOUTS, **HEARTBEAT, **env}))
  return proc.returncode, parse_results(proc.stdout), proc.stdout + proc.stderr


def one_process(mode, **env):
  """MODE in one process with 8 CPU devices: the reference."""
  proc = subprocess.run([sys.executable, CLIENT, mode], capture_output=True,
                        text=True, timeout=180, cwd=REPO,
                        env=clean_env(JAX_NUM_CPU_DEVICES="8", **HEARTBEAT, **env))
  assert proc.returncode == 0, proc.stdout + proc.stderr
  results = parse_results("\n".join(f"[client 0] {l}" for l in proc.stdout.splitlines()))
  return results[0]


def assert_every_client(results, reference, keys, rtol=1e-5):
  assert sorted(results) == [0, 1, 2, 3], results
  for client, r in results.items():
    for key in keys:
      np.testing.assert_allclose(r[key], reference[key], rtol=rtol,
                                 err_msg=f"client {client}: {key}")


def test_flax_optax_training_matches_one_process():
  need("flax", "optax")
  code, results, output = launched("flax")
  assert code == 0, output[-4000:]
  reference = one_process("flax")
  assert_every_client(results, reference, ["losses", "checksum"])
  # The (data=4, model=2) partitioning really shards the weights.
  assert results[0]["param_shardings"] == ["P('model',)", "P()", "P(None, 'model')"]


def test_orbax_save_restore_and_preemption(tmp_path):
  """Client 2 gets SIGTERM (a pod eviction) at step 4: every client saves the
  same step through orbax and exits 0; a second launch restores it and ends
  exactly where an uninterrupted run ends."""
  need("flax", "optax", "orbax.checkpoint")
  reference = one_process("flax")
  ckpt = str(tmp_path / "ckpt")
  code, first, output = launched("orbax", CKPT_DIR=ckpt, CULPRIT="2", PREEMPT_AT="4",
                                 STEP_SECONDS="0.2")
  assert code == 0, output[-4000:]
  saved = {c: r.get("saved_on_preemption") for c, r in first.items()}
  assert sorted(saved) == [0, 1, 2, 3] and len(set(saved.values())) == 1, saved
  step = saved[0]
  assert 4 <= step < 11, saved
  assert os.listdir(ckpt) == [str(step)]
  code, second, output = launched("orbax", CKPT_DIR=ckpt)
  assert code == 0, output[-4000:]
  assert {c: r["resumed_from"] for c, r in second.items()} == dict.fromkeys(range(4), step)
  assert_every_client(second, reference, ["checksum"])
  for r in second.values():
    np.testing.assert_allclose(r["losses"], reference["losses"][step + 1:], rtol=1e-5)


@pytest.mark.parametrize("mode,sharding", [("keras-dp", "P(None, None)"),
                                           ("keras-mp", "P(None, 'model')")])
def test_keras_fit_matches_one_process(mode, sharding):
  need("keras")
  code, results, output = launched(mode)
  assert code == 0, output[-4000:]
  reference = one_process(mode)
  assert_every_client(results, reference, ["losses"])
  assert {r["kernel_sharding"] for r in results.values()} == {sharding}


def test_grain_shards_by_jax_process():
  need("grain")
  code, results, output = launched("grain")
  assert code == 0, output[-4000:]
  items = {c: r["grain"] for c, r in results.items()}
  # 41 records, 4 processes, drop_remainder: 10 each, disjoint, in order.
  assert sorted(items) == [0, 1, 2, 3]
  assert all(len(v) == 10 for v in items.values()), items
  assert sorted(sum(items.values(), [])) == sorted(set(sum(items.values(), [])))
  assert set(sum(items.values(), [])) <= set(range(41))


def test_multihost_utils_and_make_mesh_loops_have_no_wrong_result():
  code, results, output = launched("loops", ITERS="200")
  assert code == 0, output[-4000:]
  assert sorted(results) == [0, 1, 2, 3]
  for r in results.values():
    assert r["loops"]["iters"] == 200
    assert r["loops"]["wrong"] == dict.fromkeys(r["loops"]["wrong"], 0)
    assert len(r["loops"]["wrong"]) == 6
  assert not re.search(r"heartbeat: .*(missed|stall|stuck)", output), output[-3000:]


def test_the_restart_recipe_resumes_after_a_preemption(tmp_path):
  """docs/examples/restart_orbax.py (its kill and restart: tests/test_docs.py):
  client 1 gets a SIGTERM at step 12; every client saves the same step and
  the run ends with 0; the same command resumes after that step."""
  need("orbax.checkpoint")
  example = os.path.join(REPO, "docs", "examples", "restart_orbax.py")

  def launch(**env):
    proc = subprocess.run(
        [sys.executable, "-m", "jdtensor", "launch", "-n", "2", "--max-restarts", "1",
         "--timeout", "200", "--", sys.executable, example],
        capture_output=True, text=True, timeout=240, cwd=REPO,
        env=clean_env(**{**TEST_TIMEOUTS, "CHECKPOINTS": str(tmp_path), **env}))
    return proc.returncode, proc.stdout + proc.stderr
  code, text = launch(DEMO_PREEMPT_AT="12")
  assert code == 0, text[-4000:]
  saved = re.findall(r"^\[client (\d)\] preempted: saved step (\d+)$", text, re.M)
  assert sorted(c for c, _ in saved) == ["0", "1"], text[-4000:]
  step = {int(s) for _, s in saved}
  assert len(step) == 1 and 12 <= next(iter(step)) < 99, text[-4000:]
  assert "restarting" not in text  # A preemption is not a failure.
  code, text = launch()
  assert code == 0, text[-4000:]
  for client in (0, 1):
    assert f"[client {client}] resumed after step {next(iter(step))}\n" in text, text
    assert f"[client {client}] done: step 99\n" in text, text
