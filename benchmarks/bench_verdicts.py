"""Detection latency of the heartbeat's verdicts in the shapes users run.

    python -m benchmarks.bench_verdicts [--repeats N]

4 clients under `jdtensor launch`, heartbeat period 0.5 s, 1 and 2 CPU
devices per client, the result kept in a variable or read as a temporary
(tests/multiprocess/clients/waiting_client.py). For each case: seconds from the
misbehaviour (``MISBEHAVING`` on the client) to the launcher's return, the
client the launcher names first, and the launcher's exit code. Medians of
interleaved repetitions.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

from benchmarks._paths import ROOT
from tests.helpers import launch_clients


CLIENT = os.path.join(ROOT, "tests", "multiprocess", "clients", "waiting_client.py")
# name -> (scenario, misbehaving client, bound the row promises, extra env)
CASES = {
    "stall (kept), stall time-out 4 s": ("stall", 2, "4 s + 2 periods",
                                         {"READ": "kept", "JDTENSOR_STALL_TIMEOUT": "4"}),
    "stall (temporary), stall time-out 4 s": (
        "stall", 2, "4 s + 2 periods",
        {"READ": "temporary", "JDTENSOR_STALL_TIMEOUT": "4"}),
    "sys.exit(0) early (kept)": ("exit0", 1, "max(3 s, 2 periods)", {"READ": "kept"}),
    "sys.exit(0) early (temporary)": ("exit0", 1, "max(3 s, 2 periods)",
                                      {"READ": "temporary"}),
    "first collective 40 s late": ("late_first", 3, "JAX's 30 s (not configurable)",
                                   {"LATE": "40", "JDTENSOR_STALL_TIMEOUT": "4"}),
    "final save 12 s after the others (run ends 0)": (
        "late_end", 0, "its own 12 s", {"LATE": "12", "JDTENSOR_SHUTDOWN_TIMEOUT": "4"}),
}


def one(scen: str, bad: int, devices: int, env: dict[str, str]) -> tuple[float, object, int]:
  res, out, err, ended = launch_clients(
      [sys.executable, CLIENT], 4, devices, timeout=120, SCENARIO=scen, CULPRIT=str(bad),
      JDTENSOR_HEARTBEAT_PERIOD="0.5", **env)
  stamp = re.search(rf"^\[client {bad}\] MISBEHAVING ([\d.]+)$", out, re.M)
  if stamp is None:
    raise RuntimeError(f"{scen}: client {bad} never misbehaved:\n{err[-2000:]}")
  after = ended - (time.monotonic() - (time.time() - float(stamp.group(1))))
  return after, res.first_failure, res.exit_code


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)
  rows = ["| case | devices per client | seconds to the end (median) | named first "
          "| launcher exit | the row's bound |", "|---|---:|---:|---|---:|---|"]
  for name, (scen, bad, bound, env) in CASES.items():
    for devices in (1, 2):
      runs = [one(scen, bad, devices, env) for _ in range(args.repeats)]
      named = sorted({"nobody" if r[1] is None else f"client {r[1]}" for r in runs})
      codes = sorted({r[2] for r in runs})
      rows.append(f"| {name} | {devices} | {statistics.median(r[0] for r in runs):.1f} "
                  f"| {', '.join(named)} | {', '.join(map(str, codes))} | {bound} |")
  text = "\n".join(rows)
  print(text)
  return text


if __name__ == "__main__":
  main()
