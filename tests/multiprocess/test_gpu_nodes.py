"""GPU nodes without a GPU: fake ``/dev/nvidia<N>`` nodes in a private mount
namespace (`tests.helpers.fake_gpu_node_command`), as jdtensor sees a GPU
machine before JAX starts."""

import json
import socket
import subprocess
import sys

import pytest

from tests.helpers import clean_env, fake_gpu_node_command

pytestmark = pytest.mark.multiprocess

# (JAX_PLATFORMS or None for unset, CUDA_VISIBLE_DEVICES or None) -> the
# default device type on a node with 2 fake GPUs: what JAX will use.
_ROWS = [
    (None, None, "GPU"),
    ("cpu", None, "CPU"),  # The launcher's CPU runs.
    ("CPU", None, "CPU"),
    ("cuda", None, "GPU"),
    ("cuda,cpu", None, "GPU"),
    ("cpu,cuda", None, "CPU"),
    ("tpu,cpu", None, "CPU"),  # No TPU here: the next listed.
    ("tpu", None, "TPU"),  # Nothing listed is here: JAX will say so at start-up.
    ("", None, "GPU"),  # Empty: every platform, as unset.
    (None, "", "CPU"),  # No GPU visible.
]

_TABLE = """
import json, os, sys
from jdtensor import config
rows = []
for platforms, visible in json.loads(sys.argv[1]):
  for name, value in (("JAX_PLATFORMS", platforms), ("CUDA_VISIBLE_DEVICES", visible)):
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value
  rows.append(config.preferred_device_type())
# Once jax is imported, its config wins (read from JAX_PLATFORMS at import,
# or set by jax.config.update), as JAX itself decides.
os.environ.pop("JAX_PLATFORMS", None)
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
import jax
rows.append(config.preferred_device_type())
jax.config.update("jax_platforms", "cpu")
rows.append(config.preferred_device_type())
print(json.dumps(rows))
"""


def test_the_default_device_type_is_what_jax_will_use_on_a_gpu_node():
  env = clean_env()
  env.pop("JAX_PLATFORMS")
  command = fake_gpu_node_command(2, [sys.executable, "-c", _TABLE, json.dumps(
      [[p, v] for p, v, _ in _ROWS])])
  res = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
  assert res.returncode == 0, res.stderr
  got = json.loads(res.stdout)
  assert got == [want for _, _, want in _ROWS] + ["GPU", "CPU"], got


def test_a_launched_cpu_run_on_a_gpu_node_initialises_with_no_argument():
  """The README's pattern, `initialize_accelerator_system()`, under the
  launcher's CPU run (``JAX_PLATFORMS=cpu``) on a GPU machine: a CPU run,
  not `this process has no GPU devices` on every client."""
  script = ("import jdtensor\n"
            "print('TYPE', jdtensor.initialize_accelerator_system(),"
            " jdtensor.preferred_device_type(), flush=True)\n")
  env = clean_env()
  env.pop("JAX_PLATFORMS")
  command = fake_gpu_node_command(4, [sys.executable, "-m", "jdtensor", "launch", "-n",
                                      "2", "--timeout", "90", "--", sys.executable,
                                      "-c", script])
  res = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
  assert res.returncode == 0, res.stdout + res.stderr
  assert sorted(line for line in res.stdout.splitlines() if "TYPE" in line) == [
      "[client 0] TYPE CPU CPU", "[client 1] TYPE CPU CPU"], res.stdout


_SAY = ('echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES '
        'local=$JDTENSOR_LOCAL_CLIENT_ID/$JDTENSOR_LOCAL_NUM_CLIENTS"')


# (fake GPUs, the node's CUDA_VISIBLE_DEVICES, launch arguments) -> each
# client's line, or the refusal (exit 2, before any client starts).
@pytest.mark.parametrize("gpus,visible,args,expected", [
    (4, None, [], ["[client 0] CUDA_VISIBLE_DEVICES=0 local=0/4",
                   "[client 1] CUDA_VISIBLE_DEVICES=1 local=1/4",
                   "[client 2] CUDA_VISIBLE_DEVICES=2 local=2/4",
                   "[client 3] CUDA_VISIBLE_DEVICES=3 local=3/4"]),
    (4, None, ["-n", "2"], ["[client 0] CUDA_VISIBLE_DEVICES=0,1 local=0/2",
                            "[client 1] CUDA_VISIBLE_DEVICES=2,3 local=1/2"]),
    (4, None, ["--devices-per-client", "4"], ["[client 0] CUDA_VISIBLE_DEVICES=0,1,2,3 local=0/1"]),
    # A partial node (SLURM's or Kubernetes's allocation), UUIDs kept as written.
    (8, "GPU-5f1e,GPU-77ab", [], ["[client 0] CUDA_VISIBLE_DEVICES=GPU-5f1e local=0/2",
                                  "[client 1] CUDA_VISIBLE_DEVICES=GPU-77ab local=1/2"]),
    (8, "6,7", ["-n", "1"], ["[client 0] CUDA_VISIBLE_DEVICES=6,7 local=0/1"]),
    (4, None, ["-n", "3"],
     "jdtensor launch: -n 3 does not split this node's 4 GPUs (/dev/nvidia0-3) evenly, "
     "one client per GPU or more GPUs each. Give -n a divisor of 4 (1, 2, 4), or "
     "--devices-per-client K with -n x K at most 4.\n"),
    (8, "6,7", ["-n", "2", "--devices-per-client", "2"],
     "jdtensor launch: -n 2 x --devices-per-client 2 needs 4 GPUs, but this node has 2 "
     "(CUDA_VISIBLE_DEVICES='6,7'). Give -n x --devices-per-client at most 2, or set "
     "JDTENSOR_SHARE_GPUS=1 to run several clients on a GPU (no cross-client GPU "
     "collective then).\n"),
    (0, None, [],
     "jdtensor launch: --device-type GPU: this node has no GPU (no /dev/nvidia<N>). Run "
     "on a GPU node, or use --device-type CPU.\n"),
], ids=["one-per-gpu", "n2", "k4", "partial-uuids", "partial-n1", "n3-refused",
        "too-small-refused", "no-gpu-refused"])
def test_launch_gives_each_client_its_own_gpus(gpus, visible, args, expected):
  env = clean_env()
  env.pop("JAX_PLATFORMS")
  env.pop("CUDA_VISIBLE_DEVICES", None)
  if visible is not None:
    env["CUDA_VISIBLE_DEVICES"] = visible
  command = fake_gpu_node_command(gpus, [
      sys.executable, "-m", "jdtensor", "launch", "--device-type", "GPU", *args,
      "--timeout", "30", "--", "sh", "-c", _SAY])
  res = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
  if isinstance(expected, str):
    assert (res.returncode, res.stdout, res.stderr) == (2, "", expected)
  else:
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == expected


_ON_ONE_GPU = """
import os, jdtensor
try:
  jdtensor.initialize_accelerator_system("GPU")
except Exception as e:
  print(type(e).__name__, e, flush=True)
print("FRACTION", os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"), flush=True)
"""


@pytest.mark.parametrize("share", [False, True], ids=["refused", "shared-by-opt-in"])
def test_two_clients_on_one_gpu_are_named_at_start_up_before_nccl(share):
  """Both clients are given GPU 0 (not by the launcher, which would refuse
  it): the start-up handshake names them, the GPU and the fix; with the
  opt-in they meet, each with half of JAX's memory preallocation (this
  machine's JAX then finds no GPU: the start-up got past the check)."""
  env = clean_env()
  env.pop("JAX_PLATFORMS")
  env["CUDA_VISIBLE_DEVICES"] = "0"
  if share:
    env["JDTENSOR_SHARE_GPUS"] = "1"
  command = fake_gpu_node_command(1, [
      sys.executable, "-m", "jdtensor", "launch", "-n", "2", "--timeout", "60", "--",
      sys.executable, "-c", _ON_ONE_GPU])
  res = subprocess.run(command, env=env, capture_output=True, text=True, timeout=90)
  lines = sorted(line for line in res.stdout.splitlines() if line.strip())
  host = socket.gethostname()
  if share:
    assert lines == sorted([
        f"[client {c}] ValueError initialize_accelerator_system('GPU'): this process "
        "has no GPU devices. Use device_type='CPU', or run where GPUs are attached (or "
        "simulate a TPU slice with JDTENSOR_SIMULATED_TPU_TOPOLOGY)." for c in (0, 1)] + [
        f"[client {c}] FRACTION 0.37" for c in (0, 1)]), res.stdout + res.stderr
  else:
    message = (f"Clients 0 and 1 would share one GPU: client 0 uses GPU 0 of {host}, "
               f"client 1 uses GPU 0 of {host}. NCCL fails the first cross-client "
               "collective of clients on one GPU ('Duplicate GPU detected'). Give each "
               "client its own GPUs (`jdtensor launch --device-type GPU` does; else set "
               "CUDA_VISIBLE_DEVICES per client), or, for a run that needs no "
               "cross-client GPU collective, set JDTENSOR_SHARE_GPUS=1 on every client.")
    assert lines == sorted([
        "[client 0] FRACTION None", "[client 1] FRACTION None",
        f"[client 0] StartupError {message}",
        f"[client 1] StartupError Client 1: start-up refused by client 0: {message}"]
    ), res.stdout + res.stderr
    assert f"[client 0] jdtensor: client 0: {message}\n" in res.stderr  # Its log.
