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
      "Use device_type='CPU', or run where TPUs are attached (or simulate a TPU "
      "slice with JDTENSOR_SIMULATED_TPU_TOPOLOGY).")


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


def test_create_distributed_mesh_single_client():
  result = run_python("""
      import jdtensor
      def err(fn, *a, **k):
        try:
          fn(*a, **k)
        except (ValueError, TypeError) as e:
          return f"{type(e).__name__}: {e}"
        raise AssertionError("no error")
      print(err(jdtensor.create_distributed_mesh, [("x", 4)]))
      jdtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=4)
      m = jdtensor.create_distributed_mesh([("x", 4)], mesh_name="d")
      print(m.to_string())
      print(jdtensor.create_distributed_mesh({"x": 2, "y": 1}, local_devices=["CPU:2", "CPU:3"]).to_string())
      print(err(jdtensor.create_distributed_mesh, [("x", 8)]))
      print(err(jdtensor.create_distributed_mesh, [("x", 4)], local_devices=["CPU:0"], device_type="TPU"))
      print(err(jdtensor.create_distributed_mesh, [("x", 1)], local_devices=["CPU:9"]))
      # The seed's legacy keyword form, error by error in its order.
      print(err(jdtensor.create_distributed_mesh, [("x", 4)], num_global_devices=0))
      print(err(jdtensor.create_distributed_mesh, [("x", 4)], num_clients=0))
      print(err(jdtensor.create_distributed_mesh, [("x", 4)], num_clients=2, client_id=-1))
      print(err(jdtensor.create_distributed_mesh, [("x", 4)], num_clients=2, client_id=2))
      print(err(jdtensor.create_distributed_mesh, [("x", 3)], num_global_devices=3, num_clients=2, client_id=0))
      print(err(jdtensor.create_distributed_mesh, [("x", 16)], num_global_devices=16, num_clients=2, client_id=0))
      print(jdtensor.create_distributed_mesh([("x", 4)], "", 4).to_string())
      print(jdtensor.create_distributed_mesh([("x", 4)], num_global_devices=4, num_clients=2, client_id=1).to_string())
      print(err(jdtensor.create_distributed_mesh, [("x", 4)], num_clients=1, device_type="TPU"))
      print(err(jdtensor.create_distributed_mesh, [("x", 4)], client_id=0, device_type="XPU"))
      """)
  assert result.returncode == 0, result.stderr
  cpu = "/job:localhost/replica:0/task:0/device:CPU:%d"
  cpu1 = "/job:localhost/replica:0/task:1/device:CPU:%d"
  assert result.stdout.splitlines() == [
      "ValueError: Accelerators are uninitialized, please run "
      "dtensor.initialize_accelerator_system() first.",
      "d|x=4|0,1,2,3|0,1,2,3|" + ",".join(cpu % i for i in range(4)),
      "|x=2,y=1|0,1|0,1|" + cpu % 2 + "," + cpu % 3,
      "ValueError: Global number of devices (4 per client * 1 clients = 4) must "
      "be equal to total size of the mesh of shape (8,)",
      "ValueError: Do not specify devices for TPU meshes. Using a partial list of "
      "devices for TPU is not supported.",
      "ValueError: Device '/job:localhost/replica:0/task:0/device:CPU:9' does not "
      "exist: client 0 has 4 CPU device(s) (CPU:0..CPU:3). Ask for fewer devices, "
      "or start the process with more (initialize_accelerator_system("
      "num_logical_cpu_devices=N) or the launcher's --devices-per-client).",
      "ValueError: num_global_devices (0) must be > 0",
      "ValueError: num_clients (0) must be > 0",
      "ValueError: client_id (-1) must be >= 0",
      "ValueError: client_id (2) must be < 2",
      "ValueError: num_global_devices (3) must be divisible by num_clients (2)",
      "ValueError: Not enough devices; 8 needed, only 4 available",
      "|x=4|0,1,2,3|0,1,2,3|" + ",".join(cpu % i for i in range(4)),
      "|x=4|0,1,2,3|2,3|" + cpu1 % 0 + "," + cpu1 % 1,
      "ValueError: Do not specify num_clients for TPU meshes. It will be filled in "
      "automatically from environmental variables.See api.py for the list of "
      "environmental variables for DTensor.",
      "ValueError: Device type XPU is not CPU, GPU or TPU",
  ]


def test_seed_initialize_multi_client_cluster_checks():
  result = run_python("""
      import os
      import jdtensor
      def err(fn, *a, **k):
        try:
          fn(*a, **k)
        except ValueError as e:
          return str(e)
        raise AssertionError("no error")
      f = jdtensor.initialize_multi_client_cluster
      leader = "worker/replica:0/task:0"
      print(err(f, "worker", ["h:1"], 0, leader))
      os.environ["DTENSOR_NUM_CLIENTS"] = "2"
      print(err(f, "worker", [], 0, leader))
      print(err(f, "worker", ["h:1", "h:2", "h:3"], 0, leader))
      del os.environ["DTENSOR_NUM_CLIENTS"]
      print(err(f, "worker", ["h:1", "h:2"], 0, "/job:worker/replica:0/task:1"))
      print(err(f, "worker", ["h:1", "h:2"], 2, leader))
      os.environ["DTENSOR_NUM_CLIENTS"] = "3"
      print(err(jdtensor.dtensor_initialize_multi_client))
      del os.environ["DTENSOR_NUM_CLIENTS"]
      jdtensor.dtensor_initialize_multi_client()  # Local mode: single client.
      print(jdtensor.is_initialized(), err(f, "worker", ["h:1", "h:2"], 0, leader))
      """)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [
      "DTENSOR_NUM_CLIENTS must be set greater than 1 for multi-client mode.",
      "DTENSOR_JOBS environment variable is required when using multi-client "
      "mode to properly set up communications between servers.",
      "DTENSOR_JOBS environment variable must be configured with the same number "
      "of items as DTENSOR_NUM_CLIENTS.",
      "collective_leader='/job:worker/replica:0/task:1': in jdtensor the "
      "collective leader is the JAX coordinator, task 0 "
      "('/job:worker/replica:0/task:0').",
      "client_id=2 must be an int in [0, 2).",
      "DTENSOR_NUM_CLIENTS is set and not 1, while DTENSOR_JOB_NAME is set to "
      "localhost for single client mode.",
      "True Multi-client mode has already been initialized.",
  ]


def test_multi_client_init_after_backend_started_is_clear():
  result = run_python("""
      import jax, jdtensor
      jax.devices()
      try:
        jdtensor.initialize_accelerator_system("CPU")
      except RuntimeError as e:
        print(e)
      """, env=clean_env(DTENSOR_JOBS="localhost:1,localhost:2"))
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith(
      "The JAX backend has already been started in this process, so it cannot "
      "join a multi-client cluster.")


def test_logs_go_through_absl_when_the_application_uses_it():
  absl_run = run_python("""
      from absl import logging
      logging.set_verbosity(logging.INFO)
      logging.use_absl_handler()
      import jdtensor
      jdtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
      jdtensor.create_mesh([("x", 2)])
      """)
  assert absl_run.returncode == 0, absl_run.stderr
  lines = [l for l in absl_run.stderr.splitlines() if "This is client 0 of 1" in l]
  assert len(lines) == 1 and lines[0].startswith("I") and "] This is client" in lines[0]
  std_run = run_python("""
      import logging, sys
      logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
      import jdtensor
      jdtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
      jdtensor.create_mesh([("x", 2)])
      assert "absl" not in sys.modules
      """)
  assert std_run.returncode == 0, std_run.stderr
  assert "jdtensor This is client 0 of 1 clients" in std_run.stderr
  assert "jdtensor Global device IDs: [0 1]" in std_run.stderr


@pytest.mark.parametrize("job_host, platform, family", [
    (("::1", "IPv6"), "cpu", "IPv6"), (("127.0.0.1", "IPv4"), "cpu", "IPv4"),
    (("::1", "IPv6"), "gpu", ""),  # NCCL does not mind a mix: never refused.
    (("::1", "IPv6"), "tpu", ""), (None, "cpu", ""),  # JAX picks the address.
])
def test_the_hello_s_address_family_is_said_only_for_cpu_collectives(
    job_host, platform, family):
  import jax  # pylint: disable=g-import-not-at-top
  from jdtensor.runtime import startup  # pylint: disable=g-import-not-at-top
  assert jax.config.jax_cpu_collectives_implementation == "gloo"
  assert startup._collectives_family(job_host, platform) == family  # pylint: disable=protected-access
