"""The DTensor config API (upstream config_test plus the resolution table)."""

import pytest

import jdtensor
from jdtensor import DeviceSpec, config

_VARS = ("DTENSOR_JOBS", "DTENSOR_CLIENT_ID", "DTENSOR_JOB_NAME",
         "DTENSOR_NUM_CLIENTS", "DTENSOR_ENABLE_HEARTBEAT",
         "DTENSOR_GPU_USE_NCCL_COMMUNICATION",
         "DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION")


@pytest.fixture
def env(monkeypatch):
  for name in _VARS:
    monkeypatch.delenv(name, raising=False)

  def set_env(**values):
    for k, v in values.items():
      monkeypatch.setenv(k, v)
  return set_env


def test_env_vars_defaults(env):
  # DTensor's test_env_vars.
  assert jdtensor.client_id() == 0
  assert jdtensor.num_clients() == 1
  assert jdtensor.job_name() == "localhost"
  assert jdtensor.full_job_name() == "localhost/replica:0/task:0"
  assert jdtensor.jobs() == []
  assert config.is_local_mode()
  assert jdtensor.heartbeat_enabled() is True


def test_two_clients(env):
  env(DTENSOR_JOBS="localhost:1000,localhost:1001", DTENSOR_CLIENT_ID="1")
  assert jdtensor.jobs() == ["localhost:1000", "localhost:1001"]
  assert jdtensor.num_clients() == 2
  assert jdtensor.client_id() == 1
  assert jdtensor.job_name() == "worker"
  assert jdtensor.full_job_name() == "worker/replica:0/task:1"
  assert jdtensor.full_job_name(0) == "worker/replica:0/task:0"
  assert not config.is_local_mode()


def test_single_job_with_name(env):
  env(DTENSOR_JOBS="localhost:1000", DTENSOR_JOB_NAME="trainer")
  assert jdtensor.num_clients() == 1
  assert jdtensor.full_job_name() == "trainer/replica:0/task:0"
  with pytest.raises(ValueError) as e:
    jdtensor.full_job_name(1)
  assert str(e.value) == "Unexpected task ID 1 in local runs"


def test_empty_jobs_is_local_mode(env):
  # TF 2.21 gives [''] here; jdtensor follows TF master: local mode.
  env(DTENSOR_JOBS="")
  assert jdtensor.jobs() == [] and config.is_local_mode()


def test_every_function_that_reads_jobs_raises_on_bad_jobs(env):
  env(DTENSOR_JOBS="a:1,,a:2")
  for fn in (jdtensor.jobs, jdtensor.num_clients, jdtensor.client_id,
             jdtensor.job_name, jdtensor.full_job_name):
    with pytest.raises(jdtensor.ConfigError, match="^DTENSOR_JOBS='a:1,,a:2'"):
      fn()


def test_heartbeat_and_flags(env):
  env(DTENSOR_ENABLE_HEARTBEAT="No", DTENSOR_GPU_USE_NCCL_COMMUNICATION="yes",
      DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION="1")
  assert jdtensor.heartbeat_enabled() is False
  assert config.gpu_use_nccl_communication() is True
  assert config.use_multi_device_mode() is True
  env(DTENSOR_ENABLE_HEARTBEAT="maybe")
  with pytest.raises(ValueError, match="^DTENSOR_ENABLE_HEARTBEAT='maybe'"):
    jdtensor.heartbeat_enabled()


def test_local_devices(env):
  # 8 simulated CPU devices, read from the environment (no backend starts);
  # the jax_single tests' in-process JAX is configured for 8 as well.
  env(JAX_NUM_CPU_DEVICES="8")
  devices = jdtensor.local_devices("cpu")
  assert devices == [DeviceSpec("localhost", 0, 0, "CPU", i) for i in range(8)]
  assert devices[1].to_string() == "/job:localhost/replica:0/task:0/device:CPU:1"
  assert jdtensor.num_local_devices("CPU") == 8
  assert jdtensor.num_global_devices("CPU") == 8
  env(DTENSOR_JOBS="h:1,h:2", DTENSOR_CLIENT_ID="1")
  assert jdtensor.num_global_devices("CPU") == 16
  assert jdtensor.local_devices("CPU")[0].to_string() == (
      "/job:worker/replica:0/task:1/device:CPU:0")
  assert jdtensor.local_devices("CPU", for_client_id=0)[0].task == 0


@pytest.mark.parametrize("fn", [jdtensor.local_devices, jdtensor.num_local_devices,
                                jdtensor.num_global_devices])
def test_unknown_device_type_dtensor_message(env, fn):
  with pytest.raises(ValueError) as e:
    fn("XPU")
  assert str(e.value) == "Device type XPU is not CPU, GPU, or TPU."


def test_preferred_device_type_without_accelerators(env):
  assert jdtensor.preferred_device_type() == "CPU"


@pytest.mark.parametrize("platforms", [None, "cpu", "cuda,cpu"])
def test_a_simulated_tpu_slice_is_tpu_whatever_platform_backs_it(env, monkeypatch,
                                                                 platforms):
  # The simulated slice's cores are CPU devices, so its runs set
  # JAX_PLATFORMS=cpu; the device type is still TPU.
  monkeypatch.setenv("JDTENSOR_SIMULATED_TPU_TOPOLOGY", "2x2x1x2")
  if platforms is None:
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  else:
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
  assert jdtensor.preferred_device_type() == "TPU"


def test_a_malformed_simulated_tpu_slice_is_named_by_the_default_device_type(
    env, monkeypatch):
  monkeypatch.setenv("JDTENSOR_SIMULATED_TPU_TOPOLOGY", "2x2")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  with pytest.raises(jdtensor.errors.ConfigError) as e:
    jdtensor.preferred_device_type()
  assert str(e.value).startswith("JDTENSOR_SIMULATED_TPU_TOPOLOGY='2x2' is not a TPU slice shape")
