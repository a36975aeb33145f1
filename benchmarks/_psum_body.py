"""One psum over every device of a multi-client run: the body both contenders
of bench_testing.py run.

    python benchmarks/_psum_body.py   (a hand-written client, under the launcher)

`jdtensor.testing.run_in_multi_client(psum_body, ...)` imports this module in
its clients (the block below does not run there) and calls `psum_body`.
"""

import numpy as np


def psum_body() -> float:
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P
  n, local = jax.process_count(), jax.local_device_count()
  mesh = jax.make_mesh((n, local), ("client", "device"))
  ones = jax.make_array_from_callback(
      (n, local), NamedSharding(mesh, P("client", "device")),
      lambda index: np.ones((1, 1), np.float32))
  psum = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, ("client", "device")),
                               mesh=mesh, in_specs=P("client", "device"),
                               out_specs=P()))
  total = float(np.asarray(psum(ones).addressable_data(0))[0, 0])
  assert total == n * local, total
  return total


if __name__ == "__main__":
  import jdtensor
  jdtensor.initialize_accelerator_system("CPU")
  psum_body()
