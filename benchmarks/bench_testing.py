"""A multi-client test body: jdtensor.testing vs a hand-written launcher run.

    python benchmarks/bench_testing.py [--repeats N]

Both contenders run the same work, 4 clients x 2 CPU devices doing one psum
(benchmarks/_psum_body.py), from this process (which never imports JAX):

* ``run_in_multi_client(psum_body, 4, devices_per_client=2)``, what
  ``@multi_client`` and ``@pytest.mark.multi_client`` run;
* ``jdtensor.launcher.launch`` of ``python _psum_body.py`` (a hand-written
  client script that initialises and calls the body).

Interleaved, round after round; wall time from start to every client gone.
Target: the helper costs at most 1.2x the hand-written run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _psum_body  # noqa: E402
from benchmarks._timing import interleaved, summary  # noqa: E402
from jdtensor import launcher  # noqa: E402
from jdtensor.testing import run_in_multi_client  # noqa: E402

CLIENTS, DEVICES = 4, 2
TARGET_RATIO = 1.2


def _with_helper() -> None:
  with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(
      io.StringIO()):
    values = run_in_multi_client(_psum_body.psum_body, CLIENTS, DEVICES,
                                 timeout=120)
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
  args = parser.parse_args(argv)
  jax_already = "jax" in sys.modules  # run_all.py imports it for its version.
  os.environ["PYTHONPATH"] = os.pathsep.join(
      [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
  _hand_written()  # Warm the page cache for both.
  _with_helper()
  times = interleaved({"helper": _with_helper, "hand": _hand_written}, args.repeats)
  helper_min, helper_med = summary(times["helper"])
  hand_min, hand_med = summary(times["hand"])
  ratio = helper_med / hand_med
  verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
  checked = not jax_already
  assert not checked or "jax" not in sys.modules, "the parent imported jax"
  return "\n".join([
      f"{CLIENTS} clients x {DEVICES} CPU devices, one psum; {args.repeats} "
      "interleaved rounds (min / median wall seconds, start to every client gone).",
      "",
      "| contender | min | median |", "|---|---:|---:|",
      f"| `run_in_multi_client(psum_body, 4, 2)` (= `@multi_client`) | "
      f"{helper_min:.2f} s | {helper_med:.2f} s |",
      f"| hand-written client script under `jdtensor.launcher.launch` | "
      f"{hand_min:.2f} s | {hand_med:.2f} s |",
      "",
      f"Ratio of medians {ratio:.2f}x: {verdict} the {TARGET_RATIO:g}x target."
      + (" The parent never imported JAX." if checked else "")])


if __name__ == "__main__":
  print(main())
