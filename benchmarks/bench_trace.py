"""The cost of ``jdtensor launch --trace``: a 1 ms step loop with the trace
on and off, side by side, and the trace's size.

    python -m benchmarks.bench_trace [--repeats 5] [--steps 10000]

2 clients x 1 CPU device run STEPS steps of about 1 ms (1 ms of their own
Python, then a psum over both clients: benchmarks/_trace_client.py) at the
heartbeat's default period; the runs alternate, trace on and off, round
after round, so the machine's noise falls on both alike. Target: the loop at
most 2% slower with the trace on.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import statistics
import sys
import tempfile

from benchmarks._paths import ROOT, with_checkout
from benchmarks._timing import machine
from jdtensor import launcher

CLIENT = os.path.join(ROOT, "benchmarks", "_trace_client.py")
TARGET_PERCENT = 2.0


def one(steps: int, trace: str | None) -> tuple[float, int]:
  """(the slower client's loop seconds, the trace's size in bytes)."""
  env = with_checkout({k: v for k, v in os.environ.items()
                       if not k.startswith(("DTENSOR_", "JDTENSOR_"))})
  env.update(JAX_PLATFORMS="cpu", STEPS=str(steps))
  out, err = io.StringIO(), io.StringIO()
  res = launcher.launch(launcher.LaunchSpec(
      command=(sys.executable, CLIENT), num_clients=2, devices_per_client=1,
      timeout=steps / 100 + 120, trace=trace), out=out, err=err, env=env)
  if res.exit_code:
    raise RuntimeError(f"benchmark run failed: {res.reason}\n{err.getvalue()}")
  seconds = [float(s) for s in re.findall(r"SECONDS ([\d.]+)", out.getvalue())]
  return max(seconds), os.path.getsize(trace) if trace else 0


def main(argv: list[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--steps", type=int, default=10000)
  args = parser.parse_args(argv)
  on: list[float] = []
  off: list[float] = []
  sizes: list[int] = []
  with tempfile.TemporaryDirectory() as folder:
    for r in range(args.repeats):
      for traced in ([True, False] if r % 2 == 0 else [False, True]):
        seconds, size = one(args.steps, os.path.join(folder, "run.json") if traced else None)
        (on if traced else off).append(seconds)
        if traced:
          sizes.append(size)
  m_on, m_off = statistics.median(on), statistics.median(off)
  cost = 100.0 * (m_on - m_off) / m_off
  lines = [
      f"Machine: {machine()}.", "",
      f"2 clients x 1 CPU device, {args.steps:,} steps (1 ms of the client's own work, "
      f"then a psum: {1e3 * m_off / args.steps:.2f} ms a step in all), heartbeat period "
      f"2 s (the default), {args.repeats} rounds, trace on and off alternating; the "
      "slower client's loop, seconds:",
      "", "| | median | min / max |", "|---|---:|---:|",
      f"| trace off | {m_off:.2f} | {min(off):.2f} / {max(off):.2f} |",
      f"| trace on | {m_on:.2f} | {min(on):.2f} / {max(on):.2f} |", "",
      f"Cost of the trace: **{cost:+.2f}%** of the loop's time (target: at most "
      f"{TARGET_PERCENT:g}%); the trace of a run: {statistics.median(sizes) / 1024:.1f} KiB "
      "(the two clients' tracks and the launcher's)."]
  text = "\n".join(lines)
  print(text)
  return text


if __name__ == "__main__":
  main()
