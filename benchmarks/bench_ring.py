"""TPU ring orders and mesh construction at scale: jdtensor vs DTensor's Python.

    python -m benchmarks.bench_ring [--repeats N]

Compares `jdtensor.tpu.ring_order` (numpy) with DTensor's own pure-Python
algorithm (enumeration + cmp_to_key ring sort), run side by side in one
process. DTensor's algorithm is taken from TensorFlow when it is importable;
otherwise from `tests/dtensor_ring_reference.py`, its literal port (TensorFlow
is never a dependency). Also times Mesh construction and string round trips.
"""

from __future__ import annotations

import argparse
import math

import numpy as np


from benchmarks._timing import interleaved, machine, summary
from jdtensor import Mesh
from jdtensor.tpu import ring

TOPOLOGIES = [[8, 8, 8, 2], [16, 16, 8, 2], [16, 16, 16, 2], [16, 16, 32, 2]]


def dtensor_functions():
  """DTensor's (enumerate, ring, orthogonal) functions and where they come from."""
  try:
    from tensorflow.dtensor.python import tpu_util  # pylint: disable=g-import-not-at-top
    return (tpu_util._enumerate_core_locations, tpu_util._build_all_reduce_ring,  # pylint: disable=protected-access
            tpu_util._build_orthogonal_rings, "TensorFlow")  # pylint: disable=protected-access
  except ImportError:
    from tests import dtensor_ring_reference as port  # pylint: disable=g-import-not-at-top
    return (port.enumerate_core_locations, port.build_all_reduce_ring,
            port.build_orthogonal_rings, "literal port (TensorFlow not installed)")


CASES = [  # (label, mesh shape from core count, ring_dims, ring_axes, orthogonal)
    ("ring over last dim", lambda n: [2, n // 2], None, None, False),
    ("orthogonal rings", lambda n: [16, n // 16], None, None, True),
    ("one ring, z fastest", lambda n: [n], 1, ["z", "y", "x", "core"], False),
]


def dtensor_ring_order(topology, mesh_shape, ring_dims, axes, orthogonal, fns):
  enumerate_fn, ring_fn, orthogonal_fn, _ = fns
  ring_size = (math.prod(mesh_shape[:ring_dims]) if ring_dims else
               math.prod(mesh_shape[1:]))
  locs = enumerate_fn(topology, topology, axes or ["core", "x", "y", "z"], True,
                      ring_size)
  if orthogonal:
    return orthogonal_fn(locs, ring_size, False)
  perm = ring_fn(locs[:ring_size])
  return [locs[r + perm[i]] for r in range(0, len(locs), ring_size)
          for i in range(ring_size)]


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)
  fns = dtensor_functions()
  lines = [f"Machine: {machine()}", f"DTensor baseline: {fns[3]}", "",
           "| cores | mesh | case | jdtensor min / median (ms) | DTensor min / median (ms) | speed-up (median) |",
           "|---:|---|---|---:|---:|---:|"]
  for topology in TOPOLOGIES:
    n = math.prod(topology)
    for label, shape_of, ring_dims, axes, orthogonal in CASES:
      mesh_shape = shape_of(n)
      ours_fn = lambda: ring.ring_order(  # noqa: E731
          topology, mesh_shape, ring_dims=ring_dims, ring_axes=axes,
          build_ring_across_rings=orthogonal)
      theirs_fn = lambda: dtensor_ring_order(  # noqa: E731
          topology, mesh_shape, ring_dims, axes, orthogonal, fns)
      # Same answer first, then time.
      assert ours_fn() == [tuple(l) for l in theirs_fn()], "results disagree"
      times = interleaved({"jdtensor": ours_fn, "dtensor": theirs_fn},
                          args.repeats)
      (jmin, jmed), (dmin, dmed) = summary(times["jdtensor"]), summary(times["dtensor"])
      lines.append(f"| {n} | {'x'.join(map(str, mesh_shape))} | {label} | "
                   f"{jmin * 1e3:.1f} / {jmed * 1e3:.1f} | {dmin * 1e3:.1f} / "
                   f"{dmed * 1e3:.1f} | {dmed / jmed:.1f}x |")
  lines += ["", "| devices | Mesh(...) min / median (ms) | to_string (ms) | "
            "from_string (ms) | create_distributed_mesh (ms) |",
            "|---:|---:|---:|---:|---:|"]
  import jdtensor  # pylint: disable=g-import-not-at-top
  if not jdtensor.is_initialized():
    jdtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=8)
  for n in (1024, 4096, 16384):
    devices = [f"/job:worker/replica:0/task:0/device:TPU:{i}" for i in range(8)]
    ids = np.arange(n).reshape(2, n // 2)
    build = lambda: Mesh(["batch", "model"], ids, list(range(8)), devices)  # noqa: E731
    mesh = build()
    text = mesh.to_string()
    # This client's 8 devices in a mesh of n: the seed's keyword form lets one
    # process build client 0's view of an n-device cluster.
    distributed = lambda: jdtensor.create_distributed_mesh(  # noqa: E731
        [("batch", 2), ("model", n // 2)], num_global_devices=n,
        num_clients=n // 8, client_id=0)
    times = interleaved({"build": build, "to": mesh.to_string,
                         "from": lambda: Mesh.from_string(text),
                         "distributed": distributed}, args.repeats)
    b, t, f, d = (summary(times[k]) for k in ("build", "to", "from", "distributed"))
    lines.append(f"| {n} | {b[0] * 1e3:.2f} / {b[1] * 1e3:.2f} | "
                 f"{t[1] * 1e3:.2f} | {f[1] * 1e3:.2f} | {d[1] * 1e3:.2f} |")
  report = "\n".join(lines)
  print(report)
  return report


if __name__ == "__main__":
  main()
