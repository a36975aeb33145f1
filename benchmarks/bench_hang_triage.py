"""Hang triage at the heartbeat's defaults: how soon a stall is named under
the learnt time-out, against the set one (learning off); and the healthy
pauses that must never be named: a rare long load, a slow set-up after a
barrier, a one-off upload or slow write.

    python -m benchmarks.bench_hang_triage [--clients 4,32] [--baseline]

Clients under `jdtensor launch` (tests/multiprocess/clients/hang_client.py), one CPU
device each, the heartbeat's defaults (period 2 s, floor 60 s,
JDTENSOR_STALL_TIMEOUT 300 s): a loop of 1 s steps, each an idle data load
and a meeting (a psum over every device, or a coordination-service barrier).
After 40 s (past the rhythm's 10 beats), client 1 stalls in its data loader,
or loads one batch for 20 s (rare, far above the 1 s step, below the floor),
or uploads for 75 s to a server that takes 64 KiB/s, or writes a file in
4 KiB pieces for 75 s; or, right after a barrier, it spends 75 s idle before
the first step. Seconds from the misbehaviour to the launcher's return.
``--baseline`` adds the same stall with learning off
(JDTENSOR_STALL_LEARN=false: 300 s by design).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

from benchmarks._paths import ROOT
from tests.helpers import TrickleServer, launch_clients


CLIENT = os.path.join(ROOT, "tests", "multiprocess", "clients", "hang_client.py")
DEFAULTS = {"JDTENSOR_HEARTBEAT_PERIOD": "2", "JDTENSOR_STUCK_TIMEOUT": "60",
            "JDTENSOR_COORDINATION_TIMEOUT": "100", "JDTENSOR_INIT_TIMEOUT": "300",
            "STEP_SECONDS": "1", "MISBEHAVE_AFTER": "40"}


def one(n: int, **env: str) -> tuple[float | None, str, int]:
  res, out, err, ended = launch_clients([sys.executable, CLIENT], n, 1, timeout=600,
                                        **{**DEFAULTS, **env})
  stamp = re.search(r"^\[client 1\] MISBEHAVING ([\d.]+)", out, re.M)
  after = (None if stamp is None else
           ended - (time.monotonic() - (time.time() - float(stamp.group(1)))))
  named = (f"client {res.first_failure}" if res.first_failure is not None else "nobody")
  return after, named, res.exit_code


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", default="4,32")
  parser.add_argument("--baseline", action="store_true")
  args = parser.parse_args(argv)
  sizes = [int(c) for c in args.clients.split(",")]
  cases = []
  for n in sizes:
    cases.append((n, "stall, psum loop, learnt (default)",
                  {"SCENARIO": "stall", "SYNC": "psum"}, "60 s + 2 periods"))
    if args.baseline and n == sizes[0]:
      cases.append((n, "stall, psum loop, learning off",
                    {"SCENARIO": "stall", "SYNC": "psum", "JDTENSOR_STALL_LEARN": "false"},
                    "300 s + 2 periods"))
  n = sizes[0]
  cases.append((n, "stall, barrier loop (no collective), learnt",
                {"SCENARIO": "stall", "SYNC": "barrier"}, "60 s + 2 periods"))
  cases.append((n, "one 20 s idle load, psum loop (run ends 0)",
                {"SCENARIO": "load", "SYNC": "psum", "LOAD_SECONDS": "20", "STEPS": "75"},
                "never named"))
  cases.append((n, "75 s idle set-up after a barrier (run ends 0)",
                {"SCENARIO": "setup", "LOAD_SECONDS": "75", "STEPS": "10"},
                "never named"))
  cases.append((n, "one 75 s upload at 64 KiB/s, psum loop (run ends 0)",
                {"SCENARIO": "upload", "LOAD_SECONDS": "75", "STEPS": "55"},
                "never named"))
  cases.append((n, "one 75 s file write in 4 KiB pieces, psum loop (run ends 0)",
                {"SCENARIO": "write", "LOAD_SECONDS": "75", "STEPS": "55"},
                "never named"))
  rows = ["| clients | case | seconds to the end | named first | launcher exit | bound |",
          "|---:|---|---:|---|---:|---|"]
  seconds = {}
  server = TrickleServer()
  try:
    results = [(n, name, bound, one(n, UPLOAD_PORT=str(server.port), **env))
               for n, name, env, bound in cases]
  finally:
    server.close()
  for n, name, bound, (after, named, code) in results:
    seconds[(n, name)] = after
    shown = "-" if after is None else f"{after:.1f}"
    rows.append(f"| {n} | {name} | {shown} | {named} | {code} | {bound} |")
    print(rows[-1], flush=True)
  learnt = seconds.get((sizes[0], "stall, psum loop, learnt (default)"))
  off = seconds.get((sizes[0], "stall, psum loop, learning off"))
  if learnt and off:
    rows += ["", f"With learning on, the stall is named {off / learnt:.0f}x sooner "
             f"than with the set time-out ({learnt:.1f} s against {off:.1f} s, "
             f"{sizes[0]} clients): the steady loop's longest idle pause was short, "
             "so the learnt time-out sits at its 60 s floor."]
  return "\n".join(rows)


if __name__ == "__main__":
  print(main())
