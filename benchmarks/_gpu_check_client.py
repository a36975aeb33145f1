"""One client of benchmarks/gpu_check.py: SCENARIO picks what client CULPRIT does.

    SCENARIO=api|none|kill|raise|stall|busy  DEVICE=GPU|CPU  WAIT_ON=GPU|CPU
    CULPRIT=1  STEPS=8  BUSY_SECONDS=12

``api`` is one client on its own (no DTENSOR_*): the single-client API on
DEVICE. The others are multi-client: every client runs STEPS steps of a psum
over every client's WAIT_ON devices (the GPUs, each client its own; the CPU
where clients share one GPU, which NCCL cannot) and checks the result. At
step 3, client CULPRIT misbehaves and prints ``MISBEHAVING <unix time>`` first:
kill (SIGKILL of itself), raise (an exception), stall (sleeps in its own code
while the others wait in the psum), busy (one long kernel on its own
devices, at least BUSY_SECONDS s: slow, never a stall).
"""

import os
import signal
import sys
import time

started = time.perf_counter()
import jdtensor  # noqa: E402

scen, device = os.environ.get("SCENARIO", "none"), os.environ.get("DEVICE", "GPU")
initialized = jdtensor.initialize_accelerator_system(device)
init_seconds = time.perf_counter() - started

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from benchmarks._busy import one_long_call  # noqa: E402


def api() -> None:
  """The single-client API on DEVICE: mesh, layouts, pack/unpack, relayout."""
  from jdtensor import UNSHARDED, Layout  # pylint: disable=g-import-not-at-top
  assert initialized == device, initialized
  count = jdtensor.num_local_devices(device)
  mesh = jdtensor.create_mesh([("x", count)], device_type=device)
  text = mesh.to_string()
  expected = [s.to_string() for s in jdtensor.local_devices(device)]
  assert text.endswith(",".join(expected)), (text, expected)
  sharded = Layout.batch_sharded(mesh, "x", rank=2)
  x = jdtensor.pack([jnp.full((2, 4), float(i)) for i in range(count)], sharded)
  assert x.shape == (2 * count, 4) and jdtensor.fetch_layout(x) == sharded
  shards = jdtensor.unpack(x)
  assert [float(s[0, 0]) for s in shards] == [float(i) for i in range(count)]
  replicated = jdtensor.relayout(x, Layout([UNSHARDED, UNSHARDED], mesh))
  assert float(jnp.sum(replicated)) == 8.0 * sum(range(count))
  w = jdtensor.call_with_layout(jnp.ones, Layout([UNSHARDED, "x"], mesh), (4, 2 * count))
  y = jax.jit(lambda a, b: a @ b)(x, w)
  assert y.shape == (2 * count, 2 * count)
  print(f"API ok {init_seconds:.2f} {text}", flush=True)


if scen == "api":
  api()
  sys.exit(0)

n, k = jax.process_count(), jax.process_index()
bad = int(os.environ.get("CULPRIT", "1"))
wait_on = os.environ.get("WAIT_ON", device).lower()
devices = sorted(jax.devices("cpu" if wait_on == "cpu" else None),
                 key=lambda d: (d.process_index, d.id))
local = len(devices) // n
mesh = Mesh(np.array(devices).reshape(n, local), ("b", "m"))
psum = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, ("b", "m")), mesh=mesh,
                             in_specs=P("b", "m"), out_specs=P()))
x = jax.make_array_from_callback((n, local), NamedSharding(mesh, P("b", "m")),
                                 lambda idx: np.ones((1, 1), np.float32))
print(f"INIT {init_seconds:.2f} {os.environ.get('CUDA_VISIBLE_DEVICES', '-')} "
      f"{','.join(str(d) for d in jax.local_devices())}", flush=True)


def announce() -> None:
  print(f"MISBEHAVING {time.time():.3f}", flush=True)


def next_batch(step: int) -> int:
  """Where a stuck data loader sits."""
  if k == bad and step == 3 and scen == "stall":
    announce()
    time.sleep(600)
  return step


def busy(seconds: float) -> float:
  """One XLA call on this client's own first device lasting at least
  `seconds` (`benchmarks._busy`); the longest call's seconds."""
  size = 4096 if device == "GPU" else 256
  a = jax.device_put(jnp.full((size, size), 0.01, jnp.float32),
                     jax.local_devices(backend=device.lower())[0])
  return one_long_call(a, seconds)


for step in range(int(os.environ.get("STEPS", "8"))):
  if k == bad and step == 3:
    if scen == "kill":
      announce()
      os.kill(os.getpid(), signal.SIGKILL)
    if scen == "raise":
      announce()
      raise RuntimeError(f"gpu_check: client {k} raises at step 3")
    if scen == "busy":
      announce()
      print(f"BUSY {busy(float(os.environ.get('BUSY_SECONDS', '12'))):.1f}", flush=True)
  next_batch(step)
  total = float(np.asarray(psum(x).addressable_data(0))[0, 0])
  if total != n * local:
    raise AssertionError(f"step {step}: psum gave {total}, expected {n * local}")
  if step == 0:
    print(f"PSUM {total:g} over {len(devices)} {wait_on.upper()} devices", flush=True)
print("DONE", flush=True)
