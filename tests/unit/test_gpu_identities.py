"""Which physical GPUs a client will use, read before CUDA starts
(`jdtensor._device_nodes.gpu_identities`): the start-up handshake refuses
two clients on one GPU with them. The NVIDIA driver's
``/proc/driver/nvidia/gpus`` and the device nodes are faked in a directory."""

import pytest

from jdtensor._device_nodes import GpuIdentity, gpu_identities
from jdtensor.runtime.handshake import Hello, PeerHello

BOOT = "0f3a9c2e-1111-2222-3333-444455556666"
_INFO = """Model: \t\t {model}
IRQ:   \t\t 47
GPU UUID: \t {uuid}
Video BIOS: \t 96.00.74.00.01
Bus Type: \t PCIe
DMA Size: \t 47 bits
DMA Mask: \t 0x7fffffffffff
Bus Location: \t {bus}
Device Minor: \t {minor}
GPU Excluded:\t No
"""
# Two H200s whose minors are not in bus order; the UUIDs as the driver shows them.
_GPUS = [("0000:3b:00.0", "GPU-aaaa1111-0000-0000-0000-000000000000", 1, "NVIDIA H200"),
         ("0000:1a:00.0", "GPU-bbbb2222-0000-0000-0000-000000000000", 0, "NVIDIA H200")]


def node(tmp_path, gpus=_GPUS, driver=True, nodes=2, cgroup="/user.slice"):
  """A fake host: its /dev, its driver's GPU list and its boot id."""
  dev, proc = tmp_path / "dev", tmp_path / "gpus"
  dev.mkdir(parents=True)
  for i in range(nodes):
    (dev / f"nvidia{i}").touch()
  if driver:
    for bus, uuid, minor, model in gpus:
      (proc / bus).mkdir(parents=True)
      (proc / bus / "information").write_text(
          _INFO.format(model=model, uuid=uuid, bus=bus, minor=minor))
  (tmp_path / "boot_id").write_text(BOOT + "\n")
  (tmp_path / "cgroup").write_text(f"0::{cgroup}\n")
  return dict(device_dir=str(dev), proc_dir=str(proc),
              boot_id_path=str(tmp_path / "boot_id"), cgroup_path=str(tmp_path / "cgroup"),
              host="node-7")


GROUP = "0::/user.slice"
# An ordinal is this control group's view: keyed by boot, cgroup and bus.
A = GpuIdentity(f"pci:{BOOT}:{GROUP}:0000:3b:00.0",
                "GPU 1 of node-7 (GPU-aaaa1111-0000-0000-0000-000000000000)")
B = GpuIdentity(f"pci:{BOOT}:{GROUP}:0000:1a:00.0",
                "GPU 0 of node-7 (GPU-bbbb2222-0000-0000-0000-000000000000)")
A_UUID = "gpu-aaaa1111-0000-0000-0000-000000000000"
B_UUID = "gpu-bbbb2222-0000-0000-0000-000000000000"


@pytest.mark.parametrize("visible,expected", [
    # CUDA's order is the PCI bus order here (one model): 1a before 3b.
    (None, [B, A]),
    (["1"], [A]),
    (["1", "0"], [A, B]),
    (["GPU-aaaa1111-0000-0000-0000-000000000000"],  # A UUID given: global.
     [GpuIdentity(A_UUID, "GPU-aaaa1111-0000-0000-0000-000000000000 of node-7 "
                          "(GPU-aaaa1111-0000-0000-0000-000000000000)")]),
    (["GPU-bbbb"],  # A unique prefix, as CUDA takes it.
     [GpuIdentity(B_UUID, "GPU-bbbb of node-7 (GPU-bbbb2222-0000-0000-0000-000000000000)")]),
    (["0", "7", "1"], [B]),  # CUDA stops at the first ordinal it does not have.
    (["0", "x", "1"], [B]),  # ... and at the first entry it cannot read.
    ([], []),
], ids=["all", "one", "reordered", "uuid", "uuid-prefix", "past-the-end", "garbage",
        "none-visible"])
def test_entries_resolve_to_the_drivers_uuids_in_pci_order(tmp_path, visible, expected):
  assert list(gpu_identities({}, visible, **node(tmp_path))) == expected


def test_an_ordinal_is_one_gpu_only_within_its_control_group(tmp_path):
  """SLURM's constrained tasks (--gpus-per-task=1 with ConstrainDevices)
  each see their own GPU as ordinal 0, while the driver lists every GPU of
  the node: two tasks' ordinal 0 must not read as one GPU. Within one
  control group (the clients of one `jdtensor launch` or `mpirun`), the
  same ordinal is the same GPU."""
  task_1 = gpu_identities({}, ["0"], **node(tmp_path / "t1", cgroup="/job_7/step_0/task_1"))
  task_2 = gpu_identities({}, ["0"], **node(tmp_path / "t2", cgroup="/job_7/step_0/task_2"))
  assert task_1[0].key != task_2[0].key
  assert task_1[0].label == task_2[0].label == B.label
  same = gpu_identities({}, ["0"], **node(tmp_path / "t3"))
  assert same[0].key == gpu_identities({}, ["0"], **node(tmp_path / "t4"))[0].key


def test_without_the_driver_ordinals_are_this_hosts_and_uuids_as_written(tmp_path):
  assert gpu_identities({}, None, **node(tmp_path, driver=False)) == (
      GpuIdentity(f"cuda:{BOOT}:{GROUP}:node-7:0", "GPU 0 of node-7"),
      GpuIdentity(f"cuda:{BOOT}:{GROUP}:node-7:1", "GPU 1 of node-7"))
  assert gpu_identities({}, ["GPU-Ab12"], **node(tmp_path / "b", driver=False)) == (
      GpuIdentity("gpu-ab12", "GPU-Ab12 of node-7"),)


def test_a_hidden_uuid_falls_back_to_the_pci_location_on_this_boot(tmp_path):
  gpus = [(bus, "GPU-????????-????-????-????-????????????", m, model)
          for bus, _, m, model in _GPUS]
  assert gpu_identities({}, ["0"], **node(tmp_path, gpus)) == (
      GpuIdentity(f"pci:{BOOT}:{GROUP}:0000:1a:00.0", "GPU 0 of node-7 (PCI 0000:1a:00.0)"),)


@pytest.mark.parametrize("order,expected", [
    ("", GpuIdentity(f"cuda:{BOOT}:{GROUP}:node-7:0", "GPU 0 of node-7")),
    ("PCI_BUS_ID", B),
], ids=["fastest-first", "pci-bus-id"])
def test_unlike_gpus_are_ordered_by_pci_bus_only_when_cuda_is_told_to(tmp_path, order,
                                                                      expected):
  # CUDA's default order puts the fastest first: with unlike GPUs, ordinal 0
  # may be either, so only the ordinal itself is known.
  gpus = [_GPUS[0][:3] + ("NVIDIA H200",), _GPUS[1][:3] + ("NVIDIA A100",)]
  got = gpu_identities({"CUDA_DEVICE_ORDER": order}, ["0"], **node(tmp_path, gpus))
  assert got == (expected,)


def test_the_hello_carries_the_gpus_and_a_malformed_list_is_named():
  hello = Hello(1, 2, ("a:1", "b:2"), 1, True, (), (A, B))
  assert PeerHello.parse(hello.to_frame()).gpus == (A, B)
  for bad in ([["key"]], [["key", 3]], "GPU-x", [["k", "x" * 300]], [["k", "l"]] * 300):
    with pytest.raises(ValueError) as e:
      PeerHello.parse({**hello.to_frame(), "gpus": bad})
    assert str(e.value) == "field 'gpus' is malformed"


@pytest.mark.parametrize("sharers,environ,fraction,said", [
    (1, {}, None, ""),
    (2, {}, "0.37", "2 clients share a GPU (JDTENSOR_SHARE_GPUS): "
     "XLA_PYTHON_CLIENT_MEM_FRACTION=0.37, an equal part of JAX's default 0.75"),
    (8, {}, "0.09", None),
    (200, {}, "0.01", None),  # Never 0: JAX would preallocate nothing usable.
    (2, {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"}, ".5",
     "2 clients share a GPU (JDTENSOR_SHARE_GPUS); JAX's memory use is as set "
     "(XLA_PYTHON_CLIENT_MEM_FRACTION)"),
    (2, {"XLA_CLIENT_MEM_FRACTION": ".5"}, None, None),
    (2, {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, None, None),
    (2, {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, None, None),
], ids=["alone", "two", "eight", "many", "user-fraction", "user-new-fraction",
        "user-no-preallocation", "user-allocator"])
def test_clients_that_share_a_gpu_share_jaxs_preallocation_unless_the_user_chose(
    sharers, environ, fraction, said):
  from jdtensor import _env  # pylint: disable=g-import-not-at-top
  told = _env.fit_shared_gpu_memory(sharers, environ)
  assert environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") == fraction
  if said is not None:
    assert told == said
