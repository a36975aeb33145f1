"""TensorFlow DTensor doing the same: run with a Python that has tensorflow.

    <tf-python> benchmarks/_tf_client.py first_collective

TensorFlow is never a jdtensor dependency; the benchmark runs this only when
JDTENSOR_BENCH_TF_PYTHON names an interpreter where it is importable.
"""

import os
import sys
import time

import tensorflow as tf  # pylint: disable=import-error
from tensorflow.experimental import dtensor  # pylint: disable=import-error

local = int(os.environ["JAX_NUM_CPU_DEVICES"])
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=local)
n = dtensor.num_clients() * local
mesh = dtensor.create_distributed_mesh([("x", n)], device_type="CPU")
x = dtensor.pack([tf.ones([1]) for _ in range(local)], dtensor.Layout(["x"], mesh))
total = tf.reduce_sum(x)  # An all-reduce over every device of every client.
assert float(dtensor.unpack(total)[0].numpy()) == n
print(f"FIRST_COLLECTIVE_AT {time.time():.6f}", flush=True)
dtensor.barrier(mesh, "bench-done")
os._exit(0)
del sys
