"""Time to recovery: from a client's SIGKILL to the next attempt's first step.

    python -m benchmarks.bench_recovery [--repeats N] [--layers 150] [--clients 3]
        [--checkpoint numpy|orbax|both]

``jdtensor launch -n 3 --max-restarts 1`` of benchmarks/_recovery_client.py:
a training loop whose step is one jit program of 150 unrolled layers with a
cross-client sum (about 5 s to compile on 2 cores, milliseconds to run), a
checkpoint every 10 steps (numpy files; and, where orbax is installed, in the
same run, interleaved, orbax's `CheckpointManager`), client 2 SIGKILLed
after step 25. Measured, run by run, from the clients' time stamps and the
launcher's lines:

* cold start: from the launch to attempt 0's first completed step;
* time to recovery: from the kill to attempt 1's first completed step (the
  launcher's own figure, `jdtensor.step_done`), and its parts: the failure
  to the next attempt's processes (detection, the survivors' exit, the
  launcher), process start and imports, jdtensor and JAX start-up, the
  checkpoint's restore, and the first step (compile and run).

On CPU the attempts cannot share a compilation cache (JAX keys a CPU
program by its process: `jdtensor.launcher.compile_cache.CPU_REASON`), so a
last part measures, in one process, what the cache saves on this step where
JAX shares it (GPU, TPU): its first call cold, and from a warm cache.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks._paths import ROOT, with_checkout

CLIENT = os.path.join(ROOT, "benchmarks", "_recovery_client.py")

_MARK = re.compile(r"^\[client (\d+)\] MARK (\w+) (\d+\.\d+)$", re.M)
_TTR = re.compile(r"time to recovery: restart 1 after client \d+'s failure: (\d+\.\d) s "
                  r"\((\d+\.\d) s to start again, (\d+\.\d) s to the first step\)")


def _env(**extra: str) -> dict[str, str]:
  env = with_checkout({k: v for k, v in os.environ.items()
                       if not k.startswith(("DTENSOR_", "JDTENSOR_", "JAX_"))})
  env.update(extra)
  return env


def one_run(clients: int, layers: int, kind: str) -> dict[str, float]:
  """One launch with a kill and a restart (checkpoints of `kind`); the
  seconds of each part."""
  ckpt = tempfile.mkdtemp(prefix="jdtensor-bench-recovery-")
  try:
    began = time.time()
    res = subprocess.run(
        [sys.executable, "-m", "jdtensor", "launch", "-n", str(clients),
         "--max-restarts", "1", "--timeout", "600", "--", sys.executable, CLIENT],
        env=_env(CKPT=ckpt, CKPT_KIND=kind, LAYERS=str(layers), KILL=str(clients - 1)),
        capture_output=True, text=True, timeout=660)
  finally:
    shutil.rmtree(ckpt, ignore_errors=True)
  text = res.stdout + res.stderr
  ttr = _TTR.search(text)
  if res.returncode != 0 or ttr is None:
    raise RuntimeError(f"the run failed (exit {res.returncode}):\n{text[-4000:]}")
  # Each client's marks, attempt by attempt (a new 'started' opens one).
  attempts: list[dict[str, dict[int, float]]] = [{}, {}]
  seen: dict[int, int] = {}
  for client, name, at in _MARK.findall(text):
    c = int(client)
    if name == "started":
      seen[c] = seen.get(c, -1) + 1
    attempts[seen[c]].setdefault(name, {})[c] = float(at)
  first, second = attempts
  killed = first["killed"][clients - 1]

  def last(marks: dict[int, float]) -> float:
    return max(marks.values())
  return {
      "cold": last(first["first_step"]) - began,
      "ttr": float(ttr.group(1)),
      "to_start": float(ttr.group(2)),
      "to_first_step": float(ttr.group(3)),
      "kill_to_processes": min(second["started"].values()) - killed,
      "imports": last(second["imported"]) - min(second["started"].values()),
      "startup": last(second["initialized"]) - last(second["imported"]),
      "restore": last(second["restored"]) - last(second["initialized"]),
      "first_step": last(second["first_step"]) - last(second["restored"]),
      "cold_first_step": last(first["first_step"]) - last(first["restored"]),
  }


_CACHE_PROBE = r"""
import os, sys, time
import jax, jax.numpy as jnp
LAYERS = int(sys.argv[1])
@jax.jit
def step(w, x):
  for i in range(LAYERS):
    x = jnp.tanh(x @ w + i / LAYERS)
  return w - 1e-3 * jnp.mean(x), jnp.sum(x)
w, x = jnp.eye(32), jnp.ones((4, 32))
began = time.monotonic()
float(step(w, x)[1])
print(f"{time.monotonic() - began:.3f}")
"""


def cache_probe(layers: int) -> tuple[float, float]:
  """One process: the step's first call with an empty cache, then from it."""
  folder = tempfile.mkdtemp(prefix="jdtensor-bench-cache-")
  try:
    env = _env(JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=folder,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.1")
    times = [float(subprocess.run([sys.executable, "-c", _CACHE_PROBE, str(layers)],
                                  env=env, capture_output=True, text=True, check=True,
                                  timeout=300).stdout.split()[-1]) for _ in range(2)]
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  return times[0], times[1]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--layers", type=int, default=150)
  parser.add_argument("--clients", type=int, default=3)
  parser.add_argument("--checkpoint", choices=["numpy", "orbax", "both"], default=None,
                      help="default: both where orbax is installed, else numpy")
  args = parser.parse_args()
  kinds = {"numpy": ["numpy"], "orbax": ["orbax"], "both": ["numpy", "orbax"]}[
      args.checkpoint or ("both" if importlib.util.find_spec("orbax") else "numpy")]
  runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
  for r in range(args.repeats):
    for kind in kinds:
      runs[kind].append(one_run(args.clients, args.layers, kind))
      print(f"run {r + 1} ({kind}): " + ", ".join(
          f"{k} {v:.2f}" for k, v in runs[kind][-1].items()), flush=True)
  med = {kind: {k: statistics.median(run[k] for run in rs) for k in rs[0]}
         for kind, rs in runs.items()}
  cold_call, cached_call = cache_probe(args.layers)
  print()
  print(f"| {args.clients} clients x 1 CPU device, {args.layers} layers, median of "
        f"{args.repeats} | " + " | ".join(f"{kind} checkpoints, s" for kind in kinds) + " |")
  print("|---|" + "---:|" * len(kinds))
  rows = [
      ("cold start: launch to attempt 0's first step", "cold"),
      ("time to recovery: kill to attempt 1's first step (launcher's line)", "ttr"),
      ("- kill to the next attempt's processes (detection, survivors' exit)",
       "kill_to_processes"),
      ("- process start and imports", "imports"),
      ("- jdtensor and JAX start-up", "startup"),
      ("- restore the checkpoint", "restore"),
      ("- first step: compile and run", "first_step"),
      ("attempt 0's first step, for comparison", "cold_first_step")]
  for label, key in rows:
    print(f"| {label} | " + " | ".join(f"{med[kind][key]:.2f}" for kind in kinds) + " |")
  print("| time to recovery / cold start | " + " | ".join(
      f"{med[kind]['ttr'] / med[kind]['cold']:.2f}" for kind in kinds) + " |")
  print(f"\nOne process, the step's first call: cold {cold_call:.2f} s, from JAX's "
        f"cache {cached_call:.2f} s.")


if __name__ == "__main__":
  main()
