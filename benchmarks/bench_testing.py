"""Multi-client tests: jdtensor.testing vs a hand-written launcher run, and
a module of tests fresh, on warm clusters, and in one process.

    python -m benchmarks.bench_testing [--repeats N] [--part body|module|both]

Part 1 (``body``): both contenders run the same work, 4 clients x 2 CPU
devices doing one psum (benchmarks/_psum_body.py), from this process (which
never imports JAX):

* ``run_in_multi_client(psum_body, 4, devices_per_client=2, fresh=True)``,
  what ``@multi_client(fresh=True)`` runs;
* ``jdtensor.launcher.launch`` of ``python _psum_body.py`` (a hand-written
  client script that initialises and calls the body).

Interleaved, round after round; wall time from start to every client gone.
Target: the helper costs at most 1.2x the hand-written run.

Part 2 (``module``): pytest on benchmarks/_testing_module.py (20 small 4 x 2
tests: psums, a layout round trip, pack/unpack, a sharded matmul,
``process_allgather``), each in its own pytest process, interleaved:
``--jdtensor-clusters fresh``; warm (the default); the same bodies in one
process with 8 CPU devices; and warm with test 10 failing on client 1 while
the others wait in a collective. Wall time of the whole pytest run, and each
test's time (pytest's JUnit report). Targets: warm, at most 0.3 s a test
(median, after the first); the warm module at most 3x the one-process one;
the failing module at most one cold start (the first test's time, warm)
over the warm one, every other test passing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys

from benchmarks._paths import ROOT, with_checkout
from benchmarks import _psum_body
from benchmarks._timing import interleaved, summary
from jdtensor import launcher
from jdtensor.testing import run_in_multi_client


CLIENTS, DEVICES = 4, 2
TARGET_RATIO = 1.2


def _with_helper() -> None:
  with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(
      io.StringIO()):
    values = run_in_multi_client(_psum_body.psum_body, CLIENTS, DEVICES,
                                 timeout=120, fresh=True)
  assert values == [float(CLIENTS * DEVICES)] * CLIENTS, values


def _hand_written() -> None:
  out, err = io.StringIO(), io.StringIO()
  spec = launcher.LaunchSpec((sys.executable, _psum_body.__file__), CLIENTS,
                             DEVICES, timeout=120)
  result = launcher.launch(spec, out, err)
  assert result.exit_code == 0, err.getvalue()


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--part", choices=["body", "module", "both"], default="both")
  args = parser.parse_args(argv)
  jax_already = "jax" in sys.modules  # run_all.py imports it for its version.
  os.environ.update(with_checkout(os.environ))
  parts = []
  if args.part in ("body", "both"):
    parts.append(_body(args.repeats, jax_already))
  if args.part in ("module", "both"):
    parts.append(_module(max(1, args.repeats // 2 + 1)))
  return "\n\n".join(parts)


def _body(repeats: int, jax_already: bool) -> str:
  _hand_written()  # Warm the page cache for both.
  _with_helper()
  times = interleaved({"helper": _with_helper, "hand": _hand_written}, repeats)
  helper_min, helper_med = summary(times["helper"])
  hand_min, hand_med = summary(times["hand"])
  ratio = helper_med / hand_med
  verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
  checked = not jax_already
  assert not checked or "jax" not in sys.modules, "the parent imported jax"
  return "\n".join([
      f"{CLIENTS} clients x {DEVICES} CPU devices, one psum; {repeats} "
      "interleaved rounds (min / median wall seconds, start to every client gone).",
      "",
      "| contender | min | median |", "|---|---:|---:|",
      f"| `run_in_multi_client(psum_body, 4, 2, fresh=True)` (= `@multi_client(fresh=True)`) | "
      f"{helper_min:.2f} s | {helper_med:.2f} s |",
      f"| hand-written client script under `jdtensor.launcher.launch` | "
      f"{hand_min:.2f} s | {hand_med:.2f} s |",
      "",
      f"Ratio of medians {ratio:.2f}x: {verdict} the {TARGET_RATIO:g}x target."
      + (" The parent never imported JAX." if checked else "")])


MODULE = os.path.join(ROOT, "benchmarks", "_testing_module.py")
FAILING_TEST = 10
WARM_TEST_TARGET, MODULE_RATIO_TARGET = 0.3, 3.0
_MODULE_RUNS = {
    "fresh": ({}, ["--jdtensor-clusters", "fresh"]),
    "warm": ({}, []),
    "one process, 8 devices": ({"BENCH_TESTING_MODE": "one",
                                "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "cpu"}, []),
    "warm, test 10 failing": ({"BENCH_TESTING_FAIL": str(FAILING_TEST)}, []),
}


def _pytest_module(env: dict[str, str], extra: list[str]) -> tuple[float, dict[str, tuple[bool, float]]]:
  """(wall seconds, {test: (passed, seconds)}) of one pytest run of MODULE."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  import xml.etree.ElementTree as ET  # pylint: disable=g-import-not-at-top
  report = tempfile.mktemp(suffix=".xml", prefix="bench-testing-")
  full = {k: v for k, v in os.environ.items()
          if not k.startswith(("DTENSOR_", "JDTENSOR_", "BENCH_TESTING_"))}
  full.pop("JAX_NUM_CPU_DEVICES", None)
  full.update(env)
  started = time.perf_counter()
  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "-p", "no:randomly", f"--junitxml={report}", MODULE, *extra],
                        env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True, timeout=900, cwd=ROOT)
  wall = time.perf_counter() - started
  tests = {}
  try:
    for case in ET.parse(report).getroot().iter("testcase"):
      bad = case.find("failure") is not None or case.find("error") is not None
      tests[case.get("name")] = (not bad, float(case.get("time", "nan")))
  finally:
    if os.path.exists(report):
      os.remove(report)
  if not tests:
    raise RuntimeError(f"pytest ran nothing:\n{proc.stdout[-3000:]}")
  return wall, tests


def _module(repeats: int) -> str:
  import statistics  # pylint: disable=g-import-not-at-top
  runs = {name: [] for name in _MODULE_RUNS}
  for _ in range(repeats):
    for name, (env, extra) in _MODULE_RUNS.items():
      runs[name].append(_pytest_module(env, extra))
  rows = ["| run | module wall s (median) | first test s | later tests s (median) | "
          "tests passed |", "|---|---:|---:|---:|---:|"]
  med = {}
  for name, samples in runs.items():
    wall = statistics.median(w for w, _ in samples)
    tests = samples[len(samples) // 2][1]
    ordered = [tests[k] for k in sorted(tests)]
    later = statistics.median(t for _, t in ordered[1:])
    passed = sum(ok for ok, _ in ordered)
    med[name] = (wall, ordered[0][1], later, passed, len(ordered),
                 ordered[FAILING_TEST - 1][1])
    rows.append(f"| {name} | {wall:.2f} | {ordered[0][1]:.2f} | {later:.2f} | "
                f"{passed} of {len(ordered)} |")
  warm, one, failing = med["warm"], med["one process, 8 devices"], med["warm, test 10 failing"]
  ratio = warm[0] / one[0]
  extra = failing[0] - warm[0]
  verdicts = [
      f"warm, a test after the first: {warm[2]:.2f} s (target at most "
      f"{WARM_TEST_TARGET:g} s: {'meets' if warm[2] <= WARM_TEST_TARGET else 'MISSES'})",
      f"the warm module is {ratio:.2f}x the one-process module (target at most "
      f"{MODULE_RATIO_TARGET:g}x: {'meets' if ratio <= MODULE_RATIO_TARGET else 'MISSES'})",
      f"the failing module took {extra:+.2f} s over the warm one, one cold start "
      f"being {warm[1]:.2f} s and the failing test itself {failing[5]:.2f} s "
      f"(passing, {warm[5]:.2f} s), with {failing[3]} of {failing[4]} passing "
      f"({'meets' if extra <= warm[1] and failing[3] == failing[4] - 1 else 'MISSES'}"
      " the target: at most one cold start more, every other test passing; "
      f"{extra - (failing[5] - warm[5]):.2f} s without the failure's own report)",
      f"fresh clients cost {med['fresh'][0] / warm[0]:.1f}x the warm module"]
  return "\n".join([
      f"pytest on 20 small 4 x 2 tests (benchmarks/_testing_module.py), {repeats} "
      "interleaved rounds, medians:", "", *rows, "", *(f"- {v}" for v in verdicts)])


if __name__ == "__main__":
  print(main())
