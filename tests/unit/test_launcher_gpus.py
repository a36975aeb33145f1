"""`jdtensor launch --device-type GPU`: each client's GPUs from the node's
pool (`jdtensor.launcher.gpus`), and what each client is told
(`worker_env`). Pure: no GPU, no process. The same through the real CLI on
faked GPU nodes: tests/multiprocess/test_gpu_nodes.py."""

import pytest

from jdtensor.errors import ConfigError
from jdtensor.launcher import LaunchSpec
from jdtensor.launcher.gpus import GpuPool, assign_gpus, node_gpu_pool
from jdtensor.launcher.spec import Attempt, worker_env

EIGHT = GpuPool(tuple("01234567"), "/dev/nvidia0-7")
UUIDS = GpuPool(("GPU-a", "GPU-b", "GPU-c"), "CUDA_VISIBLE_DEVICES='GPU-a,GPU-b,GPU-c'")


@pytest.mark.parametrize("pool,n,k,expected", [
    (EIGHT, None, None, [(c,) for c in "01234567"]),  # torchrun's --nproc-per-node gpu.
    (EIGHT, 2, None, [tuple("0123"), tuple("4567")]),
    (EIGHT, None, 2, [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]),
    (EIGHT, 2, 2, [("0", "1"), ("2", "3")]),  # Part of the node, asked for.
    (EIGHT, 8, 1, [(c,) for c in "01234567"]),
    (UUIDS, None, None, [("GPU-a",), ("GPU-b",), ("GPU-c",)]),  # Kept as written.
    (UUIDS, 1, None, [("GPU-a", "GPU-b", "GPU-c")]),
], ids=["one-per-gpu", "n2", "k2", "n2-k2", "n8-k1", "uuids", "uuids-n1"])
def test_each_client_gets_its_own_gpus(pool, n, k, expected):
  assert [list(c) for c in assign_gpus(pool, n, k)] == [list(c) for c in expected]


@pytest.mark.parametrize("pool,n,k,message", [
    (EIGHT, 3, None,
     "-n 3 does not split this node's 8 GPUs (/dev/nvidia0-7) evenly, one client per "
     "GPU or more GPUs each. Give -n a divisor of 8 (1, 2, 4, 8), or "
     "--devices-per-client K with -n x K at most 8."),
    (EIGHT, 16, None,
     "-n 16 does not split this node's 8 GPUs (/dev/nvidia0-7) evenly, one client per "
     "GPU or more GPUs each. Give -n a divisor of 8 (1, 2, 4, 8), or "
     "--devices-per-client K with -n x K at most 8, or set JDTENSOR_SHARE_GPUS=1 to "
     "run several clients on a GPU (no cross-client GPU collective then)."),
    (EIGHT, None, 3,
     "--devices-per-client 3 does not split this node's 8 GPUs (/dev/nvidia0-7) "
     "evenly. Give a divisor of 8 (1, 2, 4, 8), or -n with -n x 3 at most 8."),
    (EIGHT, 3, 3,
     "-n 3 x --devices-per-client 3 needs 9 GPUs, but this node has 8 "
     "(/dev/nvidia0-7). Give -n x --devices-per-client at most 8, or set "
     "JDTENSOR_SHARE_GPUS=1 to run several clients on a GPU (no cross-client GPU "
     "collective then)."),
    (GpuPool((), "CUDA_VISIBLE_DEVICES=''"), None, None,
     "--device-type GPU: this node has no GPU (CUDA_VISIBLE_DEVICES=''). Run on a "
     "GPU node, or use --device-type CPU."),
], ids=["n-not-dividing", "n-too-many", "k-not-dividing", "too-small", "none"])
def test_a_pool_that_cannot_serve_the_clients_is_refused(pool, n, k, message):
  with pytest.raises(ConfigError) as e:
    assign_gpus(pool, n, k)
  assert str(e.value) == message


ONE = GpuPool(("0",), "/dev/nvidia0")


@pytest.mark.parametrize("pool,n,k,expected", [
    (ONE, 2, None, [("0",), ("0",)]),  # Tests of the heartbeat on a one-GPU machine.
    (GpuPool(("0", "1"), "x"), 3, None, [("0",), ("1",), ("0",)]),
    (EIGHT, 3, 3, [("0", "1", "2"), ("3", "4", "5"), ("6", "7", "0")]),
    (EIGHT, 2, None, [tuple("0123"), tuple("4567")]),  # Enough GPUs: none shared.
    (EIGHT, None, None, [(c,) for c in "01234567"]),
], ids=["two-on-one", "three-on-two", "n3-k3-on-8", "enough", "default"])
def test_with_the_opt_in_more_clients_than_gpus_take_them_in_turn(pool, n, k, expected):
  assert [list(c) for c in assign_gpus(pool, n, k, share=True)] == [
      list(c) for c in expected]


def test_with_the_opt_in_a_client_still_cannot_have_more_gpus_than_the_node():
  with pytest.raises(ConfigError) as e:
    assign_gpus(ONE, 2, 2, share=True)
  assert str(e.value) == ("--devices-per-client 2 needs 2 GPUs a client, but this "
                          "node has 1 (/dev/nvidia0). Give --devices-per-client at "
                          "most 1.")


def test_the_launcher_reads_the_opt_in_from_its_environment(tmp_path):
  (tmp_path / "nvidia0").touch()
  spec = LaunchSpec(command=("true",), num_clients=2, device_type="GPU")
  resolved = spec.resolved({"JDTENSOR_SHARE_GPUS": "1"}, device_dir=str(tmp_path))
  assert resolved.gpu_assignment == (("0",), ("0",))
  with pytest.raises(ConfigError):
    spec.resolved({}, device_dir=str(tmp_path))


def test_the_pool_is_the_nodes_cuda_visible_devices_else_its_device_nodes(tmp_path):
  for i in range(3):
    (tmp_path / f"nvidia{i}").touch()
  (tmp_path / "nvidiactl").touch()
  (tmp_path / "nvidia-uvm").touch()
  assert node_gpu_pool({}, str(tmp_path)) == GpuPool(("0", "1", "2"),
                                                      f"{tmp_path}/nvidia0-2")
  assert node_gpu_pool({"CUDA_VISIBLE_DEVICES": " 2, GPU-x ,"}, str(tmp_path)) == GpuPool(
      ("2", "GPU-x"), "CUDA_VISIBLE_DEVICES=' 2, GPU-x ,'")
  assert node_gpu_pool({}, str(tmp_path / "none")).entries == ()


def test_every_client_is_told_its_gpus_and_its_place_on_its_node(tmp_path):
  for i in range(8):
    (tmp_path / f"nvidia{i}").touch()
  spec = LaunchSpec(command=("python",), num_clients=None, device_type="GPU",
                    devices_per_client=2, nnodes=2, node_rank=1,
                    coordinator="h:1").resolved({}, device_dir=str(tmp_path))
  assert (spec.num_clients, spec.devices_per_client) == (4, 2)
  # Node 1's clients are 4..7 of 8; their GPUs are node 1's own 0..7.
  attempt = Attempt((4, 5, 6, 7), tuple(f"h{i}:1" for i in range(8)), None)
  envs = [worker_env(spec, c, [], {}, attempt) for c in attempt.client_ids]
  assert [(e["CUDA_VISIBLE_DEVICES"], e["JDTENSOR_LOCAL_CLIENT_ID"],
           e["JDTENSOR_LOCAL_NUM_CLIENTS"], e["DTENSOR_CLIENT_ID"]) for e in envs] == [
      ("0,1", "0", "4", "4"), ("2,3", "1", "4", "5"), ("4,5", "2", "4", "6"),
      ("6,7", "3", "4", "7")]
  assert "JAX_PLATFORMS" not in envs[0]


def test_a_cpu_run_tells_the_local_place_and_sets_no_gpus():
  spec = LaunchSpec(command=("python",), num_clients=2)
  attempt = Attempt((0, 1), ("localhost:1", "localhost:2"), None)
  env = worker_env(spec, 1, [], {"CUDA_VISIBLE_DEVICES": "3"}, attempt)
  assert (env["JDTENSOR_LOCAL_CLIENT_ID"], env["JDTENSOR_LOCAL_NUM_CLIENTS"]) == ("1", "2")
  assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["JAX_PLATFORMS"] == "cpu"


def test_leaving_out_the_client_count_is_for_gpu_runs_only():
  with pytest.raises(ValueError) as e:
    LaunchSpec(command=("python",), num_clients=None)
  assert str(e.value) == ("num_clients may be left out (one client per GPU) only "
                          "with device_type GPU, not 'CPU'.")
