"""A restart, timed: `jdtensor launch --max-restarts` after a SIGKILL says how
long the failed attempt ran and, at the end, each restart's time to recovery
(from the failure to the next attempt's first step, `jdtensor.step_done`).

On CPU the attempts of several clients share no compilation cache (JAX
keys a CPU program by its process; `jdtensor.launcher.compile_cache.
CPU_REASON`), and the launcher says so; one client's do (its step comes from
the cache after a restart). The cache's own parts are tested in
tests/unit/test_compile_cache.py.
"""

import os
import re
import sys

import pytest

from jdtensor.launcher.compile_cache import CPU_REASON
from tests.helpers import REPO, TEST_TIMEOUTS, clean_env, parse_results, run_python

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "benchmarks", "_recovery_client.py")


def launch(*args, clients=4, **env):
  """`jdtensor launch -n CLIENTS --max-restarts 1 ARGS -- python
  recovery_client.py`."""
  res = run_python(f"""
      import sys
      from jdtensor.cli import main
      sys.exit(main(["launch", "-n", "{clients}", "--max-restarts", "1", "--grace", "5",
                     "--timeout", "150", *{list(args)!r}, "--", sys.executable,
                     {CLIENT!r}]))
      """, env=clean_env(**{**TEST_TIMEOUTS, "LAYERS": "20", "STEPS": "4", "KILL": "-1",
                            **env}), timeout=180)
  return res.returncode, res.stdout + res.stderr


@pytest.mark.parametrize("step_done", [True, False], ids=["step-done", "no-step-done"])
def test_a_restart_says_how_long_it_took_to_recover(step_done):
  code, text = launch(KILL="2", KILL_AT="2", STEP_DONE="1" if step_done else "0")
  assert code == 0, text
  assert text.count(f"jdtensor launch: restarts compile every program again on CPU: "
                    f"{CPU_REASON}") == 1, text
  ran = re.search(r"^jdtensor launch: restarting \(1 of 1\) after: client 2 was killed "
                  r"by SIGKILL; .*; attempt 1 ran (\d+\.\d) s$", text, re.M)
  assert ran and 0.5 < float(ran.group(1)) < 120, text
  results = parse_results(text)
  assert sorted(results) == [0, 1, 2, 3], text
  assert all(r["attempt"] == {"attempt": 1, "hits": []} for r in results.values()), text
  if step_done:
    line = re.search(r"^jdtensor launch: time to recovery: restart 1 after client 2's "
                     r"failure: (\d+\.\d) s \((\d+\.\d) s to start again, (\d+\.\d) s "
                     r"to the first step\)$", text, re.M)
    assert line, text
    total, start, first = map(float, line.groups())
    # The survivors know at once (the links close) and leave: no grace is
    # spent on them (the grace is 5 s).
    assert start < 3.0, text
    assert abs(total - start - first) <= 0.11 and first > 0.1, text
  else:
    assert re.search(r"^jdtensor launch: time to recovery: restart 1 after client 2's "
                     r"failure: \d+\.\d s to start again \(call jdtensor.step_done\(\) "
                     r"after each step for the time to the first step\)$", text, re.M), text


def test_a_one_client_cpu_runs_restart_loads_its_step_from_the_cache(tmp_path):
  """One client on CPU: JAX keys its programs for its one process, which
  writes them and reads them, so its attempts share the run's cache: the
  restarted client, resumed from its checkpoint, loads its step from the
  cache (JAX's cache-hit line for jit_step), and the folder is gone at the
  end."""
  code, text = launch(clients=1, KILL="0", KILL_AT="2", LAYERS="60", CKPT=str(tmp_path),
                      EVERY="2")
  assert code == 0, text
  line = re.search(r"^jdtensor launch: restarts reuse compiled programs: JAX's "
                   r"compilation cache in (\S+) \(removed at the end; ", text, re.M)
  assert line, text
  assert not os.path.exists(line.group(1))
  assert "compile every program again" not in text
  (result,) = parse_results(text).values()
  assert result["attempt"]["attempt"] == 1 and "jit_step" in result["attempt"]["hits"], text
  assert os.path.exists(tmp_path / "step-2-client-0.npy")  # It resumed at step 2.


def test_no_compile_cache_line_where_the_user_turned_it_off():
  code, text = launch("--no-compile-cache", STEPS="1")
  assert code == 0, text
  assert "compil" not in "".join(l for l in text.splitlines(True)
                                 if l.startswith("jdtensor launch:")), text
  assert "time to recovery" not in text  # No restart happened.


# A client on a (faked) GPU node, without JAX: in the first attempt, client 0
# writes two entries into the cache folder the launcher gave it, one whole
# and one cut short (as a client killed while writing leaves it), and client
# 1 then fails; in the second, each client lists its folder.
_GPU_CLIENT = r"""
import hashlib, json, os, sys, time, zlib
folder = os.environ["JAX_COMPILATION_CACHE_DIR"]
client, attempt = int(os.environ["DTENSOR_CLIENT_ID"]), int(os.environ["JDTENSOR_RESTART_COUNT"])
entry = zlib.compress(b"a compiled step " * 50_000)
if attempt == 0:
  if client == 0:
    open(os.path.join(folder, "jit_step-1-cache"), "wb").write(entry)
    open(os.path.join(folder, "jit_cut-2-cache"), "wb").write(entry[:1000])
    print("WROTE", flush=True)
    time.sleep(60)
  time.sleep(2)
  sys.exit(1)
files = {n: hashlib.sha256(open(os.path.join(folder, n), "rb").read()).hexdigest()
         for n in sorted(os.listdir(folder))}
print("RESULT cache=" + json.dumps({"folder": folder, "files": files,
      "want": hashlib.sha256(entry).hexdigest()}), flush=True)
"""


@pytest.mark.parametrize("nodes,own", [(1, False), (2, False), (1, True)],
                         ids=["one-node", "two-nodes", "users-own-folder"])
def test_a_gpu_runs_restart_finds_client_0s_entries(nodes, own, tmp_path):
  """Launchers on (faked) GPU nodes, 2 clients in all: the attempts share
  each node's run-scoped folder; between the attempts the entry cut short
  is dropped and node 0 ships the whole one to node 1; the folders go at
  the end. A folder of the user's own is used as it is and left in place."""
  import subprocess
  import threading
  from jdtensor.launcher.processes import stop_process_groups
  from tests.helpers import fake_gpu_node_command, free_port
  env = clean_env(**TEST_TIMEOUTS, JDTENSOR_RUN_SECRET="recovery test secret " + "x" * 12)
  env.pop("JAX_PLATFORMS")
  env.pop("CUDA_VISIBLE_DEVICES", None)
  if own:
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path)
  per_node = 2 // nodes
  coordinator = ["--nnodes", str(nodes), "--coordinator", f"127.0.0.1:{free_port()}"]
  procs = [subprocess.Popen(
      fake_gpu_node_command(per_node, [
          sys.executable, "-m", "jdtensor", "launch", "--device-type", "GPU",
          *(coordinator + ["--node-rank", str(rank)] if nodes > 1 else []),
          "--max-restarts", "1", "--grace", "2", "--timeout", "90", "--",
          sys.executable, "-c", _GPU_CLIENT]),
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      start_new_session=True) for rank in range(nodes)]
  guard = threading.Timer(120, stop_process_groups, (procs,), {"grace": 3})
  guard.start()
  try:
    texts = [p.communicate(timeout=150)[0] for p in procs]
  finally:
    guard.cancel()
    stop_process_groups(procs, grace=3)
  assert [p.returncode for p in procs] == [0] * nodes, texts
  folders = []
  for text in texts:
    if own:
      assert (f"jdtensor launch: restarts reuse compiled programs: JAX's compilation "
              f"cache in {tmp_path} (your JAX_COMPILATION_CACHE_DIR, left in place)"
              in text), text
      folders.append(str(tmp_path))
      continue
    line = re.search(r"^jdtensor launch: restarts reuse compiled programs: JAX's "
                     r"compilation cache in (\S+) \(removed at the end; ", text, re.M)
    assert line, text
    folders.append(line.group(1))
    assert not os.path.exists(line.group(1)), text  # Removed at the end.
  assert len(set(folders)) == nodes
  results = {}
  for text in texts:
    results.update(parse_results(text))
  assert sorted(results) == [0, 1], texts
  for client in (0, 1):
    seen = results[client]["cache"]
    assert seen["folder"] == folders[client // per_node]
    if own:  # Nothing of the user's folder is touched, the entry cut short included.
      assert sorted(seen["files"]) == ["jit_cut-2-cache", "jit_step-1-cache"], texts
      assert seen["files"]["jit_step-1-cache"] == seen["want"]
    else:  # The whole entry on every node, byte for byte; the cut one nowhere.
      assert seen["files"] == {"jit_step-1-cache": seen["want"]}, texts
  if own:
    assert sorted(os.listdir(tmp_path)) == ["jit_cut-2-cache", "jit_step-1-cache"]


# Two clients that call jdtensor.step_done() (no JAX: the launcher's words
# are under test): in the first attempt both complete a step, then client 1
# exits with code 3; in the second, client 1 exits with code 4 before its
# first step.
_EARLY_END_CLIENT = """
import os, sys, time
import jdtensor
me = int(os.environ["DTENSOR_CLIENT_ID"])
first = os.environ["JDTENSOR_RESTART_COUNT"] == "0"
if first:
  jdtensor.step_done()
time.sleep(1.0)
if me == 1:
  sys.exit(3 if first else 4)
time.sleep(60)
if not first:
  jdtensor.step_done()
"""


def test_an_attempt_stopped_before_its_first_step_is_said_so_without_advice():
  """The script calls jdtensor.step_done(), but the restarted attempt ended
  before its first step: the recovery line says that, and does not advise
  the call the script already makes."""
  res = run_python(f"""
      import sys
      from jdtensor.cli import main
      sys.exit(main(["launch", "-n", "2", "--max-restarts", "1", "--grace", "2",
                     "--timeout", "60", "--", sys.executable, "-c", {_EARLY_END_CLIENT!r}]))
      """, env=clean_env(), timeout=90)
  text = res.stdout + res.stderr
  assert res.returncode == 4, text
  line = re.search(r"^jdtensor launch: time to recovery: .*$", text, re.M)
  assert line and re.fullmatch(
      r"jdtensor launch: time to recovery: restart 1 after client 1's failure: \d+\.\d s "
      r"to start again \(attempt 2 ended before its first step\)", line.group()), text
  assert "step_done" not in text, text
