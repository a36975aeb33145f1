"""Start-up and dead-client detection as the client count grows, 2 to 32.

    python -m benchmarks.bench_scaling [--repeats N] [--clients 2,4,8,16,32]
        [--tf-clients 2,4,8,16] [--plot benchmarks/scaling.png]
    python -m benchmarks.bench_scaling --paired-only [--repeats N] [--clients 16,32]

1. Cold start. N clients x 1 CPU device, each building a mesh of every
   device, running one cross-client psum and exiting normally
   (`_phases_client.py`; TF DTensor: `_tf_client.py`). Every contender's
   clients are started by the same hand-written spawner, except "jdtensor
   launch", which is `jdtensor launch -n N` as users run it (its CPU includes
   the launcher's own). Per run: wall from the first spawn to every client's
   psum done, and to the last client's exit; each client's whole-process CPU
   (every thread, from ``os.wait4``), averaged over the clients.
   jdtensor runs as installed (its bytecode compiled, as pip compiles every
   wheel it installs, JAX's included) and from source (this checkout as an
   editable install where ``PYTHONDONTWRITEBYTECODE`` is set: every client
   compiles jdtensor's modules again; see RESULTS.md, "Start-up CPU by phase").
   Paired rounds: raw JAX's and jdtensor's clients at once, each cluster its
   own (`cold_start_paired`), so that the machine's state (its other tenants,
   how costly a page fault is that minute) falls on both alike: a ratio per
   round far steadier than the ratio of sequential runs. ``--paired-only``
   also splits jdtensor's extra CPU a client into the init, the mesh and
   first psum, and the exit (Python's finalisation included).
2. Dead-client detection. N jdtensor clients idle after start-up (heartbeat
   period 1 s); the last is SIGKILLed; seconds until every survivor has
   exited. (Raw JAX's default is about 100 s: bench_startup.py measures it.)

Rounds are interleaved; figures are medians. Writes a PNG of both when
matplotlib is installed (``pip install -e '.[bench]'``; never a jdtensor
dependency).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

from benchmarks._paths import ROOT
from benchmarks._timing import machine
from benchmarks.bench_startup_cpu import _CACHED, CLIENT, free_ports


PY = sys.executable
TF_PY = os.environ.get("JDTENSOR_BENCH_TF_PYTHON")
TF = os.path.join(ROOT, "benchmarks", "_tf_client.py")
IDLE = os.path.join(ROOT, "benchmarks", "_client.py")
RUN_SECRET = "bench-scaling-secret-0123456789"


def _env(extra: dict[str, str]) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("DTENSOR_", "JDTENSOR_", "JAX_", "XLA_"))}
  env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT,
             JDTENSOR_RUN_SECRET=RUN_SECRET, **extra)
  if env.get("PYTHONDONTWRITEBYTECODE") == "":
    del env["PYTHONDONTWRITEBYTECODE"]  # Python reads any value as "set".
  return env


def _stop(procs: list[subprocess.Popen]) -> None:
  for proc in procs:
    if proc.poll() is None:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    if proc.returncode is None:
      proc.wait(timeout=30)


class Run:
  """One cold start: its walls and the CPU per client (in all, and in the
  imports phase: ``import jax, numpy``, the same code in every contender and
  before any of jdtensor's runs; None where the client does not report it)."""

  def __init__(self, first: float, end: float, cpu_per_client: float,
               imports_per_client: float | None = None,
               phases: dict[str, float] | None = None):
    self.first, self.end, self.cpu = first, end, cpu_per_client
    self.imports = imports_per_client
    # Mean CPU per client in each phase after the imports: "init", "first"
    # (the mesh and the psum) and "exit" (after the psum, Python's
    # finalisation included); None where a process is not one client.
    self.phases = phases

  @property
  def after_imports(self) -> float | None:
    """CPU per client after the imports: where jdtensor's work is."""
    return None if self.imports is None else self.cpu - self.imports


_REAP_TIMEOUT = 600.0


def _collect(procs: list[subprocess.Popen], start: float, n: int,
             timeout: float = _REAP_TIMEOUT, exit_errors_ok: bool = False
             ) -> tuple[list[float], float, float, float | None, dict[str, float] | None]:
  """Reaps every process: (first-psum stamps, wall to the last exit, CPU in
  all, mean CPU per client in the imports phase or None, mean CPU per client
  in each later phase or None; see `Run`). A process's CPU from ``wait4``
  includes the children it reaped (the launcher's clients)."""
  timer = threading.Timer(timeout, _stop, [procs])
  timer.start()
  cpu, stamps, imports, whole = 0.0, [], [], []
  try:
    for proc in procs:
      _, status, usage = os.wait4(proc.pid, 0)
      proc.returncode = os.waitstatus_to_exitcode(status)
      whole.append(usage.ru_utime + usage.ru_stime)
      cpu += whole[-1]
    end = time.time() - start
  finally:
    timer.cancel()
    _stop(procs)
  phases: dict[str, float] | None = {"init": 0.0, "first": 0.0, "exit": 0.0}
  for proc, process_cpu in zip(procs, whole):
    out = proc.stdout.read() if proc.stdout else ""
    # The launcher tags its clients' lines ("[client 3] FIRST_COLLECTIVE_AT ...").
    stamps += [float(t) for t in re.findall(r"FIRST_COLLECTIVE_AT ([\d.]+)", out)]
    imports += [float(t) for t in re.findall(r"PHASE imports ([\d.]+)", out)]
    marks = dict(re.findall(r"PHASE (\w+) ([\d.]+)", out))
    if phases is not None and len(procs) == n and set(marks) == {"imports", "init", "first"}:
      at = {k: float(v) for k, v in marks.items()}
      phases["init"] += (at["init"] - at["imports"]) / n
      phases["first"] += (at["first"] - at["init"]) / n
      phases["exit"] += (process_cpu - at["first"]) / n
    else:
      phases = None
    if proc.returncode != 0 and not exit_errors_ok:
      raise RuntimeError(f"a client ended with {proc.returncode}: {out[-500:]}")
  if len(stamps) != n:
    raise RuntimeError(f"{len(stamps)} of {n} clients reached the psum")
  return stamps, end, cpu, (sum(imports) / n if len(imports) == n else None), phases


def cold_start_by_hand(argv: list[str], n: int, extra: dict[str, str],
                       exit_errors_ok: bool = False) -> Run:
  """`argv` on n clients started by hand, with DTENSOR_* set as every launcher
  does. `exit_errors_ok`: a client may fail after its psum (TF DTensor's
  clients, at 16: client 0's exit ends the coordination service while the
  others still leave its barrier)."""
  jobs = ",".join(f"localhost:{p}" for p in free_ports(n))
  start, procs = time.time(), []
  for c in range(n):
    env = _env({"DTENSOR_JOBS": jobs, "DTENSOR_CLIENT_ID": str(c),
                "JAX_NUM_CPU_DEVICES": "1", **extra})
    procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True,
                                  start_new_session=True))
  stamps, end, cpu, imports, phases = _collect(procs, start, n, exit_errors_ok=exit_errors_ok)
  return Run(max(stamps) - start, end, cpu / n, imports, phases)


def cold_start_launch(n: int, extra: dict[str, str]) -> Run:
  """`jdtensor launch -n n` of the same client; CPU of the launcher and clients."""
  start = time.time()
  proc = subprocess.Popen([PY, "-m", "jdtensor", "launch", "-n", str(n), "--timeout",
                           "300", "--", PY, CLIENT, "jdtensor"], env=_env(extra),
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          start_new_session=True)
  stamps, end, cpu, imports, _ = _collect([proc], start, n)
  return Run(max(stamps) - start, end, cpu / n, imports)


def cold_start_paired(n: int, jdtensor_first: bool) -> tuple[Run, Run]:
  """Raw JAX's n clients and jdtensor's n clients at once, started in turn
  (client 0 of one, client 0 of the other, client 1, ...): each cluster its
  own, both on the same machine in the same moment. (raw JAX's run,
  jdtensor's): compared paired by round."""
  contenders = [("raw JAX", [PY, CLIENT, "raw"], {}),
                ("jdtensor", [PY, CLIENT, "jdtensor"], _CACHED)]
  if jdtensor_first:
    contenders.reverse()
  jobs = {name: ",".join(f"localhost:{p}" for p in free_ports(n)) for name, _, _ in contenders}
  procs: dict[str, list[subprocess.Popen]] = {name: [] for name, _, _ in contenders}
  start = time.time()
  try:
    for c in range(n):
      for name, argv, extra in contenders:
        env = _env({"DTENSOR_JOBS": jobs[name], "DTENSOR_CLIENT_ID": str(c),
                    "JAX_NUM_CPU_DEVICES": "1", **extra})
        procs[name].append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, text=True,
                                            start_new_session=True))
  except BaseException:
    _stop([p for ps in procs.values() for p in ps])
    raise
  runs: dict[str, Run] = {}
  errors: list[BaseException] = []

  def collect(name: str) -> None:
    try:
      stamps, end, cpu, imports, phases = _collect(procs[name], start, n)
      runs[name] = Run(max(stamps) - start, end, cpu / n, imports, phases)
    except BaseException as e:  # pylint: disable=broad-except
      errors.append(e)
  # Both reaped at once: each cluster's last exit is timed when it happens,
  # not when the other cluster's reaping is done.
  reapers = [threading.Thread(target=collect, args=(name,)) for name in procs]
  try:
    for reaper in reapers:
      reaper.start()
    for reaper in reapers:
      reaper.join(_REAP_TIMEOUT + 60)  # `_collect` stops its processes by then.
    if errors:
      raise errors[0]
    if len(runs) != len(procs):
      raise RuntimeError("a cluster was not reaped in time")
  finally:
    _stop([p for ps in procs.values() for p in ps])
  return runs["raw JAX"], runs["jdtensor"]


def detection(n: int) -> float:
  """Seconds from SIGKILL of the last of n idle jdtensor clients to the last
  survivor's exit (heartbeat period 1 s)."""
  jobs = ",".join(f"localhost:{p}" for p in free_ports(n))
  procs = [subprocess.Popen(
      [PY, IDLE, "wait_to_be_killed"],
      env=_env({"DTENSOR_JOBS": jobs, "DTENSOR_CLIENT_ID": str(c),
                "JAX_NUM_CPU_DEVICES": "1", "JDTENSOR_HEARTBEAT_PERIOD": "1",
                **_CACHED}),
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
      start_new_session=True) for c in range(n)]
  try:
    for proc in procs:
      line = "?"
      while line and not line.startswith("READY"):
        line = proc.stdout.readline()  # type: ignore[union-attr]
      if not line:
        raise RuntimeError("a client ended before it was ready")
    time.sleep(1.5)  # The heartbeat's first beats.
    killed = time.monotonic()
    os.kill(procs[-1].pid, signal.SIGKILL)
    for proc in procs[:-1]:
      proc.wait(timeout=120)
    return time.monotonic() - killed
  finally:
    _stop(procs)


CONTENDERS = {
    "raw JAX": lambda n: cold_start_by_hand([PY, CLIENT, "raw"], n, {}),
    "jdtensor": lambda n: cold_start_by_hand([PY, CLIENT, "jdtensor"], n, _CACHED),
    "jdtensor from source": lambda n: cold_start_by_hand([PY, CLIENT, "jdtensor"], n, {}),
    "jdtensor launch": lambda n: cold_start_launch(n, _CACHED),
    "TF DTensor": lambda n: cold_start_by_hand([TF_PY or "", TF, "first_collective"],
                                               n, {}, exit_errors_ok=True),
}


def _plot(path: str, counts: list[int], runs: dict[str, dict[int, list[Run]]],
          detect: dict[int, list[float]],
          paired: dict[int, list[tuple[Run, Run]]]) -> str:
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    return "(no plot: matplotlib is not installed; `pip install -e '.[bench]'`)"
  fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
  for name, by_n in runs.items():
    ns = [n for n in counts if by_n.get(n)]
    axes[0].plot(ns, [statistics.median(r.first for r in by_n[n]) for n in ns],
                 marker="o", label=name)
    axes[1].plot(ns, [statistics.median(r.cpu for r in by_n[n]) for n in ns],
                 marker="o", label=name)
  ns = [n for n in counts if detect.get(n)]
  axes[2].plot(ns, [statistics.median(detect[n]) for n in ns], marker="o",
               color="tab:orange", label="jdtensor (period 1 s)")
  ns = [n for n in counts if paired.get(n)]
  for n in ns:  # Every round's ratio, and the median's line.
    ratios = [jd.cpu / raw.cpu for raw, jd in paired[n]]
    axes[3].scatter([n] * len(ratios), ratios, color="tab:blue", alpha=0.4, s=12)
  axes[3].plot(ns, [statistics.median(jd.cpu / raw.cpu for raw, jd in paired[n])
                    for n in ns], marker="o", label="jdtensor / raw JAX (median)")
  axes[3].axhline(1.05, color="tab:red", linestyle="--", linewidth=1,
                  label="target 1.05x")
  axes[3].axhline(1.0, color="gray", linewidth=1)
  titles = ("Cold start: launch to every client's first psum (s)",
            "CPU per client, whole process (s)",
            "Dead-client detection: SIGKILL to last survivor's exit (s)",
            "CPU per client, paired rounds: jdtensor / raw JAX")
  for ax, title in zip(axes, titles):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("clients (1 CPU device each)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.grid(True, alpha=0.3)
    if ax is not axes[3]:
      ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
  fig.suptitle(f"jdtensor start-up scaling ({machine()})", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return f"![Start-up and detection against the client count]({os.path.basename(path)})"


def _slope(xs: list[int], ys: list[float]) -> float:
  """Least-squares slope of ys against xs."""
  mx, my = statistics.mean(xs), statistics.mean(ys)
  return (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
          / sum((x - mx) ** 2 for x in xs))


def paired_only(counts: list[int], repeats: int) -> str:
  """Only the paired rounds: each round's wall to the first psum and CPU per
  client, jdtensor's over raw JAX's, with the median, the mean and two
  standard errors of the mean (a round's ratio spreads by a few percent)."""
  cold_start_paired(4, False)  # Fills the bytecode cache.
  lines = [f"Paired rounds only, {repeats} a count (who starts first alternates): "
           "jdtensor's wall to every client's first psum, wall to the last "
           "exit (the whole run) and CPU per client over raw JAX's, each round "
           "in the order run:", "",
           "| clients | wall to the first psum, each round | median / mean +- 2 s.e. | "
           "wall to the last exit, each round | median / mean +- 2 s.e. | "
           "CPU, each round | CPU: median |", "|---:|---|---:|---|---:|---|---:|"]

  def summary(ratios: list[float]) -> str:
    error = 2 * statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else 0.0
    return (f"{', '.join(f'{r:.3f}' for r in ratios)} | {statistics.median(ratios):.3f}"
            f" / {statistics.mean(ratios):.3f} +- {error:.3f}")
  extras: dict[int, dict[str, list[float]]] = {}
  for n in counts:
    walls, ends, cpus = [], [], []
    extra = extras.setdefault(n, {"init": [], "first": [], "exit": []})
    for round_ in range(repeats):
      raw, jd = cold_start_paired(n, round_ % 2 == 1)
      walls.append(jd.first / raw.first)
      ends.append(jd.end / raw.end)
      cpus.append(jd.cpu / raw.cpu)
      if raw.phases is not None and jd.phases is not None:
        for phase, values in extra.items():
          values.append(jd.phases[phase] - raw.phases[phase])
    lines.append(f"| {n} | {summary(walls)} | {summary(ends)} | "
                 f"{', '.join(f'{c:.3f}' for c in cpus)} | {statistics.median(cpus):.3f} |")
  lines += ["", "jdtensor's extra CPU per client by phase in the same rounds, "
            "milliseconds (median over rounds of jdtensor's mean minus raw JAX's): "
            "init (jdtensor's also starts the backend, which raw JAX starts in its "
            "first psum), the mesh and first psum, and the exit (after the psum, "
            "Python's finalisation included):", "",
            "| clients | init | mesh + first psum | exit |", "|---:|---:|---:|---:|"]
  for n, extra in extras.items():
    if all(extra.values()):
      lines.append(f"| {n} | " + " | ".join(
          f"{1e3 * statistics.median(extra[p]):+.0f}" for p in ("init", "first", "exit"))
                   + " |")
  report = "\n".join(lines)
  print(report)
  return report


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--clients", default="2,4,8,16,32")
  parser.add_argument("--tf-clients", default="2,4,8,16",
                      help="client counts for TF DTensor (about 0.5 GiB of "
                           "memory and 3 s of CPU per client)")
  parser.add_argument("--plot", default=os.path.join(ROOT, "benchmarks", "scaling.png"))
  parser.add_argument("--no-paired", action="store_true",
                      help="skip the paired rounds (both clusters at once)")
  parser.add_argument("--paired-only", action="store_true",
                      help="only the paired rounds, each round's ratios listed")
  args = parser.parse_args(argv)
  counts = [int(v) for v in args.clients.split(",")]
  if args.paired_only:
    return paired_only(counts, args.repeats)
  tf_counts = {int(v) for v in args.tf_clients.split(",")} if TF_PY else set()
  names = [k for k in CONTENDERS if k != "TF DTensor" or tf_counts]
  runs: dict[str, dict[int, list[Run]]] = {k: {} for k in names}
  paired: dict[int, list[tuple[Run, Run]]] = {}
  detect: dict[int, list[float]] = {}
  cold_start_by_hand([PY, CLIENT, "jdtensor"], 2, _CACHED)  # Fills the bytecode cache.
  for round_ in range(args.repeats):
    for n in counts:
      # Each round starts with another contender, so that none always runs
      # first after the previous count's detection.
      order = [k for k in names if k != "TF DTensor" or n in tf_counts]
      shift = round_ % len(order)
      for name in order[shift:] + order[:shift]:
        runs[name].setdefault(n, []).append(CONTENDERS[name](n))
      if not args.no_paired:
        paired.setdefault(n, []).append(cold_start_paired(n, round_ % 2 == 1))
      detect.setdefault(n, []).append(detection(n))

  def med(name: str, n: int, what: str) -> float:
    return statistics.median(getattr(r, what) for r in runs[name][n])

  lines = [f"Machine: {machine()}",
           "TF DTensor: " + (f"TensorFlow from `{TF_PY}` (a throw-away venv; never "
                             f"a jdtensor dependency), at {sorted(tf_counts)} clients"
                             if TF_PY else "skipped (set JDTENSOR_BENCH_TF_PYTHON)"),
           "", "Cold start, N clients x 1 CPU device: seconds to every client's "
           "first psum / to the last exit, and CPU seconds per client (medians of "
           f"{args.repeats} interleaved rounds; ratios to raw JAX in brackets):", "",
           "| clients | " + " | ".join(names) + " |",
           "|---:|" + "---:|" * len(names)]
  for n in counts:
    cells = []
    for name in names:
      if n not in runs[name]:
        cells.append("")
        continue
      first, end, cpu = (med(name, n, w) for w in ("first", "end", "cpu"))
      if name == "raw JAX":
        cells.append(f"{first:.2f} / {end:.2f} s, CPU {cpu:.2f} s")
      else:
        rf, re_, rc = (med("raw JAX", n, w) for w in ("first", "end", "cpu"))
        cells.append(f"{first:.2f} ({first / rf:.2f}x) / {end:.2f} ({end / re_:.2f}x) s, "
                     f"CPU {cpu:.2f} s ({cpu / rc:.2f}x)")
    lines.append(f"| {n} | " + " | ".join(cells) + " |")
  lines += ["", "CPU per client after the imports (``import jax, numpy``: the same "
            "code in every contender, run before any of jdtensor's, whose CPU varies "
            "between rounds by as much as jdtensor's whole cost), medians of the "
            "same rounds: jdtensor's extra over raw JAX without that noise, and "
            "the whole-process ratio it makes:", "",
            "| clients | raw JAX | " + " | ".join(
                n for n in names if n not in ("raw JAX", "TF DTensor")) + " |",
            "|---:|---:|" + "---:|" * (len(names) - 1 - ("TF DTensor" in names))]
  for n in counts:
    raw_after = statistics.median(r.after_imports for r in runs["raw JAX"][n])
    raw_whole = med("raw JAX", n, "cpu")
    cells = [f"{raw_after:.3f} s"]
    for name in names:
      if name in ("raw JAX", "TF DTensor"):
        continue
      extra = statistics.median(r.after_imports for r in runs[name][n]) - raw_after
      cells.append(f"{extra * 1e3:+.0f} ms ({(raw_whole + extra) / raw_whole:.3f}x)")
    lines.append(f"| {n} | " + " | ".join(cells) + " |")
  lines += ["", "Wall to every client's first psum, each round (seconds, in the "
            "order run), and the mean: at 2 clients raw JAX's second client "
            "either escapes the coordinator's connect back-off or waits about "
            "1 s in it, so its rounds are bimodal and the median depends on how "
            "often it escaped (jdtensor's rendezvous never lets a client meet "
            "the back-off):", "",
            "| clients | raw JAX | mean | jdtensor | mean |", "|---:|---|---:|---|---:|"]
  for n in counts:
    cells = []
    for name in ("raw JAX", "jdtensor"):
      walls = [r.first for r in runs[name][n]]
      cells += [", ".join(f"{w:.2f}" for w in walls), f"{statistics.mean(walls):.2f}"]
    lines.append(f"| {n} | " + " | ".join(cells) + " |")
  if paired:
    lines += ["", "Paired: raw JAX's N clients and jdtensor's N clients started at "
              "once, in turn, each cluster its own (2N processes on the machine), "
              "so that both meet the same machine at the same moment; CPU per "
              "client (medians), and jdtensor's ratio to raw JAX's in each round "
              "(median and range):", "",
              "| clients | raw JAX | jdtensor | ratio, median | ratio, each round "
              "| after the imports, jdtensor's extra | wall to the first psum, "
              "ratio (median) | wall to the last exit, ratio (median) |",
              "|---:|---:|---:|---:|---|---:|---:|---:|"]
    for n in counts:
      pairs = paired.get(n, [])
      if not pairs:
        continue
      ratios = [jd.cpu / raw.cpu for raw, jd in pairs]
      extras = [jd.after_imports - raw.after_imports for raw, jd in pairs
                if jd.after_imports is not None and raw.after_imports is not None]
      lines.append(
          f"| {n} | {statistics.median(r.cpu for r, _ in pairs):.3f} s | "
          f"{statistics.median(j.cpu for _, j in pairs):.3f} s | "
          f"{statistics.median(ratios):.3f}x | "
          + ", ".join(f"{r:.3f}" for r in ratios) + " | "
          + (f"{1e3 * statistics.median(extras):+.0f} ms" if extras else "") + " | "
          f"{statistics.median(jd.first / raw.first for raw, jd in pairs):.3f}x | "
          f"{statistics.median(jd.end / raw.end for raw, jd in pairs):.3f}x |")
  lines += ["", "How the cost grows (least-squares slope over the client counts):", ""]
  for name in names:
    ns = sorted(runs[name])
    if len(ns) < 2:
      continue
    wall = _slope(ns, [med(name, n, "first") for n in ns])
    cpu = [med(name, n, "cpu") for n in ns]
    lines.append(f"* {name}: +{wall:.2f} s of wall to the first psum per added client; "
                 f"CPU per client {min(cpu):.2f}-{max(cpu):.2f} s "
                 f"({_slope(ns, cpu) * 1e3:+.1f} ms per added client)")
  lines += ["", "Dead-client detection (jdtensor, heartbeat period 1 s; SIGKILL of "
            "the last client to the last survivor's exit), seconds:", "",
            "| clients | runs | min | median | max |", "|---:|---:|---:|---:|---:|"]
  for n in counts:
    d = detect[n]
    lines.append(f"| {n} | {len(d)} | {min(d):.2f} | {statistics.median(d):.2f} | "
                 f"{max(d):.2f} |")
  lines += ["", _plot(args.plot, counts, runs, detect, paired)]
  report = "\n".join(lines)
  print(report)
  return report


if __name__ == "__main__":
  main()
