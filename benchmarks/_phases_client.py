"""One client of `bench_startup_cpu.py`: the same start-up written with jdtensor
or with raw JAX, printing this process's CPU time at each phase's end.

    python benchmarks/_phases_client.py raw|jdtensor

Phases: ``imports`` (jax, numpy, and jdtensor for jdtensor), ``init``
(``jax.distributed.initialize`` / ``initialize_accelerator_system``), ``first``
(a mesh over every client's devices and one cross-client psum). The exit path
is what the parent measures after the last mark (the process's whole CPU time
from `os.wait4`, minus ``first``).

At exit, after every other exit handler, it prints the CPU time of each
Python thread that ended, by name (``THREAD name seconds``): jdtensor's
threads (heartbeat, watchdog, liveness links, helpers) are named
``jdtensor-*``, so their share of the client's CPU is theirs alone (C++
threads they start are not counted).
"""

import atexit
import os
import sys
import threading
import time

_THREAD_CPU: dict[str, float] = {}


def _record_thread_cpu() -> None:
  """Each Python thread adds its CPU time to `_THREAD_CPU` when it ends."""
  run = threading.Thread.run

  def timed_run(self: threading.Thread) -> None:
    try:
      run(self)
    finally:
      _THREAD_CPU[self.name] = _THREAD_CPU.get(self.name, 0.0) + time.thread_time()
  threading.Thread.run = timed_run  # type: ignore[method-assign]

  def report() -> None:
    for name, seconds in sorted(_THREAD_CPU.items()):
      print(f"THREAD {name} {seconds:.4f}", flush=True)
  atexit.register(report)  # First registered, so it runs last.


def mark(phase: str) -> None:
  # CPU time of every thread of this process so far.
  print(f"PHASE {phase} {time.process_time():.4f}", flush=True)


def main(mode: str) -> None:
  _record_thread_cpu()
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P
  if mode == "jdtensor":
    import jdtensor
  mark("imports")
  if mode == "jdtensor":
    jdtensor.initialize_accelerator_system("CPU")
    mesh = jdtensor.create_distributed_mesh([("x", jdtensor.num_global_devices("CPU"))])
    jax_mesh = mesh.jax_mesh
  else:
    jobs = os.environ["DTENSOR_JOBS"].split(",")
    jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))
    jax.distributed.initialize(coordinator_address=jobs[0], num_processes=len(jobs),
                               process_id=int(os.environ["DTENSOR_CLIENT_ID"]))
    jax_mesh = None
  mark("init")
  if jax_mesh is None:
    jax_mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
  n = jax_mesh.size
  x = jax.make_array_from_callback((n,), NamedSharding(jax_mesh, P("x")),
                                   lambda idx: np.ones(n, np.float32)[idx])
  total = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "x"), mesh=jax_mesh,
                                in_specs=P("x"), out_specs=P()))(x)
  assert float(np.asarray(total.addressable_data(0))[0]) == n
  mark("first")
  print(f"FIRST_COLLECTIVE_AT {time.time():.6f}", flush=True)  # For bench_scaling.


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  main(sys.argv[1])
