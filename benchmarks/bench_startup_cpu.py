"""Where a client's start-up CPU goes, phase by phase, jdtensor vs raw JAX.

    python -m benchmarks.bench_startup_cpu [--repeats N] [--shapes 4x2,8x1,16x1]

Each contender starts N clients by hand (no launcher: the same for all), each
doing the same work (`_phases_client.py`: imports, initialisation, a mesh and
one cross-client psum, then a normal exit). Per client: CPU time (user +
system, every thread) at each phase's end, read by the client, and the whole
process's CPU from the kernel (the exit path is the difference), with how
often its threads blocked in the exit (voluntary context switches). Contenders:
raw JAX, jdtensor with its heartbeat (the default), jdtensor without it
(``DTENSOR_ENABLE_HEARTBEAT=false``: the heartbeat's share), and jdtensor with
its bytecode cached. Where ``PYTHONDONTWRITEBYTECODE`` is set (as on this
machine) and jdtensor is an editable install, every client compiles
jdtensor's sources again, while JAX's modules load from the ``.pyc`` files
its wheel installed: the last contender runs as an installed wheel would (a
``PYTHONPYCACHEPREFIX`` warmed once). Rounds are interleaved; figures are
medians over rounds of the mean per client.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks._paths import ROOT

CLIENT = os.path.join(ROOT, "benchmarks", "_phases_client.py")
PHASES = ("imports", "init", "first", "exit")
# A bytecode cache as an installed wheel has, filled by `main`'s warm-up run;
# one fixed directory reused across runs (Python revalidates each entry
# against its source), so importing this module creates nothing.
_PYCACHE = os.path.join(tempfile.gettempdir(), "jdtensor-bench-pyc")
_CACHED = {"PYTHONPYCACHEPREFIX": _PYCACHE, "PYTHONDONTWRITEBYTECODE": ""}
CONTENDERS = {"raw JAX": ("raw", {}), "jdtensor": ("jdtensor", {}),
              "jdtensor, heartbeat off": ("jdtensor", {"DTENSOR_ENABLE_HEARTBEAT": "false"}),
              "jdtensor, bytecode cached": ("jdtensor", _CACHED)}


def free_ports(n: int) -> list[int]:
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


def client_env(jobs: str, client: int, devices: int, extra: dict[str, str]
               ) -> dict[str, str]:
  """The environment of client `client` of `jobs` (``DTENSOR_JOBS``), with
  `extra` on top: the same for every contender."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("DTENSOR_", "JDTENSOR_"))}
  env.pop("XLA_FLAGS", None)
  env.update({"DTENSOR_JOBS": jobs, "DTENSOR_CLIENT_ID": str(client),
              "JAX_NUM_CPU_DEVICES": str(devices), "JAX_PLATFORMS": "cpu",
              "JDTENSOR_RUN_SECRET": "bench-startup-cpu-" + jobs[-12:] + "x" * 8,
              "PYTHONPATH": ROOT, **extra})
  if env.get("PYTHONDONTWRITEBYTECODE") == "":
    del env["PYTHONDONTWRITEBYTECODE"]  # Python reads any value as "set".
  return env


def start_clients(mode: str, clients: int, devices: int, extra: dict[str, str],
                  prefix: tuple[str, ...] = (), stderrs: list[Any] | None = None
                  ) -> list[subprocess.Popen]:
  """Starts `clients` of `CLIENT` in `mode` (under `prefix`, a wrapper such as
  valgrind), stdout piped, stderr to `stderrs[c]` or discarded."""
  jobs = ",".join(f"localhost:{p}" for p in free_ports(clients))
  return [subprocess.Popen([*prefix, sys.executable, CLIENT, mode],
                           env=client_env(jobs, c, devices, extra), stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL if stderrs is None else stderrs[c],
                           text=True)
          for c in range(clients)]


def communicate_all(procs: list[subprocess.Popen], timeout: float) -> list[str]:
  """Each process's stdout once it ends, all within `timeout` seconds; the
  ones still running are killed if they overrun it or the caller is
  interrupted.

  Raises:
    subprocess.TimeoutExpired: They did not all end in time.
  """
  deadline = time.monotonic() + timeout
  try:
    return [proc.communicate(timeout=max(deadline - time.monotonic(), 0.01))[0]
            for proc in procs]
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def one_run(mode: str, extra: dict[str, str], clients: int, devices: int,
            timeout: float = 300.0) -> list[dict[str, float]]:
  """Per client: CPU seconds spent in each phase, and in all."""
  procs = start_clients(mode, clients, devices, extra)
  out = list(zip(procs, communicate_all(procs, timeout)))
  rows = []
  for proc, text in out:
    marks = {line.split()[1]: float(line.split()[2]) for line in text.splitlines()
             if line.startswith("PHASE ")}
    if proc.returncode != 0 or set(marks) != {"imports", "init", "first"}:
      raise RuntimeError(f"{mode}: client ended with {proc.returncode}: {text[-500:]}")
    # jdtensor's own threads (named jdtensor-*), whatever their phase, and
    # the start-up's steps (`_phases_client.STEPS`), by name.
    threads = {line.split()[1]: float(line.split()[2]) for line in text.splitlines()
               if line.startswith("THREAD jdtensor-")}
    marks["threads"] = sum(threads.values())
    for line in text.splitlines():  # RUSAGE phase voluntary involuntary faults
      if line.startswith("RUSAGE first "):
        marks["switches first"] = float(line.split()[2])
    for name, cpu in threads.items():
      marks["thread " + name] = cpu
    for line in text.splitlines():
      if line.startswith("STEP "):
        name, _, cpus = line[len("STEP "):].rpartition(": ")
        main_cpu, process_cpu = (float(v) for v in cpus.split())
        marks["step " + name] = process_cpu
        marks["step main " + name] = main_cpu
    rows.append(marks)
  return rows


def whole_cpu_runs(mode: str, extra: dict[str, str], clients: int, devices: int
                   ) -> list[dict[str, float]]:
  """`one_run`, with each client's whole CPU time taken from the kernel."""
  before, before_usage = os.times(), resource.getrusage(resource.RUSAGE_CHILDREN)
  rows = one_run(mode, extra, clients, devices)
  after, after_usage = os.times(), resource.getrusage(resource.RUSAGE_CHILDREN)
  # The children's CPU in all (every client, and the exit paths after the marks).
  total = (after.children_user - before.children_user
           + after.children_system - before.children_system)
  per_client_exit = (total - sum(r["first"] for r in rows)) / clients
  # How often the clients' threads blocked after the psum, Python's
  # finalisation included: a thread that polls while the process ends (gloo's
  # event loop wakes every 10 ms while JAX's CPU backend lives) shows here.
  exit_switches = (after_usage.ru_nvcsw - before_usage.ru_nvcsw
                   - sum(r["switches first"] for r in rows)) / clients
  phases = []
  for r in rows:
    phases.append({"imports": r["imports"], "init": r["init"] - r["imports"],
                   "first": r["first"] - r["init"], "exit": per_client_exit,
                   "exit switches": exit_switches,
                   **{k: v for k, v in r.items() if k.startswith(("thread", "step"))}})
  return phases


_IMPORT_PROBE = """
import time, jax, numpy
start = time.process_time()
import jdtensor
from jdtensor import accelerator, mesh_util
from jdtensor.runtime import jax_private
print(time.process_time() - start)
"""


def jdtensor_import_cpu(repeats: int, cached: bool = False) -> float:
  """CPU seconds a fresh process spends importing the jdtensor modules that
  `initialize_accelerator_system` pulls in, once jax is imported (median);
  `cached`: from the bytecode cache."""
  env = {**os.environ, "PYTHONPATH": ROOT, **(_CACHED if cached else {})}
  if cached:
    del env["PYTHONDONTWRITEBYTECODE"]
  times = [float(subprocess.run([sys.executable, "-c", _IMPORT_PROBE], env=env,
                                capture_output=True, text=True, check=True,
                                timeout=120).stdout) for _ in range(repeats)]
  return statistics.median(times)


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--shapes", default="4x2,8x1,16x1")
  args = parser.parse_args(argv)
  shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
  results: dict[tuple[str, tuple[int, int]], list[dict[str, float]]] = {}
  # Fills the bytecode cache with every module a client imports (jax's too:
  # the prefix is where Python looks for all of them).
  whole_cpu_runs("jdtensor", _CACHED, 2, 1)
  jdtensor_import_cpu(1, cached=True)
  for _ in range(args.repeats):
    for shape in shapes:
      for name, (mode, extra) in CONTENDERS.items():
        runs = whole_cpu_runs(mode, extra, *shape)
        # A step or thread some clients lack (client 0 waits for no service)
        # counts as 0 s for them.
        keys = {k for r in runs for k in r}
        mean = {p: statistics.mean(r.get(p, 0.0) for r in runs) for p in keys}
        results.setdefault((name, shape), []).append(mean)
  lines = [f"Machine: {os.uname().machine}, {os.cpu_count()} cores, Python "
           f"{sys.version.split()[0]}", "",
           "CPU seconds per client, by phase (median over rounds of the mean per "
           "client); the whole against raw JAX's:", "",
           "| clients x devices | contender | imports | init | mesh + first psum | "
           "exit | whole | vs raw JAX | exit: blocking waits a client |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
  extra_cpu = []
  for shape in shapes:
    medians = {}
    for name in CONTENDERS:
      medians[name] = {p: statistics.median(m[p] for m in results[(name, shape)])
                       for p in (*PHASES, "threads", "exit switches")}
    raw_whole = sum(medians["raw JAX"][p] for p in PHASES)
    for name, med in medians.items():
      whole = sum(med[p] for p in PHASES)
      lines.append(f"| {shape[0]} x {shape[1]} | {name} | {med['imports']:.3f} | "
                   f"{med['init']:.3f} | {med['first']:.3f} | {med['exit']:.3f} | "
                   f"{whole:.3f} | {whole / raw_whole:.2f}x | {med['exit switches']:.0f} |")
    jd, raw = medians["jdtensor"], medians["raw JAX"]
    extra_cpu.append((shape, jd["init"] + jd["first"] - raw["init"] - raw["first"],
                      jd["exit"] - raw["exit"], jd["threads"],
                      medians["jdtensor, heartbeat off"]["threads"]))
  lines += ["", "Where jdtensor's extra CPU per client is: init + first psum "
            "(raw JAX starts its backend lazily, in the first psum; jdtensor in "
            "its init) and the exit path, against raw JAX:", ""]
  lines += [f"* {s[0]} x {s[1]}: start-up {start:+.3f} s, exit {end:+.3f} s; "
            f"of the whole, jdtensor's own threads (heartbeat, watchdog, liveness "
            f"links, helpers) {1e3 * threads:.1f} ms ({1e3 * threads_off:.1f} ms "
            "with the heartbeat off)"
            for s, start, end, threads, threads_off in extra_cpu]
  lines += ["", "The start-up's steps, CPU per client in ms (the process's, every "
            "thread; the main thread's in brackets), and jdtensor's threads, as "
            "installed (bytecode cached), medians over rounds:", ""]
  for shape in shapes:
    rounds = {name: results[(name, shape)] for name in ("raw JAX", "jdtensor, bytecode cached")}
    cells = []
    for name, label in (("raw JAX", "raw JAX"), ("jdtensor, bytecode cached", "jdtensor")):
      keys = sorted({k for m in rounds[name] for k in m if k.startswith("step ")
                     and not k.startswith("step main ")})
      steps = ", ".join(
          f"{k[len('step '):]} {1e3 * statistics.median(m.get(k, 0.0) for m in rounds[name]):.1f}"
          f" ({1e3 * statistics.median(m.get('step main ' + k[len('step '):], 0.0) for m in rounds[name]):.1f})"
          for k in keys)
      cells.append(f"{label}: {steps}")
    thread_keys = sorted({k for m in rounds["jdtensor, bytecode cached"] for k in m
                          if k.startswith("thread ")})
    threads = ", ".join(
        f"{k[len('thread '):]} "
        f"{1e3 * statistics.median(m.get(k, 0.0) for m in rounds['jdtensor, bytecode cached']):.1f}"
        for k in thread_keys)
    lines.append(f"* {shape[0]} x {shape[1]}: " + "; ".join(cells)
                 + f"; jdtensor's threads: {threads or 'none'}")
  lines += ["", f"Of the start-up's extra, importing the jdtensor modules that "
            f"`initialize_accelerator_system` pulls in costs "
            f"{jdtensor_import_cpu(args.repeats):.3f} s of CPU compiled from source "
            f"(this machine sets PYTHONDONTWRITEBYTECODE), "
            f"{jdtensor_import_cpu(args.repeats, cached=True):.3f} s from cached "
            "bytecode (median, a fresh process, jax already imported)."]
  report = "\n".join(lines)
  print(report)
  return report


if __name__ == "__main__":
  main()
