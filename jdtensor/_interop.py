"""Conversions between jdtensor's Mesh/Layout and ``jax.sharding``.

JAX-aware, no side effects of its own: device lookups go through
`jdtensor.runtime`, which owns the dense DTensor-id -> ``jax.Device`` table.
JAX device ids are never used as DTensor ids (process 1's CPU devices are
2048, 2049, ... in JAX).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jdtensor import runtime
from jdtensor.device_spec import DeviceSpec
from jdtensor.layout import _ANY, MATCH, UNSHARDED, Layout, LayoutType, Mesh

__all__ = ["to_jax_mesh", "from_jax_mesh", "to_partition_spec",
           "to_jax_sharding", "layout_from_jax_sharding", "resolve_device"]


def resolve_device(device: str) -> Any:
  """The ``jax.Device`` behind a DTensor device string.

  ``/job:J/replica:0/task:T/device:TYPE:I`` is the I-th visible TYPE device of
  client (JAX process) T; without a task, this process.

  Raises:
    ValueError: If the client or the device does not exist.
  """
  spec = DeviceSpec.from_string(device)
  if spec.device_type is None or spec.device_index is None:
    raise ValueError(f"Device {device!r} names no device type and index, e.g. "
                     "'/job:localhost/replica:0/task:0/device:CPU:0'.")
  task = runtime.process_index() if spec.task is None else spec.task
  devices = runtime.client_devices(spec.device_type, task)
  if spec.device_index >= len(devices):
    have = (f"{spec.device_type}:0..{spec.device_type}:{len(devices) - 1}"
            if devices else "none")
    raise ValueError(
        f"Device {device!r} does not exist: client {task} has {len(devices)} "
        f"{spec.device_type} device(s) ({have}). Ask for fewer devices, or "
        "start the process with more (initialize_accelerator_system("
        "num_logical_cpu_devices=N) or the launcher's --devices-per-client).")
  return devices[spec.device_index]


def _mesh_devices(mesh: Mesh) -> list[Any]:
  """One jax.Device per global id, in global-id order."""
  size = int(np.prod(mesh.shape()))
  registered = runtime.registered_tpu_mesh_devices(mesh.name)
  if registered is not None and len(registered) == size and (
      mesh.device_type() == "TPU"):
    return registered  # A create_tpu_mesh ring order (DTensor's per-name ids).
  if mesh.global_devices():
    return [resolve_device(d) for d in mesh.global_devices()]
  local_ids = mesh.local_device_ids()
  local_devices = mesh.local_devices()
  first = mesh.min_global_device_id()
  if len(local_ids) == size:
    by_id = dict(zip(local_ids, local_devices))
    return [resolve_device(by_id[first + i]) for i in range(size)]
  n_local = len(local_ids)
  block = (local_ids[0] - first) // n_local if n_local else -1
  if not n_local or local_ids != list(range(first + block * n_local,
                                            first + (block + 1) * n_local)):
    raise ValueError(
        f"Cannot tell which devices of the other clients hold mesh "
        f"{mesh.to_string()!r}: its local ids are not one contiguous block. "
        "Build it with create_distributed_mesh, or pass global_devices.")
  out = []
  for offset in range(size):
    client, pos = divmod(offset, n_local)
    spec = DeviceSpec.from_string(local_devices[pos])
    # Every client uses the same local device indices (DTensor's assumption).
    out.append(resolve_device(spec.make_merged_spec(
        DeviceSpec(task=client)).to_string()))
  return out


# The jdtensor Mesh each JAX mesh was built from, so that a sharding's layout
# comes back with its DTensor mesh (name included). A cache, not runtime state.
_ORIGIN: dict[Any, Mesh] = {}
_ORIGIN_LIMIT = 4096


def to_jax_mesh(mesh: Mesh, axis_types: Any = None) -> Any:
  """Builds the ``jax.sharding.Mesh`` for `mesh` (axis types default to Auto)."""
  import jax  # pylint: disable=g-import-not-at-top
  if mesh.is_single_device() or not mesh.shape():
    raise ValueError(
        f"Mesh {mesh.to_string()!r} has no dimensions, so it has no "
        "jax.sharding.Mesh; use Layout.to_jax_sharding() for a single device.")
  names = mesh.dim_names
  bad = [n for n in names if names.count(n) > 1 or n in (UNSHARDED, MATCH, _ANY)]
  if bad:
    raise ValueError(f"Mesh {mesh.to_string()!r}: dimension name {bad[0]!r} is "
                     "repeated or reserved, so it cannot be a JAX mesh axis.")
  devices = _mesh_devices(mesh)
  if len(set(devices)) != len(devices):
    raise ValueError(f"Mesh {mesh.to_string()!r} places two global ids on the "
                     "same device.")
  if axis_types is None:
    axis_types = (jax.sharding.AxisType.Auto,) * len(names)
  array = np.empty(len(devices), dtype=object)
  array[:] = devices
  jax_mesh = jax.sharding.Mesh(array.reshape(mesh.shape()), tuple(names),
                               axis_types=tuple(axis_types))
  if len(_ORIGIN) < _ORIGIN_LIMIT:
    _ORIGIN.setdefault(jax_mesh, mesh)
  return jax_mesh


def from_jax_mesh(jax_mesh: Any, mesh_name: str = "",
                  use_xla_spmd: bool = False) -> Mesh:
  """Builds the DTensor `Mesh` for a ``jax.sharding.Mesh``."""
  import jax  # pylint: disable=g-import-not-at-top
  if not isinstance(jax_mesh, jax.sharding.Mesh):
    raise TypeError(f"jax_mesh must be a jax.sharding.Mesh, got "
                    f"{type(jax_mesh).__name__}.")
  devices = list(jax_mesh.devices.flat)
  names = [str(n) for n in jax_mesh.axis_names]
  shape = list(jax_mesh.devices.shape)
  strings = [runtime.device_string(d) for d in devices]
  me = runtime.process_index()
  local = [(i, s) for i, (d, s) in enumerate(zip(devices, strings))
           if d.process_index == me]
  ids = np.arange(len(devices)).reshape(shape)
  args = (names, ids, [i for i, _ in local], [s for _, s in local], mesh_name)
  try:
    mesh = Mesh(*args, use_xla_spmd=use_xla_spmd)
    if _mesh_devices(mesh) == devices:
      return mesh
  except ValueError:
    pass
  return Mesh(*args, global_devices=strings, use_xla_spmd=use_xla_spmd)


def to_partition_spec(layout: Layout) -> Any:
  """``PartitionSpec`` with one entry per tensor axis (UNSHARDED -> None)."""
  from jax.sharding import PartitionSpec  # pylint: disable=g-import-not-at-top
  entries = []
  for spec in layout.sharding_specs:
    if spec in (MATCH, _ANY):
      raise ValueError(f"Layout {layout.to_string()!r}: sharding spec {spec!r} "
                       "has no jax.sharding equivalent; resolve it to a mesh "
                       "dimension or UNSHARDED first.")
    entries.append(None if spec == UNSHARDED else spec)
  return PartitionSpec(*entries)


def to_jax_sharding(layout: Layout) -> Any:
  """``NamedSharding`` (or ``SingleDeviceSharding``) for `layout`."""
  import jax  # pylint: disable=g-import-not-at-top
  if layout.type == LayoutType.SINGLE_DEVICE:
    return jax.sharding.SingleDeviceSharding(
        resolve_device(layout.mesh.single_device))
  return jax.sharding.NamedSharding(layout.mesh.jax_mesh,
                                    to_partition_spec(layout))


def layout_from_jax_sharding(sharding: Any, rank: int | None,
                             mesh: Mesh | None) -> Layout:
  """The DTensor `Layout` of a ``NamedSharding``."""
  import jax  # pylint: disable=g-import-not-at-top
  if not isinstance(sharding, jax.sharding.NamedSharding):
    raise TypeError(f"sharding must be a jax.sharding.NamedSharding, got "
                    f"{type(sharding).__name__}.")
  spec = tuple(sharding.spec)
  if rank is None:
    rank = len(spec)
  if len(spec) > rank:
    raise ValueError(f"PartitionSpec {sharding.spec} has {len(spec)} entries, "
                     f"more than rank={rank}.")
  specs = []
  for axis, entry in enumerate(spec):
    if isinstance(entry, tuple):
      if len(entry) > 1:
        raise ValueError(
            f"PartitionSpec {sharding.spec}: tensor axis {axis} is sharded over "
            f"several mesh axes {entry}; a DTensor layout shards each tensor "
            "axis over at most one mesh dimension.")
      entry = entry[0] if entry else None
    if entry is None:
      specs.append(UNSHARDED)
    elif isinstance(entry, str):
      specs.append(entry)
    else:
      raise ValueError(f"PartitionSpec {sharding.spec}: entry {entry!r} on "
                       f"tensor axis {axis} has no DTensor equivalent.")
  specs += [UNSHARDED] * (rank - len(specs))
  if mesh is None:
    mesh = _ORIGIN.get(sharding.mesh) or Mesh.from_jax_mesh(sharding.mesh)
  return Layout(specs, mesh)
