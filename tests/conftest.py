"""Suite-wide set-up: JAX on the CPU.

The in-process backend of the jax_single tests gets its 8 simulated CPU
devices from tests/jax_single/conftest.py (``jax_num_cpu_devices``), not from
``JAX_NUM_CPU_DEVICES`` in this process's environment: the clients that tests
launch from this process inherit its environment, and a device count there is
the clients' count (the launcher's rule), as it would be for a user.
Tests that need a different or fresh backend run in subprocesses
(tests/helpers.py).
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
