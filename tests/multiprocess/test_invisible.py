"""jdtensor is invisible to JAX: standard JAX code sees what raw jax.distributed shows.

Real clusters through `jdtensor launch`, with the heartbeat beating every
20 ms on the liveness links beside standard JAX collectives.
"""

import os
import re
import signal
import sys
import time

import pytest

from jdtensor.errors import PEER_FAILURE_EXIT_CODE
from tests.helpers import (REPO, LiveClients, cluster_env, free_port,
                           launch_clients, parse_results)

pytestmark = pytest.mark.multiprocess

USER = os.path.join(REPO, "tests", "multiprocess", "clients", "jax_user_client.py")


def launch(mode, n, devices, timeout=120, **env):
  """Runs jax_user_client.py MODE on n clients; (result, stdout, stderr)."""
  res, out, err, _ = launch_clients([sys.executable, USER, mode], n, devices,
                                    timeout=timeout, **env)
  return res, out, err


def test_standard_jax_view_is_exactly_raw_jax_distributed():
  """Device counts and lists, make_mesh, create_device_mesh, pmap and
  multihost_utils: identical to raw jax.distributed, heartbeat on or off."""
  views = {}
  for name, env in (("raw", {"RAW_JAX": "1"}),
                    ("heartbeat on", {"JDTENSOR_HEARTBEAT_PERIOD": "0.02"}),
                    ("heartbeat off", {"DTENSOR_ENABLE_HEARTBEAT": "false"})):
    res, out, err = launch("view", 4, 2, **env)
    assert res.exit_code == 0, (name, res.reason, err[-3000:])
    views[name] = {c: r["view"] for c, r in parse_results(out).items()}
  raw = views["raw"]
  assert sorted(raw) == [0, 1, 2, 3]
  assert raw[0]["device_count"] == 8 and raw[0]["local_device_count"] == 2
  assert raw[0]["pmap_psum"] == [20, 20]  # Client k puts k + 1 on both devices.
  assert raw[1]["allgather"] == [[0], [1], [2], [3]]
  assert raw[3]["broadcast"] == [10]
  assert views["heartbeat on"] == raw
  assert views["heartbeat off"] == raw


@pytest.mark.parametrize("devices", [1, 2])
def test_jax_frees_its_backend_at_exit_as_without_jdtensor(devices):
  """After a clean end and JAX's own exit handler, nothing of jdtensor's
  keeps JAX's CPU client alive (its cached devices, meshes and compiled
  functions are dropped first), as with raw jax.distributed: kept, gloo's
  event loop ran on through Python's whole finalisation.

  JAX 0.10 frees it then; JAX 0.9 keeps it itself (raw JAX reads False
  there), so jdtensor's clients must read what raw JAX's read."""
  import jax  # pylint: disable=g-import-not-at-top
  freed = {}
  for name, env in (("raw", {"RAW_JAX": "1"}), ("heartbeat on", {}),
                    ("heartbeat off", {"DTENSOR_ENABLE_HEARTBEAT": "false"})):
    res, out, err = launch("backend_freed", 2, devices, **env)
    assert res.exit_code == 0, (name, res.reason, err[-3000:])
    freed[name] = {c: r["backend_freed"] for c, r in parse_results(out).items()}
    assert sorted(freed[name]) == [0, 1], (name, err[-3000:])
  assert freed["heartbeat on"] == freed["heartbeat off"] == freed["raw"], freed
  if tuple(int(v) for v in jax.__version__.split(".")[:2]) >= (0, 10):
    assert freed["raw"] == {0: True, 1: True}, freed


def test_standard_collectives_beside_a_20ms_heartbeat():
  """1,000 each of broadcast_one_to_all, process_allgather and psums over a
  jax.make_mesh mesh, over a host axis and over one device per client."""
  res, out, err = launch("stress", 3, 2, timeout=240,
                         JDTENSOR_HEARTBEAT_PERIOD="0.02", ITERS="1000")
  assert res.exit_code == 0, (res.reason, err[-3000:])
  results = parse_results(out)
  assert sorted(results) == [0, 1, 2]
  for c, r in results.items():
    assert r["stress"] == {"iters": 1000, "wrong": {
        "broadcast": 0, "allgather": 0, "psum_all": 0, "psum_host": 0,
        "psum_clients": 0}, "stopped": True, "failure": "None", "closed": True}, c
  beats = {r["beats"] for r in results.values()}
  assert len(beats) == 1 and beats.pop() > 20  # Equal counts: an agreed stop.


def test_fresh_absl_import_beside_the_heartbeat_20_runs():
  """`import absl.logging` right after initialisation, while the heartbeat
  thread logs: no client ever dies (20 runs of 2 clients)."""
  failures = []
  for run in range(20):
    res, out, err = launch("absl", 2, 1, timeout=60,
                           JDTENSOR_HEARTBEAT_PERIOD="0.01")
    results = parse_results(out)
    if res.exit_code or len(results) != 2 or any(
        r["absl"] != {"failure": "None", "ready": True} for r in results.values()):
      failures.append((run, res.reason, results, err[-1500:]))
  assert not failures, failures


def test_orbax_checkpoint_manager_beside_the_heartbeat(tmp_path):
  """orbax (a user library, not a jdtensor dependency): save with optax
  state, restore with single_host_load_and_broadcast, a 20 ms heartbeat."""
  pytest.importorskip("orbax.checkpoint")
  pytest.importorskip("optax")
  res, out, err = launch("orbax", 4, 2, timeout=240,
                         JDTENSOR_HEARTBEAT_PERIOD="0.02",
                         CKPT_DIR=str(tmp_path / "ckpt"))
  assert res.exit_code == 0, (res.reason, err[-3000:])
  results = parse_results(out)
  assert {c: r["orbax"] for c, r in results.items()} == {
      c: {"restored": True, "failure": "None"} for c in range(4)}


HIDE_SYMBOL = """
import runpy, sys
import jax._src.lib
# A jaxlib without this symbol (JAX itself does not use it here; jdtensor reads
# gloo's keys with it, to tell a staller from a client still setting up).
del jax._src.lib._jax.DistributedRuntimeClient.key_value_dir_get_bytes
sys.argv = sys.argv[2:]  # Drop this wrapper and the interpreter's path.
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_jaxlib_without_a_private_symbol_still_beats_on_the_links(tmp_path):
  """The heartbeat needs no private jaxlib symbol to beat (it beats on the
  liveness links): a jaxlib without one it reads when it can gets the same
  verdict on a SIGKILLed client."""
  wrapper = tmp_path / "hide_symbol.py"
  wrapper.write_text(HIDE_SYMBOL)
  jobs = [f"localhost:{free_port()}" for _ in range(3)]
  envs = [cluster_env(jobs, c, JDTENSOR_HEARTBEAT_PERIOD="1") for c in range(3)]
  live = LiveClients("heartbeat_victim", envs,
                     prefixes=[[sys.executable, str(wrapper)]] * 3)
  try:
    assert live.wait_for("RESULT ready", [0, 1, 2], timeout=60), live.err
    time.sleep(1.5)  # A beat or two.
    start = time.monotonic()
    os.kill(live.procs[2].pid, signal.SIGKILL)
    ended = live.wait_exit(start, timeout=20)
  finally:
    live.close()
  for c in (0, 1):
    assert live.procs[c].returncode == PEER_FAILURE_EXIT_CODE, live.err[c]
    assert ended[c] < 5, ended
    # Seen on its own link, or first reported by the other survivor.
    assert re.search(r"heartbeat: client 2 missed beat [1-9]\d* \(last seen "
                     r"[\d.]+ s ago; its process ended without saying goodbye\)"
                     r"( \(reported by client [01]\))?; stopping this client",
                     live.err[c]), live.err[c]
