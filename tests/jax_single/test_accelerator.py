"""initialize_accelerator_system / shutdown in local mode (fresh processes)."""

import pytest

from tests.helpers import clean_env, run_python

pytestmark = pytest.mark.subprocess


def test_local_initialize_and_shutdown():
  result = run_python("""
      import jax, jdtensor
      assert not jdtensor.is_initialized()
      assert jdtensor.initialize_accelerator_system("cpu", num_logical_cpu_devices=4) == "CPU"
      assert jdtensor.is_initialized()
      assert len(jax.devices()) == 4 and jdtensor.num_local_devices("CPU") == 4
      def err(fn, *a, **k):
        try:
          fn(*a, **k)
        except (ValueError, RuntimeError) as e:
          return f"{type(e).__name__}: {e}"
        raise AssertionError("no error")
      print(err(jdtensor.initialize_accelerator_system))
      jdtensor.shutdown_accelerator_system()
      assert not jdtensor.is_initialized()
      print(err(jdtensor.shutdown_accelerator_system))
      print(err(jdtensor.initialize_accelerator_system, "XPU"))
      print(err(jdtensor.initialize_accelerator_system, "CPU", num_logical_cpu_devices=0))
      # The backend is running with 4 devices: asking for 8 cannot take effect.
      print(err(jdtensor.initialize_accelerator_system, "CPU", num_logical_cpu_devices=8))
      # Same count, or no count: fine (JAX keeps its backend).
      assert jdtensor.initialize_multi_client("CPU", num_logical_cpu_devices=4) == "CPU"
      jdtensor.shutdown_tpu_system()
      assert jdtensor.initialize_tpu_system() == "CPU"  # preferred type here
      print(err(jdtensor.initialize_accelerator_system, "TPU"))
      """)
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines == [
      "AlreadyInitializedError: Accelerator system has already been initialized. "
      "Call tf.experimental.dtensor.shutdown_accelerator_system() first.",
      "NotInitializedError: Accelerator system is not initialized. Call "
      "tf.experimental.dtensor.initialize_accelerator_system first.",
      "ValueError: Unknown device_type XPU. Allowed values are CPU, GPU, or TPU",
      "ValueError: num_logical_cpu_devices must be a positive int, got 0.",
      "RuntimeError: num_logical_cpu_devices=8 cannot take effect: the JAX "
      "backend has already started with 4 CPU device(s). Call "
      "initialize_accelerator_system() before any JAX call that starts the "
      "backend (jax.devices(), creating arrays, jit), or run it in a fresh "
      "process.",
      "AlreadyInitializedError: Accelerator system has already been initialized. "
      "Call tf.experimental.dtensor.shutdown_accelerator_system() first.",
  ]


def test_tpu_without_tpus_is_clear():
  result = run_python("""
      import jdtensor
      try:
        jdtensor.initialize_accelerator_system("TPU")
      except ValueError as e:
        print(e)
      """)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == (
      "initialize_accelerator_system('TPU'): this process has no TPU devices. "
      "Use device_type='CPU', or run where TPUs are attached.")


def test_demo_command():
  """`jdtensor demo`: 4 clients x 2 devices, each matching the reference."""
  result = run_python("""
      import sys
      from jdtensor.cli import main
      sys.exit(main(["demo", "--steps", "8", "--timeout", "120"]))
      """, timeout=150)
  assert result.returncode == 0, result.stdout + result.stderr
  out = result.stdout
  assert "[client 1] mesh: |batch=4,model=2|0,1,2,3,4,5,6,7|2,3|" \
      "/job:worker/replica:0/task:1/device:CPU:0," \
      "/job:worker/replica:0/task:1/device:CPU:1" in out
  assert out.count("over 8 steps") == 4
  assert out.count("(tolerance 1e-05): OK") == 4
  assert out.rstrip().endswith("OK")
