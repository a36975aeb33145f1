"""One client of `bench_startup_cpu.py`: the same start-up written with jdtensor
or with raw JAX, printing this process's CPU time at each phase's end.

    python benchmarks/_phases_client.py raw|jdtensor

Phases: ``imports`` (jax, numpy, and jdtensor for jdtensor), ``init``
(``jax.distributed.initialize`` / ``initialize_accelerator_system``), ``first``
(a mesh over every client's devices and one cross-client psum). The exit path
is what the parent measures after the last mark (the process's whole CPU time
from `os.wait4`, minus ``first``).

At exit, after every other exit handler, it prints the CPU time of each
Python thread, by name (``THREAD name seconds``): jdtensor's threads
(heartbeat, watchdog, liveness links, helpers) are named ``jdtensor-*``, so
their share of the client's CPU is theirs alone (C++ threads they start are
not counted); the CPU of the start-up's steps (``STEP name main_thread
process``: the checks, the rendezvous, JAX's initialisation, the backend's
start, the heartbeat's start), each timed around its function; and the wall
clock of each phase's end and of each step's first call (``WALL name start
end``, for `bench_timeline.py`); how often each thread blocked (``SWITCHES
name count``: voluntary context switches) and the process's switches and page
faults at each phase's end (``RUSAGE phase voluntary involuntary faults``);
and the CPU of every OS thread alive at exit by its kernel name (``TASK
name: seconds``: gRPC's, XLA's and Python's, which are all ``python``).
"""

import atexit
import os
import resource
import sys
import threading
import time

_THREAD_CPU: dict[str, float] = {}
_THREAD_SWITCHES: dict[str, int] = {}
_STEP_CPU: dict[str, list[float]] = {}
# Wall clock (time.time) of each phase's end and of each step's first call's
# start and end, for `bench_timeline.py`.
_WALL: dict[str, tuple[float, float]] = {}
# The start-up's steps: (label, module, function), timed where they are called.
STEPS = (("checks", "jdtensor.accelerator", "_plan"),
         ("rendezvous", "jdtensor.runtime.rendezvous", "rendezvous"),
         ("wait for JAX's service", "jdtensor.runtime.rendezvous", "wait_for_service_notice"),
         ("jax.distributed.initialize", "jax.distributed", "initialize"),
         ("backend start", "jax._src.xla_bridge", "backends"),
         ("heartbeat start", "jdtensor.heartbeat", "start_with"))


def _voluntary_switches(native_id: int) -> int:
  """How often a live thread of this process gave up its CPU (blocked)."""
  try:
    with open(f"/proc/self/task/{native_id}/status") as f:
      for line in f:
        if line.startswith("voluntary_ctxt_switches:"):
          return int(line.split()[1])
  except (OSError, ValueError):
    pass
  return 0


def _record_thread_cpu() -> None:
  """Each Python thread adds its CPU time to `_THREAD_CPU` (and how often it
  blocked to `_THREAD_SWITCHES`) when it ends; at exit, the threads still
  alive are read from their CPU clocks and /proc."""
  run = threading.Thread.run

  def timed_run(self: threading.Thread) -> None:
    try:
      run(self)
    finally:
      _THREAD_CPU[self.name] = _THREAD_CPU.get(self.name, 0.0) + time.thread_time()
      switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
      _THREAD_SWITCHES[self.name] = _THREAD_SWITCHES.get(self.name, 0) + switches
  threading.Thread.run = timed_run  # type: ignore[method-assign]

  def report() -> None:
    seconds = dict(_THREAD_CPU)
    for thread in threading.enumerate():
      if thread is threading.main_thread() or thread.ident is None:
        continue
      try:
        cpu = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
      except (OSError, AttributeError):
        continue
      seconds[thread.name] = seconds.get(thread.name, 0.0) + cpu
    for name, cpu in sorted(seconds.items()):
      print(f"THREAD {name} {cpu:.4f}", flush=True)
    switches = dict(_THREAD_SWITCHES)
    for thread in threading.enumerate():
      if thread.native_id is not None:
        switches[thread.name] = (switches.get(thread.name, 0)
                                 + _voluntary_switches(thread.native_id))
    for name, count in sorted(switches.items()):
      print(f"SWITCHES {name} {count}", flush=True)
    for name, (main_cpu, process_cpu) in _STEP_CPU.items():
      print(f"STEP {name}: {main_cpu:.4f} {process_cpu:.4f}", flush=True)
    for name, (start, end) in _WALL.items():
      print(f"WALL {name}: {start:.6f} {end:.6f}", flush=True)
    for name, cpu in sorted(_task_cpu().items()):
      print(f"TASK {name}: {cpu:.4f}", flush=True)
  atexit.register(report)  # First registered, so it runs last.


def _task_cpu() -> dict[str, float]:
  """CPU seconds of every live OS thread of this process by its kernel name
  (C++ threads included: gRPC's, gloo's, XLA's), summed over the threads of
  one name (from ``schedstat``, in nanoseconds); ``(ended)`` is what threads
  that already ended used."""
  seconds: dict[str, float] = {}
  total = 0.0
  for tid in os.listdir("/proc/self/task"):
    try:
      with open(f"/proc/self/task/{tid}/comm") as f:
        name = f.read().strip()
      with open(f"/proc/self/task/{tid}/schedstat") as f:
        cpu = int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
      continue
    seconds[name] = seconds.get(name, 0.0) + cpu
    total += cpu
  seconds["(ended)"] = max(time.process_time() - total, 0.0)
  return seconds


def _time_steps(mode: str) -> None:
  """Wraps each of `STEPS` to add its main thread's and the process's CPU to
  `_STEP_CPU` (jdtensor's only in jdtensor's clients: a raw JAX client
  imports nothing of jdtensor)."""
  import importlib  # pylint: disable=g-import-not-at-top
  for label, module_name, name in STEPS:
    if module_name.startswith("jdtensor") and mode != "jdtensor":
      continue
    # A step that no longer exists fails the run rather than leave the table
    # short (tests/test_architecture.py checks them too).
    module = importlib.import_module(module_name)
    fn = getattr(module, name)

    def timed(*args, _fn=fn, _label=label, **kwargs):
      main, process, wall = time.thread_time(), time.process_time(), time.time()
      try:
        return _fn(*args, **kwargs)
      finally:
        _WALL.setdefault(_label, (wall, time.time()))
        totals = _STEP_CPU.setdefault(_label, [0.0, 0.0])
        totals[0] += time.thread_time() - main
        totals[1] += time.process_time() - process
    setattr(module, name, timed)


def mark(phase: str) -> None:
  # CPU time of every thread of this process so far, and how often its
  # threads blocked (voluntary) or were preempted (involuntary).
  print(f"PHASE {phase} {time.process_time():.4f}", flush=True)
  usage = resource.getrusage(resource.RUSAGE_SELF)
  print(f"RUSAGE {phase} {usage.ru_nvcsw} {usage.ru_nivcsw} {usage.ru_minflt}",
        flush=True)
  _WALL["phase " + phase] = (time.time(), time.time())


def main(mode: str) -> None:
  _WALL["phase start"] = (time.time(), time.time())
  _record_thread_cpu()
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P
  if mode == "jdtensor":
    import jdtensor
  mark("imports")
  _time_steps(mode)  # After the mark: its imports are jdtensor's init's own.
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
  main(sys.argv[1])
