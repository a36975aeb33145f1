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

__all__ = ["gpu_node_count", "tpu_node_count"]

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
