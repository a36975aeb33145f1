"""Start-up and failure detection, side by side with raw JAX and TF DTensor.

    python -m benchmarks.bench_startup [--repeats N] [--skip-raw-detection]

1. Cold start to first collective: wall time from launching 4 clients x 2 CPU
   devices to every client having finished one cross-client psum, for
   jdtensor (through `jdtensor launch`), a hand-written raw JAX script
   (`jax.distributed.initialize` + `Mesh` + psum), and TF DTensor when
   ``JDTENSOR_BENCH_TF_PYTHON`` names a Python where TensorFlow imports.
2. Scale: the same for 2, 4 and 8 clients x 1 device.
   Multi-node: the same 4 x 2 clients as two `jdtensor launch --nnodes 2`
   launchers (2 clients each) meeting on loopback, against one launcher.
3. Dead-client detection: SIGKILL one of 4 clients, time until the last
   survivor has exited: jdtensor (heartbeat period 1 s) vs raw JAX's defaults.
4. The other ways a client stops taking part (3 clients x 2 devices, a psum
   loop, client 1 misbehaves at step 3; tests/multiprocess/clients/failure_client.py):
   an exception, and a stall (stall time-out 3 s): time from the misbehaviour
   to the last survivor's exit.

Contenders run interleaved, round after round; figures are medians and the
ratios between contenders in the same run.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time

from benchmarks._paths import ROOT
from benchmarks._timing import machine
from jdtensor.launcher import free_ports


PY = sys.executable
TF_PY = os.environ.get("JDTENSOR_BENCH_TF_PYTHON")
CLIENT = os.path.join(ROOT, "benchmarks", "_client.py")
RAW = os.path.join(ROOT, "benchmarks", "_raw_jax_client.py")
TF = os.path.join(ROOT, "benchmarks", "_tf_client.py")


def _base_env() -> dict[str, str]:
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("DTENSOR_", "JDTENSOR_", "JAX_", "XLA_"))}
  env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
             TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
  return env


def _spawn(argv: list[str], n: int, devices: int, extra: dict[str, str] | None = None
           ) -> list[subprocess.Popen]:
  """n client processes with DTENSOR_* set (what every launcher does)."""
  jobs = ",".join(f"localhost:{p}" for p in free_ports(n))
  procs = []
  for c in range(n):
    env = _base_env()
    env.update(DTENSOR_JOBS=jobs, DTENSOR_CLIENT_ID=str(c), DTENSOR_NUM_CLIENTS=str(n),
               JAX_NUM_CPU_DEVICES=str(devices), **(extra or {}))
    procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True,
                                  start_new_session=True))
  return procs


def _reap(procs: list[subprocess.Popen], timeout: float) -> list[str]:
  outs, deadline = [], time.monotonic() + timeout
  for proc in procs:
    try:
      out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      out, _ = proc.communicate(timeout=10)
    outs.append(out or "")
  return outs


def run_clients(kind: str, n: int, devices: int, mode: str,
                env: dict[str, str] | None = None) -> list[str]:
  """Runs `mode` of the `kind` client on n clients; their outputs.

  `env` adds variables to jdtensor's clients (e.g. the heartbeat off).
  """
  if kind == "jdtensor":
    procs = [subprocess.Popen(
        [PY, "-m", "jdtensor", "launch", "-n", str(n), "--devices-per-client",
         str(devices), "--timeout", "300", "--", PY, CLIENT, mode],
        env={**_base_env(), **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, start_new_session=True)]
  elif kind == "raw JAX":
    procs = _spawn([PY, RAW, mode], n, devices)
  else:
    procs = _spawn([TF_PY, TF, mode], n, devices)
  return _reap(procs, 300)


def cold_start(kind: str, n: int, devices: int,
               env: dict[str, str] | None = None) -> float:
  """Seconds from launch until the last client finished its first psum."""
  start = time.time()
  times = [float(t) for out in run_clients(kind, n, devices, "first_collective", env)
           for t in re.findall(r"FIRST_COLLECTIVE_AT ([\d.]+)", out)]
  if len(times) != n:
    raise RuntimeError(f"{kind}: {len(times)} of {n} clients reached the psum")
  return max(times) - start


def cold_start_two_nodes() -> float:
  """`cold_start("jdtensor", 4, 2)` as two nodes of two clients on loopback."""
  coordinator = f"127.0.0.1:{free_ports(1)[0]}"
  env = {**_base_env(), "JDTENSOR_RUN_SECRET": "bench nodes secret 0123456789"}
  start = time.time()
  procs = [subprocess.Popen(
      [PY, "-m", "jdtensor", "launch", "--nnodes", "2", "--node-rank", str(r),
       "--coordinator", coordinator, "-n", "2", "--devices-per-client", "2",
       "--timeout", "300", "--", PY, CLIENT, "first_collective"],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
      start_new_session=True) for r in (0, 1)]
  times = [float(t) for out in _reap(procs, 300)
           for t in re.findall(r"FIRST_COLLECTIVE_AT ([\d.]+)", out)]
  if len(times) != 4:
    raise RuntimeError(f"two nodes: {len(times)} of 4 clients reached the psum")
  return max(times) - start


def detection(kind: str, n: int = 4) -> float:
  """Seconds from SIGKILL of the last client to the last survivor's exit."""
  if kind == "jdtensor":
    procs = _spawn([PY, CLIENT, "wait_to_be_killed"], n, 1,
                   {"JDTENSOR_HEARTBEAT_PERIOD": "1"})
  else:
    procs = _spawn([PY, RAW, "wait_to_be_killed"], n, 1)
  try:
    for proc in procs:  # Wait until every client is up (gloo may speak first).
      line = "?"
      while line and not line.startswith("READY"):
        line = proc.stdout.readline()
      if not line:
        raise RuntimeError(f"{kind}: a client ended before it was ready")
    time.sleep(1.0)
    killed = time.monotonic()
    os.kill(procs[-1].pid, signal.SIGKILL)
    for proc in procs[:-1]:
      proc.wait(timeout=600)
    return time.monotonic() - killed
  finally:
    _reap(procs, 5)


FAILURE_CLIENT = os.path.join(ROOT, "tests", "multiprocess", "clients", "failure_client.py")


def misbehaviour_detection(what: str, env: dict[str, str]) -> float:
  """Seconds from client 1's misbehaviour to the last survivor's exit."""
  import io  # pylint: disable=g-import-not-at-top

  from jdtensor import launcher  # pylint: disable=g-import-not-at-top
  out, err = io.StringIO(), io.StringIO()
  res = launcher.launch(launcher.LaunchSpec(
      command=(PY, FAILURE_CLIENT), num_clients=3, devices_per_client=2,
      timeout=120, grace=3), out=out, err=err,
      env={**_base_env(), "MISBEHAVE": what, **env})
  stamps = re.findall(r"^\[client 1\] MISBEHAVING ([\d.]+)$", out.getvalue(), re.M)
  ended = [res.ended_at[c] for c in (0, 2)]
  if not stamps or None in ended or res.first_failure != 1:
    raise RuntimeError(f"{what}: unexpected end: {res.reason}\n{err.getvalue()}")
  return max(ended) - float(stamps[0])  # type: ignore[arg-type]


def _median_row(label: str, samples: dict[str, list[float]], base: str) -> str:
  cells = [label]
  base_med = statistics.median(samples[base])
  for name, values in samples.items():
    med = statistics.median(values)
    ratio = "" if name == base else f" ({med / base_med:.2f}x)"
    cells.append(f"{min(values):.2f} / {med:.2f}{ratio}")
  return "| " + " | ".join(cells) + " |"


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--skip-raw-detection", action="store_true",
                      help="skip raw JAX's ~100 s dead-client detection")
  args = parser.parse_args(argv)
  kinds = ["raw JAX", "jdtensor"] + (["TF DTensor"] if TF_PY else [])
  lines = [f"Machine: {machine()}",
           "TF DTensor: " + (f"TensorFlow from `{TF_PY}` (a throw-away venv; "
                             "never a jdtensor dependency)" if TF_PY else
                             "skipped (set JDTENSOR_BENCH_TF_PYTHON to a Python "
                             "with tensorflow)"), ""]

  samples = {k: [] for k in kinds}
  for _ in range(args.repeats):
    for kind in kinds:
      samples[kind].append(cold_start(kind, 4, 2))
  lines += ["Cold start to first collective, 4 clients x 2 CPU devices, seconds "
            "min / median (ratio to raw JAX):", "",
            "| | " + " | ".join(kinds) + " |", "|---|" + "---:|" * len(kinds),
            _median_row("launch -> every client done one psum", samples, "raw JAX")]
  if TF_PY:
    tf_med = statistics.median(samples["TF DTensor"])
    jd_med = statistics.median(samples["jdtensor"])
    lines.append(f"\njdtensor is {tf_med / jd_med:.1f}x faster than TF DTensor "
                 "to the first collective.")

  lines += ["", "Scale of clients on one machine (1 CPU device each), seconds "
            "min / median (ratio to raw JAX):", "",
            "| clients | " + " | ".join(kinds) + " |", "|---:|" + "---:|" * len(kinds)]
  for n in (2, 4, 8):
    scale = {k: [] for k in kinds}
    for _ in range(max(2, args.repeats // 2)):
      for kind in kinds:
        scale[kind].append(cold_start(kind, n, 1))
    lines.append(_median_row(str(n), scale, "raw JAX"))

  nodes = {"one launcher, 4 clients": [], "two launchers (--nnodes 2), 2 + 2 clients": []}
  for _ in range(args.repeats):
    nodes["one launcher, 4 clients"].append(cold_start("jdtensor", 4, 2))
    nodes["two launchers (--nnodes 2), 2 + 2 clients"].append(cold_start_two_nodes())
  lines += ["", "Multi-node `jdtensor launch` on loopback, 4 clients x 2 CPU "
            "devices, launch -> every client done one psum, seconds min / median "
            "(ratio to one launcher):", "", "| | " + " | ".join(nodes) + " |",
            "|---|" + "---:|" * len(nodes),
            _median_row("cold start", nodes, "one launcher, 4 clients")]

  det = {"jdtensor": [detection("jdtensor") for _ in range(max(2, args.repeats // 2))]}
  lines += ["", "Dead-client detection: SIGKILL one of 4 clients, seconds until "
            "the last survivor has exited:", "",
            "| | runs | min | median | max |", "|---|---:|---:|---:|---:|",
            f"| jdtensor (heartbeat period 1 s) | {len(det['jdtensor'])} | "
            f"{min(det['jdtensor']):.2f} | {statistics.median(det['jdtensor']):.2f} | "
            f"{max(det['jdtensor']):.2f} |"]
  if not args.skip_raw_detection:
    raw = [detection("raw JAX")]
    lines.append(f"| raw JAX defaults (coordination heartbeat 100 s) | 1 | "
                 f"{raw[0]:.1f} | {raw[0]:.1f} | {raw[0]:.1f} |")
  rounds = max(2, args.repeats // 2)
  kinds_of_failure = {
      "an exception in client 1 (heartbeat period 1 s)":
          ("exception", {"JDTENSOR_HEARTBEAT_PERIOD": "1"}),
      "client 1 stalls (period 1 s, stall time-out 3 s; includes the 3 s)":
          ("stall", {"JDTENSOR_HEARTBEAT_PERIOD": "1", "JDTENSOR_STALL_TIMEOUT": "3"}),
  }
  lines += ["", "Other ways to stop taking part: 3 clients x 2 devices in a psum "
            "loop, client 1 misbehaves at step 3; seconds from the misbehaviour "
            "to the last survivor's exit (raw JAX: an exception leaves the others "
            "in their next psum until JAX's shutdown barrier fails, 60-300 s, "
            "then a C++ abort; a stall hangs until an outside time-out):", "",
            "| | runs | min | median | max |", "|---|---:|---:|---:|---:|"]
  for label, (what, env) in kinds_of_failure.items():
    times = [misbehaviour_detection(what, env) for _ in range(rounds)]
    lines.append(f"| {label} | {len(times)} | {min(times):.2f} | "
                 f"{statistics.median(times):.2f} | {max(times):.2f} |")
  report = "\n".join(lines)
  print(report)
  return report


if __name__ == "__main__":
  main()
