"""Where the machine idles during a cold start: why the wall follows the CPU.

    python -m benchmarks.bench_idle [--clients 32] [--repeats 3]

Each round starts the clients of raw JAX and of jdtensor in turn (by hand, as
`bench_startup_cpu.py` does: `_phases_client.py`, every module's bytecode
from one cache), while a thread samples the machine's idle time
(``/proc/stat``'s idle + iowait, every 50 ms). Each client's ``WALL`` lines
give the phase marks. Per contender, medians over rounds: the seconds from
the first spawn to the last client's end of imports, to the last first
psum, to the last exit, and the fraction of the machine's CPU time left idle
in each part.

What it shows at 16-32 clients on 2 cores: the machine is busy from the
first spawn to the last exit, except where raw JAX's clients back off
connecting to the coordinator (about half a second after the last import).
So the wall is the CPU of all the clients over the cores, plus that idle
time: jdtensor's wall is raw JAX's minus raw JAX's idle time plus
(clients x jdtensor's extra CPU a client) / cores.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time


from benchmarks.bench_startup_cpu import _CACHED, communicate_all, start_clients

_SAMPLE_SECONDS = 0.05


class _IdleSampler:
  """Samples ``/proc/stat``'s first line: (time, idle ticks, all ticks)."""

  def __init__(self) -> None:
    self.samples: list[tuple[float, int, int]] = []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def __enter__(self) -> _IdleSampler:
    self._thread.start()
    return self

  def __exit__(self, *exc: object) -> None:
    self._stop.set()
    self._thread.join(timeout=5)

  def _run(self) -> None:
    while not self._stop.is_set():
      with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
      self.samples.append((time.time(), ticks[3] + ticks[4], sum(ticks)))
      self._stop.wait(_SAMPLE_SECONDS)

  def idle(self, start: float, end: float) -> float:
    """The fraction of the machine's CPU time left idle from `start` to `end`."""
    inside = [s for s in self.samples if start <= s[0] <= end]
    if len(inside) < 2:
      return float("nan")
    return (inside[-1][1] - inside[0][1]) / max(1, inside[-1][2] - inside[0][2])


def one_round(mode: str, clients: int) -> dict[str, float]:
  """One cold start: seconds to each mark and the idle fraction in each part."""
  with _IdleSampler() as sampler:
    spawned = time.time()
    procs = start_clients(mode, clients, 1, dict(_CACHED))
    outs = communicate_all(procs, 600)
    ended = time.time()
  marks: dict[str, float] = {}
  for c, (proc, out) in enumerate(zip(procs, outs)):
    if proc.returncode != 0:
      raise RuntimeError(f"{mode}: client {c} ended with {proc.returncode}: {out[-500:]}")
    for line in out.splitlines():
      if line.startswith("WALL phase "):
        name, _, times = line[len("WALL phase "):].rpartition(": ")
        marks[name] = max(marks.get(name, 0.0), float(times.split()[-1]))
  imports, first = marks["imports"], marks["first"]
  return {"to last import": imports - spawned, "to last first psum": first - spawned,
          "to last exit": ended - spawned,
          "idle before": sampler.idle(spawned, imports),
          "idle import->psum": sampler.idle(imports, first),
          "idle psum->exit": sampler.idle(first, ended),
          "idle, seconds of wall": sampler.idle(spawned, ended) * (ended - spawned)}


def main(argv: list[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)
  runs: dict[str, list[dict[str, float]]] = {"raw": [], "jdtensor": []}
  for _ in range(args.repeats):
    for mode, rounds in runs.items():
      rounds.append(one_round(mode, args.clients))
  keys = list(runs["raw"][0])
  lines = [f"{args.clients} clients x 1 CPU device, medians of {args.repeats} rounds "
           "(seconds from the first spawn; idle: the machine's CPU time left idle, "
           "both cores):", "",
           "| contender | " + " | ".join(keys) + " |",
           "|---|" + "---:|" * len(keys)]
  for mode, rounds in runs.items():
    cells = []
    for k in keys:
      value = statistics.median(r[k] for r in rounds)
      cells.append(f"{100 * value:.1f}%" if k.startswith("idle") and k != "idle, seconds of wall"
                   else f"{value:.2f}")
    lines.append(f"| {'raw JAX' if mode == 'raw' else mode} | " + " | ".join(cells) + " |")
  text = "\n".join(lines)
  print(text)
  return text


if __name__ == "__main__":
  main()
