"""The accelerators a host has, counted from their device nodes.

PURE: standard library only. A process that has not started JAX (the
launcher's parent, the config functions before start-up) learns what the
host has from the nodes the drivers expose, as TF's
``list_physical_devices`` does: ``/dev/nvidia<N>`` for NVIDIA GPUs,
``/dev/accel<N>`` (else ``/dev/vfio/<N>``) for TPUs. A test fakes a GPU node
with such files in a private mount namespace.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence
from typing import NamedTuple

__all__ = ["GpuIdentity", "gpu_identities", "gpu_node_count", "tpu_node_count"]

# Compiled where used (re caches them): only a GPU or TPU count needs them.
_GPU_NODE = r"nvidia(\d+)"
_TPU_NODE = r"accel(\d+)"


def _count(pattern: str, directory: str) -> int:
  try:
    return sum(1 for n in os.listdir(directory) if re.fullmatch(pattern, n))
  except OSError:
    return 0


def gpu_node_count(directory: str = "/dev") -> int:
  """NVIDIA GPUs attached to this host (``nvidia<N>`` nodes; not
  ``nvidiactl`` or ``nvidia-uvm``)."""
  return _count(_GPU_NODE, directory)


def tpu_node_count(directory: str = "/dev") -> int:
  """TPU chips attached to this host (``accel<N>``, else ``vfio/<N>``)."""
  return _count(_TPU_NODE, directory) or _count(r"\d+", os.path.join(directory, "vfio"))


class GpuIdentity(NamedTuple):
  """One GPU a process will use, as far as can be known before CUDA starts.

  Attributes:
    key: Equal for two processes only when they name the same physical
      GPU: a UUID the process was given (unique everywhere); an ordinal
      only within one control group of one boot (``pci:<boot>:<cgroup>:<bus>``
      where the driver lists the GPUs, else
      ``cuda:<boot>:<cgroup>:<host>:<ordinal>``). An ordinal is not resolved
      to a global UUID: SLURM's constrained tasks (and containers) each see
      their own GPU as ordinal 0 while the driver lists every GPU of the
      node, so two of them must never read as one GPU. A shared GPU that
      two control groups name by ordinal is missed (NCCL says it later),
      never invented.
    label: What a message shows, e.g. ``GPU 0 of node-7 (GPU-5f2b...)``.
  """
  key: str
  label: str


class _DriverGpu(NamedTuple):
  bus: str
  uuid: str  # '' when the driver hides it.
  model: str


_UUID_ENTRY = re.compile(r"(GPU|MIG)-[0-9A-Za-z/-]+")


def _driver_gpus(proc_dir: str) -> list[_DriverGpu]:
  """The GPUs the NVIDIA driver lists (``<proc_dir>/<bus>/information``), in
  PCI bus order; [] without the driver (or inside a container that hides it)."""
  try:
    buses = sorted(os.listdir(proc_dir))
  except OSError:
    return []
  found = []
  for bus in buses:
    fields = {}
    try:
      with open(os.path.join(proc_dir, bus, "information"), encoding="utf-8",
                errors="replace") as f:
        for line in f:
          name, _, value = line.partition(":")
          fields[name.strip()] = value.strip()
    except OSError:
      continue
    uuid = fields.get("GPU UUID", "")
    found.append(_DriverGpu(bus.lower(), uuid if _UUID_ENTRY.fullmatch(uuid) else "",
                            fields.get("Model", "")))
  return found


def _boot_id(path: str) -> str:
  try:
    with open(path, encoding="ascii") as f:
      return f.read().strip()[:36] or "unknown"
  except OSError:
    return "unknown"


def _cgroup(path: str) -> str:
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return ";".join(line.strip() for line in f if line.strip())[:512]
  except OSError:
    return ""


def gpu_identities(environ: Mapping[str, str], visible: Sequence[str] | None, *,
                   device_dir: str = "/dev",
                   proc_dir: str = "/proc/driver/nvidia/gpus",
                   boot_id_path: str = "/proc/sys/kernel/random/boot_id",
                   cgroup_path: str = "/proc/self/cgroup",
                   host: str | None = None) -> tuple[GpuIdentity, ...]:
  """The GPUs this process will use: `visible` (``CUDA_VISIBLE_DEVICES``'s
  entries, as written; None: every GPU of the host), each resolved to the
  most exact identity the host shows without starting CUDA.

  An ordinal is the k-th GPU in CUDA's order, which is PCI bus order where
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or all GPUs are one model (CUDA's
  default, fastest first, only reorders unlike GPUs); where that cannot be
  known, the ordinal itself is kept, qualified by host. A UUID (or unique
  prefix, as CUDA takes it) is matched to the driver's full UUID. Entries
  after the first that CUDA would reject are dropped, as CUDA does.
  """
  host = host or socket.gethostname()
  boot = _boot_id(boot_id_path)
  group = _cgroup(cgroup_path)
  driver = _driver_gpus(proc_dir)
  pci_order = (environ.get("CUDA_DEVICE_ORDER", "").strip().upper() == "PCI_BUS_ID"
               or len({g.model for g in driver}) <= 1)
  if visible is None:
    count = len(driver) or gpu_node_count(device_dir)
    visible = [str(i) for i in range(count)]

  def by_driver(gpu: _DriverGpu, shown: str, given_uuid: bool) -> GpuIdentity:
    label = f"{shown} of {host} ({gpu.uuid or 'PCI ' + gpu.bus})"
    if given_uuid and gpu.uuid:
      return GpuIdentity(gpu.uuid.lower(), label)
    return GpuIdentity(f"pci:{boot}:{group}:{gpu.bus}", label)

  found: list[GpuIdentity] = []
  for entry in visible:
    if entry.isdigit():
      ordinal = int(entry)
      if driver and pci_order:
        if ordinal >= len(driver):
          break  # CUDA stops at an ordinal it does not have.
        found.append(by_driver(driver[ordinal], f"GPU {ordinal}", False))
      else:
        found.append(GpuIdentity(f"cuda:{boot}:{group}:{host}:{ordinal}",
                                 f"GPU {ordinal} of {host}"))
    elif _UUID_ENTRY.fullmatch(entry):
      matches = [g for g in driver if g.uuid.lower().startswith(entry.lower())]
      if len(matches) == 1:
        found.append(by_driver(matches[0], entry, True))
      else:
        found.append(GpuIdentity(entry.lower(), f"{entry} of {host}"))
    else:
      break  # CUDA ignores this entry and every one after it.
  return tuple(found)
