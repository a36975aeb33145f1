"""Runs every benchmark and writes benchmarks/RESULTS.md.

    python -m benchmarks.run_all [--repeats N] [--only SECTION,...]

(from the checkout's root, as every benchmark: ``python -m benchmarks.<name>``).
``--only`` reruns the named sections (startup, startup_cpu, instructions,
scaling, ring, heartbeat, api, testing, verdicts, hang, trace, faults) and keeps the
others as they are in RESULTS.md, each with the date it was made; a section
of a standalone benchmark (`STANDALONE`) is kept as it is.

Every figure is measured side by side with its baseline in the same run
(this machine is shared and noisy): compare the ratios; absolute times are
context only.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys

from benchmarks import (bench_api, bench_heartbeat, bench_instructions, bench_ring,
                        bench_scaling, bench_startup, bench_startup_cpu,
                        bench_hang_triage, bench_testing, bench_trace, bench_verdicts)
from benchmarks._timing import machine


def fault_suite() -> str:
  """Runs `pytest -m faults` and reports cases tried / passed."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "faults",
                         "tests/faults", "-p", "no:cacheprovider"], cwd=root,
                        capture_output=True, text=True, timeout=1800)
  tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
  passed = int((re.search(r"(\d+) passed", tail) or [0, 0])[1])
  failed = int((re.search(r"(\d+) failed", tail) or [0, 0])[1])
  return (f"`python -m pytest -m faults`: **{passed + failed} cases tried, "
          f"{passed} passed**, {failed} failed ({tail}).")


SECTIONS = {  # key -> (title, intro)
    "startup": ("Start-up and failure detection",
                "`python -m benchmarks.bench_startup`. Targets: cold start within "
                "15% of raw JAX and at least 3x faster than TF DTensor; "
                "dead-client detection within 5 s."),
    "startup_cpu": ("Start-up CPU by phase",
                    "`python -m benchmarks.bench_startup_cpu`: where a client's "
                    "start-up CPU goes (imports, init, mesh + first psum, exit), "
                    "jdtensor with and without its heartbeat against raw JAX, "
                    "clients started by hand."),
    "instructions": ("Start-up in instructions",
                     "`python -m benchmarks.bench_instructions`: each client's "
                     "instructions under valgrind's callgrind, raw JAX vs jdtensor "
                     "(heartbeat on and off), every module's bytecode from one "
                     "cache: a CPU figure far steadier than CPU seconds (the "
                     "1.05x target); run it on an otherwise idle machine."),
    "scaling": ("Start-up scaling, 2 to 32 clients",
                "`python -m benchmarks.bench_scaling`: cold start (raw JAX, "
                "jdtensor as installed and from source, `jdtensor launch`, TF "
                "DTensor where installed) and dead-client detection at 2, 4, 8, 16 "
                "and 32 clients x 1 CPU device. Targets: jdtensor's CPU "
                "per client within 1.05x raw JAX's, and its wall at or below raw "
                "JAX's, at every count, heartbeat on."),
    "ring": ("TPU ring orders and mesh strings at scale",
             "`jdtensor.tpu.ring_order` vs DTensor's pure-Python ring algorithm "
             "(same results asserted before timing), interleaved in one process."),
    "heartbeat": ("Heartbeat overhead",
                  "`python -m benchmarks.bench_heartbeat`: the heartbeat's "
                  "start-up and memory (heartbeat on vs off vs raw JAX), then "
                  "heartbeat off, period 1 s and 0.1 s, interleaved runs under "
                  "`jdtensor launch`. Targets: at most +0.1 s cold start, +30 MiB "
                  "per client, 0.5% of a core at period 1 s."),
    "api": ("DTensor API on repeated calls",
            "`python -m benchmarks.bench_api`: relayout, relayout_like, "
            "call_with_layout, pack, unpack and fetch_layout against the plain "
            "JAX each stands for, interleaved in one process. Target: at most 2x "
            "plain JAX on repeated calls (each compiles once)."),
    "testing": ("A multi-client test with jdtensor.testing",
                "`python -m benchmarks.bench_testing`: a 4 x 2 test body doing "
                "one psum through `run_in_multi_client` (what `@multi_client` "
                "runs) vs the same body as a hand-written client script under "
                "the launcher, interleaved. Target: at most 1.2x."),
    "verdicts": ("Heartbeat verdicts in the shapes users run",
                 "`python -m benchmarks.bench_verdicts`: 4 clients, period 0.5 s, "
                 "1 and 2 devices per client, results kept or read as temporaries "
                 "(the waiting rows); seconds from the misbehaviour to the end."),
    "hang": ("Hang triage: the learnt stall time-out, and the pauses never named",
             "`python -m benchmarks.bench_hang_triage --baseline`: the heartbeat's "
             "defaults (period 2 s, floor 60 s, JDTENSOR_STALL_TIMEOUT 300 s), "
             "1 CPU device per client, a loop of 1 s steps (an idle data load, "
             "then a psum or a coordination-service barrier); client 1 "
             "misbehaves 40 s in (or, in the set-up case, right after a "
             "barrier). Seconds from the misbehaviour to the launcher's "
             "return; one run each (the bound is the figure)."),
    "trace": ("The run's trace: its cost and size",
              "`python -m benchmarks.bench_trace`: `jdtensor launch --trace` on "
              "a 1 ms step loop, trace on and off alternating. Target: at most "
              "2% fewer steps."),
    "faults": ("Fault and bad-input suite",
               "Each case runs in fresh processes with a hard deadline and "
               "asserts a clear error, a bounded time and no leftover process."),
}


# The benchmarks run_all does not run, each with the reason; their sections in
# RESULTS.md are written from their own output and kept as they are.
STANDALONE = {
    "bench_timeline": "a diagnosis of the start-up's critical path, not a figure "
                      "with a target",
    "bench_idle": "a diagnosis of where a 32-client cold start idles",
    "bench_meeting_watch": "a check that the service-wait watch costs nothing, "
                           "made once when it was written",
    "bench_pod_scale": "hundreds to thousands of clients: sized to the machine "
                       "by hand (--clients, --processes)",
    "bench_hub_beat": "client 0's beat at thousands of clients, sized by hand",
    "bench_recovery": "restarts with a 5 s compile each, and orbax where "
                      "installed (about 10 min)",
    "gpu_check": "needs a GPU machine (the device tool's one prepared script)",
}


def _existing_sections(path: str) -> dict[str, str]:
  """Section title -> its body, from the current RESULTS.md."""
  try:
    text = open(path).read()
  except OSError:
    return {}
  parts = re.split(r"^## (.+)$", text, flags=re.M)
  return {title.strip(): body.strip("\n") for title, body in
          zip(parts[1::2], parts[2::2])}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--skip-raw-detection", action="store_true",
                      help="skip raw JAX's ~100 s dead-client detection")
  parser.add_argument("--only", default=",".join(SECTIONS),
                      help="comma-separated sections to rerun: "
                      + ", ".join(SECTIONS))
  args = parser.parse_args(argv)
  only = [k.strip() for k in args.only.split(",") if k.strip()]
  unknown = [k for k in only if k not in SECTIONS]
  if unknown:
    parser.error(f"--only: unknown section(s) {unknown}; choose from "
                 f"{', '.join(SECTIONS)}")
  import jax  # pylint: disable=g-import-not-at-top
  startup_args = ["--repeats", str(args.repeats)] + (
      ["--skip-raw-detection"] if args.skip_raw_detection else [])
  runners = {
      "startup": lambda: bench_startup.main(startup_args),
      "startup_cpu": lambda: bench_startup_cpu.main(["--repeats", str(min(args.repeats, 3))]),
      "instructions": lambda: bench_instructions.main(
          ["--repeats", str(min(args.repeats, 2)), "--shapes", "2x1,4x1"]),
      "scaling": lambda: bench_scaling.main(["--repeats", str(min(args.repeats, 3))]),
      "ring": lambda: bench_ring.main(["--repeats", str(args.repeats)]),
      "heartbeat": lambda: bench_heartbeat.main(["--repeats", str(args.repeats)]),
      "api": lambda: bench_api.main(["--repeats", str(args.repeats)]),
      # Start-to-end times are bimodal (a short body can end before the
      # heartbeat's first exchange); more rounds for a median.
      "testing": lambda: bench_testing.main(["--repeats", str(max(args.repeats, 11))]),
      "verdicts": lambda: bench_verdicts.main(["--repeats", str(min(args.repeats, 3))]),
      "hang": lambda: bench_hang_triage.main(["--baseline"]),
      "trace": lambda: bench_trace.main(["--repeats", str(min(args.repeats, 5))]),
      "faults": fault_suite,
  }
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
  old = _existing_sections(path)
  today = datetime.date.today().isoformat()
  sections = [
      "# jdtensor benchmark results",
      "",
      "Generated by `python -m benchmarks.run_all`; each section says when and "
      "with which command it was last measured.",
      "",
      f"Machine: {machine()}; jax {jax.__version__}; {platform.platform()}.",
      "Every figure is measured side by side with its baseline in the same run "
      "(this machine is shared and noisy): compare the ratios; absolute times "
      "are context only. Medians of interleaved repetitions unless stated.",
  ]
  fresh = {title: key for key, (title, _) in SECTIONS.items()
           if key in only or title not in old}
  # Every section in the order RESULTS.md has it (a standalone benchmark's
  # too), the ones never measured before at the end.
  for title in [*old, *(t for t, _ in SECTIONS.values() if t not in old)]:
    if title in fresh:
      key = fresh[title]
      body = (f"Measured on {today} by `python -m benchmarks.run_all --repeats "
              f"{args.repeats} --only {key}`.\n\n{SECTIONS[key][1]}\n\n{runners[key]()}")
    else:
      body = old[title]
    sections += ["", f"## {title}", "", body]
  with open(path, "w") as f:
    f.write("\n".join(sections) + "\n")
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
