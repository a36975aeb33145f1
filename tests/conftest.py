"""Suite-wide set-up: one CPU backend with 8 simulated devices per process.

The variables are set before anything imports jax, so the in-process backend
(started lazily by the jax_single tests) has 8 CPU devices. Tests that need a
different or fresh backend run in subprocesses (tests/helpers.py).
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAX_NUM_CPU_DEVICES"] = "8"
