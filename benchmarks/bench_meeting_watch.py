"""What the meeting watch (`jdtensor.heartbeat.meetings.ServiceWaitWatch`)
costs a client before its first meeting, when every call site of the
program is new to it.

    python -m benchmarks.bench_meeting_watch [--repeats N]

Each repetition runs, in a fresh interpreter with and without the watch
started first (interleaved): tracing and compiling a jitted function of 300
operations (JAX's Python: tens of thousands of call sites met once), then
a million calls at one site (a steady loop). Medians, seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks._paths import with_checkout

_BODY = r"""
import json, sys, time
if {watch}:
  from jdtensor.heartbeat.meetings import ServiceWaitWatch
  assert ServiceWaitWatch().start()
import jax, jax.numpy as jnp
def f(x):
  for i in range(300):
    x = jnp.sin(x) * (i + 1) + jnp.cos(x)
  return x.sum()
start = time.perf_counter()
jax.jit(f).lower(jnp.ones(8)).compile()
trace = time.perf_counter() - start
def g(a):
  return a + 1
start = time.perf_counter()
a = 0
for _ in range(1_000_000):
  a = g(a)
loop = time.perf_counter() - start
print(json.dumps({{"trace": trace, "loop": loop}}))
"""


def one(watch: bool) -> dict[str, float]:
  out = subprocess.run([sys.executable, "-c", _BODY.format(watch=watch)],
                       capture_output=True, text=True, timeout=300, check=True,
                       env=with_checkout({**os.environ, "JAX_PLATFORMS": "cpu"}))
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)
  if sys.version_info < (3, 12):
    return "(sys.monitoring is Python 3.12+: the watch does not start on this Python)"
  runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
  for _ in range(args.repeats):
    for watch in (False, True):
      runs[watch].append(one(watch))
  rows = ["| | without the watch | with the watch | ratio |", "|---|---:|---:|---:|"]
  for key, name in (("trace", "trace and compile a 300-op jit"),
                    ("loop", "a million calls at one site")):
    off = statistics.median(r[key] for r in runs[False])
    on = statistics.median(r[key] for r in runs[True])
    rows.append(f"| {name} | {off:.3f} | {on:.3f} | {on / off:.2f}x |")
  return "\n".join(rows)


if __name__ == "__main__":
  print(main())
