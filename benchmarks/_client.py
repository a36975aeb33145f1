"""Benchmark client programs, run by the benchmark drivers under the launcher.

    python benchmarks/_client.py psum_loop SECONDS
    python benchmarks/_client.py idle SECONDS
    python benchmarks/_client.py first_collective|rss|wait_to_be_killed
"""

import os
import sys
import time



def psum_loop(seconds: float) -> None:
  """A collective-heavy step loop: psum of a small array over every device."""
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P

  import jdtensor
  from jdtensor import Layout
  jdtensor.initialize_accelerator_system("CPU")
  n = jdtensor.num_global_devices("CPU")
  mesh = jdtensor.create_distributed_mesh([("all", n)])
  x = jax.make_array_from_callback((n, 256), Layout(["all", "unsharded"], mesh)
                                   .to_jax_sharding(),
                                   lambda idx: np.ones((n, 256), np.float32)[idx])
  step = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "all") / n,
                               mesh=mesh.jax_mesh, in_specs=P("all"),
                               out_specs=P("all")))
  # Wait on every step: with dozens of cross-process CPU collectives in flight,
  # JAX 0.10.2 can deadlock (reproduced with raw JAX; see docs/guides/limits.md).
  for _ in range(50):  # Warm up: compile, gloo contexts.
    x = step(x).block_until_ready()
  jdtensor.barrier(mesh, "start", timeout_in_ms=60_000)
  steps, start, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - start < seconds:
    for _ in range(20):
      x = step(x).block_until_ready()
    steps += 20
  rate = steps / (time.perf_counter() - start)
  cpu_per_step = (time.process_time() - cpu) / steps
  jdtensor.barrier(mesh, "end", timeout_in_ms=60_000)
  print(f"STEPS_PER_S {rate:.1f}", flush=True)
  # CPU time of every thread of this process (gloo's and the heartbeat's
  # included) per step: far less disturbed by other tenants than wall time.
  print(f"CPU_US_PER_STEP {1e6 * cpu_per_step:.1f}", flush=True)
  from jdtensor import heartbeat  # pylint: disable=g-import-not-at-top
  hb = heartbeat.current()
  if hb is not None and hb.beats:
    print(f"BEAT_MS {1e3 * hb.beat_seconds / hb.beats:.3f}", flush=True)


def idle(seconds: float) -> None:
  """CPU time the runtime (and heartbeat) cost a client that does nothing."""
  import jdtensor
  from jdtensor import heartbeat
  jdtensor.initialize_accelerator_system("CPU")
  # The steady state: the heartbeat's first exchange runs on its own thread
  # after init; that start-up is measured separately (bench_heartbeat's
  # cold-start table), not as idle cost.
  if heartbeat.current() is not None:
    heartbeat.current().ready.wait(60)
  time.sleep(1.0)  # Let start-up settle.
  cpu, wall = time.process_time(), time.perf_counter()
  time.sleep(seconds)
  rate = (time.process_time() - cpu) / (time.perf_counter() - wall)
  print(f"IDLE_CPU_MS_PER_S {1e3 * rate:.2f}", flush=True)


def rss_mib() -> float:
  """This process's resident set size, MiB."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  return float("nan")


def rss() -> None:
  """Resident memory once the runtime (and the heartbeat) are up and idle."""
  first_collective(exit_after=False)
  from jdtensor import heartbeat, mesh_util  # pylint: disable=g-import-not-at-top
  hb = heartbeat.current()
  if hb is not None:
    hb.ready.wait(60)
  time.sleep(2.0)
  print(f"RSS_MIB {rss_mib():.1f}", flush=True)
  mesh_util._wait_at_barrier("bench-rss", 60_000)  # pylint: disable=protected-access
  os._exit(0)


def first_collective(exit_after: bool = True) -> None:
  """jdtensor: initialise, build a distributed mesh, one cross-client psum."""
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P

  import jdtensor
  from jdtensor import Layout, mesh_util
  jdtensor.initialize_accelerator_system("CPU")
  n = jdtensor.num_global_devices("CPU")
  mesh = jdtensor.create_distributed_mesh([("x", n)])
  x = jax.make_array_from_callback((n,), Layout(["x"], mesh).to_jax_sharding(),
                                   lambda idx: np.ones(n, np.float32)[idx])
  total = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "x"), mesh=mesh.jax_mesh,
                                in_specs=P("x"), out_specs=P()))(x)
  assert float(np.asarray(total.addressable_data(0))[0]) == n
  print(f"FIRST_COLLECTIVE_AT {time.time():.6f}", flush=True)
  if exit_after:
    mesh_util._wait_at_barrier("bench-done", 60_000)  # pylint: disable=protected-access  # Nobody exits mid-collective.
    os._exit(0)


def wait_to_be_killed() -> None:
  """jdtensor: initialise, then idle; the benchmark kills one client."""
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  print(f"READY {os.getpid()}", flush=True)
  time.sleep(600)


if __name__ == "__main__":
  {"psum_loop": lambda: psum_loop(float(sys.argv[2])),
   "idle": lambda: idle(float(sys.argv[2])),
   "first_collective": first_collective,
   "rss": rss,
   "wait_to_be_killed": wait_to_be_killed}[sys.argv[1]]()
