"""Start-up cost in instructions, jdtensor vs raw JAX: a repeatable CPU figure.

    python -m benchmarks.bench_instructions [--repeats N] [--shapes 2x1,4x1]

CPU seconds on this shared 2-core machine spread about ±5% between rounds
(`import jax` alone moves 30-80 ms a client), so no timed run can tell 1.05x
from 1.00x. Instructions retired move far less: each client runs under
valgrind's callgrind (``valgrind`` from Debian's packages; about 60 times
slower), and its whole process's count, every thread from start to exit, is
read from callgrind's summary.

Each contender starts N clients by hand doing the same work
(`_phases_client.py`: imports, initialisation, a mesh and one cross-client
psum, then a normal exit), with every module's bytecode read from the same
cache (``PYTHONPYCACHEPREFIX``, filled by a warm-up run without valgrind), as
an installed wheel has it. Contenders: raw JAX, jdtensor (the default,
heartbeat on), jdtensor with ``DTENSOR_ENABLE_HEARTBEAT=false``.

The heartbeat's period is raised to 120 s and the time-outs to 1200 s under
valgrind: a 1.4 s start-up takes about 80 s there, and a 2 s period would beat
40 times where a real run beats once or twice (the first exchange and the
last). Instruction counts are a proxy for CPU time, not a measure of it: a
cold process's cache misses cost time that callgrind does not count. Nor are
counts wholly independent of load: code that polls or spins (gRPC, XLA's thread
pools) runs more often when it waits longer, so a raw JAX client measured
beside a test suite counted 0.7% more than on an idle machine, where two
rounds agree to 0.02%. Run it alone.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import tempfile


from benchmarks.bench_startup_cpu import _CACHED, communicate_all, start_clients

CONTENDERS = {"raw JAX": ("raw", {}), "jdtensor": ("jdtensor", {}),
              "jdtensor, heartbeat off": ("jdtensor", {"DTENSOR_ENABLE_HEARTBEAT": "false"})}
# Scaled for a ~60x slower process (see the module's docstring).
UNDER_VALGRIND = {"JDTENSOR_HEARTBEAT_PERIOD": "120", "JDTENSOR_INIT_TIMEOUT": "1200",
                  "JDTENSOR_COORDINATION_TIMEOUT": "1200"}
_COLLECTED = re.compile(r"^==\d+== Collected : (\d+)$", re.MULTILINE)


def collected(stderr: str) -> int:
  """The instruction count in callgrind's summary on `stderr`.

  Raises:
    ValueError: `stderr` has no summary, or more than one.
  """
  counts = _COLLECTED.findall(stderr)
  if len(counts) != 1:
    raise ValueError(f"expected one callgrind summary, found {len(counts)}: "
                     f"{stderr[-1000:]}")
  return int(counts[0])


def one_run(mode: str, extra: dict[str, str], clients: int, devices: int,
            valgrind: bool = True, timeout: float = 1800.0) -> list[int]:
  """Each client's instruction count (none without `valgrind`: a warm-up)."""
  prefix = (("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null")
            if valgrind else ())
  with tempfile.TemporaryDirectory(prefix="jdtensor-bench-cg-") as tmp:
    errs = [open(os.path.join(tmp, f"{c}.err"), "w+")  # pylint: disable=consider-using-with
            for c in range(clients)]
    try:
      procs = start_clients(mode, clients, devices, {**_CACHED, **UNDER_VALGRIND, **extra},
                            prefix, errs)
      outs = communicate_all(procs, timeout)
      texts = []
      for err in errs:
        err.seek(0)
        texts.append(err.read())
    finally:
      for err in errs:
        err.close()
    counts = []
    for c, (proc, out, text) in enumerate(zip(procs, outs, texts)):
      if proc.returncode != 0 or "FIRST_COLLECTIVE_AT" not in out:
        raise RuntimeError(f"{mode}: client {c} ended with {proc.returncode}: "
                           f"{out[-500:]}{text[-1500:]}")
      if valgrind:
        counts.append(collected(text))
  return counts


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--shapes", default="2x1")
  args = parser.parse_args(argv)
  if shutil.which("valgrind") is None:
    return "valgrind is not installed (`apt-get install valgrind`): nothing measured."
  shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
  for mode, extra in CONTENDERS.values():  # Fills the bytecode cache.
    one_run(mode, extra, 2, 1, valgrind=False)
  means: dict[tuple[str, tuple[int, int]], list[float]] = {}
  for _ in range(args.repeats):
    for shape in shapes:
      for name, (mode, extra) in CONTENDERS.items():
        means.setdefault((name, shape), []).append(
            statistics.mean(one_run(mode, extra, *shape)))
  lines = ["Instructions per client, every thread from start to exit (millions; "
           "mean over clients, each round; median over rounds), against raw JAX's:",
           "", "| clients x devices | contender | rounds | median | vs raw JAX | "
           "extra per client |", "|---|---|---|---:|---:|---:|"]
  for shape in shapes:
    raw = statistics.median(means[("raw JAX", shape)])
    for name in CONTENDERS:
      rounds = means[(name, shape)]
      med = statistics.median(rounds)
      lines.append(f"| {shape[0]} x {shape[1]} | {name} | "
                   f"{', '.join(f'{r / 1e6:,.0f}' for r in rounds)} | {med / 1e6:,.0f} | "
                   f"{med / raw:.3f}x | {(med - raw) / 1e6:+,.0f} M |")
  report = "\n".join(lines)
  print(report)
  return report


if __name__ == "__main__":
  main()
