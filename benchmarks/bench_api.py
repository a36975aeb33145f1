"""The DTensor API on repeated calls: jdtensor vs the plain JAX it wraps.

    python -m benchmarks.bench_api [--repeats N] [--calls N]

On 8 simulated CPU devices (a child process, so the device count is set before
JAX starts), times repeated calls of `relayout`, `relayout_like`,
`call_with_layout`, `pack`, `unpack` and `fetch_layout` against the plain JAX
each one stands for: `jax.device_put` to the same sharding, a cached
`jax.jit` with `out_shardings`, `jax.make_array_from_single_device_arrays`,
`addressable_shards`, `.sharding`. Calls are interleaved round by round in one
process. Target: at most 2x plain JAX on repeated calls.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


DEVICES = 8
TARGET_RATIO = 2.0


def _cases(jax, jnp, jdt):
  """(label, targeted, jdtensor call, plain JAX call), each checked to agree.

  `targeted` marks the calls the 2x target is for (they move or compute
  data); the others are bookkeeping of a few microseconds, shown for context.
  """
  mesh = jdt.create_mesh([("x", 4), ("y", 2)], device_type="CPU")
  rows = jdt.Layout(["x", jdt.UNSHARDED], mesh)
  cols = jdt.Layout([jdt.UNSHARDED, "y"], mesh)
  rows_sharding, cols_sharding = rows.to_jax_sharding(), cols.to_jax_sharding()
  host = jnp.arange(1024 * 256, dtype=jnp.float32).reshape(1024, 256)
  x = jax.device_put(host, rows_sharding)
  like = jdt.relayout(jnp.zeros((8, 8)), cols)

  def fn(a):
    return jnp.tanh(a) * 2.0 + 1.0

  plain_jit = jax.jit(fn, out_shardings=cols_sharding)
  shards = jdt.unpack(x)
  devices = [s.device for s in x.addressable_shards]
  shards_by_device = [s.data for s in x.addressable_shards]
  return [
      ("relayout (rows -> cols)", True, lambda: jdt.relayout(x, cols),
       lambda: jax.device_put(x, cols_sharding)),
      ("relayout_like", True, lambda: jdt.relayout_like(x, like),
       lambda: jax.device_put(x, like.sharding)),
      ("call_with_layout(fn, layout, x)", True, lambda: jdt.call_with_layout(fn, cols, x),
       lambda: plain_jit(x)),
      ("pack (8 shards)", False, lambda: jdt.pack(shards, rows),
       lambda: jax.make_array_from_single_device_arrays(
           x.shape, rows_sharding, shards_by_device)),
      ("unpack", False, lambda: jdt.unpack(x),
       lambda: [s.data for s in sorted(x.addressable_shards,
                                       key=lambda s: devices.index(s.device))]),
      ("fetch_layout", False, lambda: jdt.fetch_layout(x), lambda: x.sharding),
  ]


def _child(repeats: int, calls: int) -> str:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  import jdtensor as jdt  # pylint: disable=g-import-not-at-top
  from benchmarks._timing import interleaved, summary  # pylint: disable=g-import-not-at-top

  assert jax.device_count() == DEVICES, jax.devices()

  def ready(out):
    jax.block_until_ready(out)
    return out

  lines = [f"{DEVICES} CPU devices, mean per call over {calls} calls, median of "
           f"{repeats} interleaved rounds (first call, compiling, excluded).", "",
           "| call | jdtensor | plain JAX | ratio |", "|---|---:|---:|---:|"]
  worst = 0.0
  for label, targeted, ours, theirs in _cases(jax, jnp, jdt):
    a, b = ready(ours()), ready(theirs())  # Warm up: compile once, then agree.
    if isinstance(a, list):
      assert all(np.array_equal(u, v) for u, v in zip(a, b)), label
    elif hasattr(a, "sharding"):
      assert a.sharding == b.sharding and np.array_equal(a, b), label

    def loop(call):
      return lambda: [ready(call()) for _ in range(calls)]
    times = interleaved({"ours": loop(ours), "plain": loop(theirs)}, repeats)
    ours_s, plain_s = summary(times["ours"])[1] / calls, summary(times["plain"])[1] / calls
    ratio = ours_s / plain_s
    worst = max(worst, ratio) if targeted else worst
    lines.append(f"| `{label}`{'' if targeted else ' (context)'} | {ours_s * 1e6:,.1f} µs | {plain_s * 1e6:,.1f} µs | "
                 f"{ratio:.2f}x |")
  verdict = "meets" if worst <= TARGET_RATIO else "MISSES"
  lines += ["", f"Worst ratio of relayout, relayout_like and call_with_layout: "
            f"{worst:.2f}x; {verdict} the {TARGET_RATIO:g}x target. pack checks "
            "each component's shape, dtype and device; unpack and fetch_layout "
            "look up the recorded layout: a few microseconds each."]
  return "\n".join(lines)


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--calls", type=int, default=200)
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    return _child(args.repeats, args.calls)
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(DEVICES))
  env.pop("DTENSOR_JOBS", None)
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--child", "--repeats",
       str(args.repeats), "--calls", str(args.calls)],
      env=env, capture_output=True, text=True, timeout=900)
  if proc.returncode != 0:
    raise RuntimeError(f"bench_api child failed ({proc.returncode}):\n"
                       f"{proc.stderr[-4000:]}")
  return proc.stdout.strip()


if __name__ == "__main__":
  print(main())
