"""A restart, timed: `jdtensor launch --max-restarts` after a SIGKILL says how
long the failed attempt ran and, at the end, each restart's time to recovery
(from the failure to the next attempt's first step, `jdtensor.step_done`).

On CPU the attempts share no compilation cache (JAX keys a CPU program by
its process; `jdtensor.launcher.compile_cache.CPU_REASON`), and the launcher
says so; the cache's own parts are tested in tests/unit/test_compile_cache.py.
"""

import os
import re
import sys

import pytest

from jdtensor.launcher.compile_cache import CPU_REASON
from tests.helpers import REPO, TEST_TIMEOUTS, clean_env, parse_results, run_python

pytestmark = pytest.mark.multiprocess

CLIENT = os.path.join(REPO, "tests", "multiprocess", "recovery_client.py")


def launch(*args, **env):
  """`jdtensor launch -n 4 --max-restarts 1 ARGS -- python recovery_client.py`."""
  res = run_python(f"""
      import sys
      from jdtensor.cli import main
      sys.exit(main(["launch", "-n", "4", "--max-restarts", "1", "--grace", "5",
                     "--timeout", "150", *{list(args)!r}, "--", sys.executable,
                     {CLIENT!r}]))
      """, env=clean_env(**{**TEST_TIMEOUTS, "LAYERS": "20", **env}), timeout=180)
  return res.returncode, res.stdout + res.stderr


@pytest.mark.parametrize("step_done", [True, False], ids=["step-done", "no-step-done"])
def test_a_restart_says_how_long_it_took_to_recover(step_done):
  code, text = launch(KILL="2", KILL_AT="1", STEP_DONE="1" if step_done else "0")
  assert code == 0, text
  assert text.count(f"jdtensor launch: restarts compile every program again on CPU: "
                    f"{CPU_REASON}") == 1, text
  ran = re.search(r"^jdtensor launch: restarting \(1 of 1\) after: client 2 was killed "
                  r"by SIGKILL; .*; attempt 1 ran (\d+\.\d) s$", text, re.M)
  assert ran and 0.5 < float(ran.group(1)) < 120, text
  results = parse_results(text)
  assert sorted(results) == [0, 1, 2, 3], text
  assert all(r["attempt"]["attempt"] == 1 for r in results.values()), text
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


def test_a_gpu_runs_restart_finds_node_0s_entries_on_every_node():
  """Two node launchers on (faked) GPU nodes: the attempts share each node's
  run-scoped folder; between the attempts node 0 drops the entry cut short
  and ships the whole one to node 1; both folders go at the end."""
  import subprocess
  import threading
  from jdtensor.launcher.processes import stop_process_groups
  from tests.helpers import fake_gpu_node_command, free_port
  coordinator = f"127.0.0.1:{free_port()}"
  env = clean_env(**TEST_TIMEOUTS, JDTENSOR_RUN_SECRET="recovery test secret " + "x" * 12)
  env.pop("JAX_PLATFORMS")
  env.pop("CUDA_VISIBLE_DEVICES", None)
  procs = [subprocess.Popen(
      fake_gpu_node_command(1, [
          sys.executable, "-m", "jdtensor", "launch", "--device-type", "GPU",
          "--nnodes", "2", "--node-rank", str(rank), "--coordinator", coordinator,
          "--max-restarts", "1", "--grace", "2", "--timeout", "90", "--",
          sys.executable, "-c", _GPU_CLIENT]),
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      start_new_session=True) for rank in (0, 1)]
  guard = threading.Timer(120, stop_process_groups, (procs,), {"grace": 3})
  guard.start()
  try:
    texts = [p.communicate()[0] for p in procs]
  finally:
    guard.cancel()
    stop_process_groups(procs, grace=3)
  assert [p.returncode for p in procs] == [0, 0], texts
  folders = []
  for rank, text in enumerate(texts):
    line = re.search(r"^jdtensor launch: restarts reuse compiled programs: JAX's "
                     r"compilation cache in (\S+) \(removed at the end; ", text, re.M)
    assert line, text
    folders.append(line.group(1))
    assert not os.path.exists(line.group(1)), text  # Removed at the end.
  assert folders[0] != folders[1]
  results = {**parse_results(texts[0]), **parse_results(texts[1])}
  assert sorted(results) == [0, 1], texts
  for client, folder in enumerate(folders):
    seen = results[client]["cache"]
    assert seen["folder"] == folder
    # The whole entry on both nodes, byte for byte; the cut one nowhere.
    assert seen["files"] == {"jit_step-1-cache": seen["want"]}, texts
