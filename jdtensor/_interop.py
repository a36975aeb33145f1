"""Conversions between jdtensor's Mesh/Layout and ``jax.sharding``.

JAX-aware, no side effects of its own: device lookups go through
`jdtensor.runtime`, which owns the dense DTensor-id -> ``jax.Device`` table.
JAX device ids are never used as DTensor ids (process 1's CPU devices are
2048, 2049, ... in JAX).
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

import numpy as np

from jdtensor import runtime
from jdtensor.device_spec import DeviceSpec
from jdtensor.layout import _ANY, MATCH, UNSHARDED, Layout, LayoutType, Mesh

__all__ = ["to_jax_mesh", "from_jax_mesh", "to_partition_spec",
           "to_jax_sharding", "layout_from_jax_sharding", "resolve_device",
           "local_jax_devices",
           "remember_layout", "recorded_layout"]


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


# Where a layout is found again (so that `fetch_layout` gives back the exact
# Layout, mesh name and PARTED/STATIC type included). Caches, not runtime
# state; each entry dies with what it describes:
#
# * the Layout of every array jdtensor made (pack, relayout, ...), by the
#   array's identity, dropped when the array is collected;
# * the Layout of every sharding `Layout.to_jax_sharding` made, by the
#   sharding's identity (JAX keeps the sharding object through jit and
#   device_put); the Layout holds its sharding, so the identity cannot be
#   reused while the entry lives;
# * the jdtensor Mesh most recently turned into each JAX mesh (meshes that
#   differ only in name give equal JAX meshes), for shardings made by hand.
_lock = threading.Lock()
_ARRAY_LAYOUTS: dict[int, tuple[Any, Layout]] = {}
_SHARDING_LAYOUTS: weakref.WeakValueDictionary[int, Layout] = (
    weakref.WeakValueDictionary())
_MESHES: collections.OrderedDict[Any, Mesh] = collections.OrderedDict()
_MESHES_LIMIT = 4096


def remember_layout(array: Any, layout: Layout) -> Any:
  """Records that `array` has `layout`; returns `array`."""
  key = id(array)
  try:
    ref = weakref.ref(array, lambda _, key=key: _ARRAY_LAYOUTS.pop(key, None))
  except TypeError:  # Not weakly referenceable: nothing to remember.
    return array
  _ARRAY_LAYOUTS[key] = (ref, layout)
  return array


def recorded_layout(array: Any) -> Layout | None:
  """The Layout jdtensor recorded for `array` or for its sharding, if any."""
  entry = _ARRAY_LAYOUTS.get(id(array))
  if entry is not None and entry[0]() is array:
    return entry[1]
  sharding = getattr(array, "sharding", None)
  layout = _SHARDING_LAYOUTS.get(id(sharding))
  if layout is not None and layout._jax_sharding is sharding:  # pylint: disable=protected-access
    return layout
  return None


def _note_mesh(jax_mesh: Any, mesh: Mesh) -> None:
  with _lock:
    _MESHES.pop(jax_mesh, None)
    _MESHES[jax_mesh] = mesh
    while len(_MESHES) > _MESHES_LIMIT:
      _MESHES.popitem(last=False)


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
  _note_mesh(jax_mesh, mesh)
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


def local_jax_devices(layout: Layout) -> list[Any]:
  """This client's devices of `layout`'s mesh, in local-device-id order.

  Read off the layout's (cached) sharding, so repeated pack and unpack calls
  do not parse device strings again.
  """
  sharding = to_jax_sharding(layout)
  mesh = layout.mesh
  if layout.type == LayoutType.SINGLE_DEVICE or mesh.is_single_device():
    return [resolve_device(d) for d in mesh.local_devices()]
  flat = sharding.mesh.devices.flat
  first = mesh.min_global_device_id()
  return [flat[i - first] for i in mesh.local_device_ids()]


def to_jax_sharding(layout: Layout) -> Any:
  """``NamedSharding`` (or ``SingleDeviceSharding``) for `layout`.

  Made once per Layout object (it keeps it) and recorded, so that arrays
  with this sharding give this exact layout back.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if layout._jax_sharding is not None:  # pylint: disable=protected-access
    return layout._jax_sharding  # pylint: disable=protected-access
  if layout.type == LayoutType.SINGLE_DEVICE:
    sharding = jax.sharding.SingleDeviceSharding(
        resolve_device(layout.mesh.single_device))
  else:
    jax_mesh = layout.mesh.jax_mesh
    _note_mesh(jax_mesh, layout.mesh)
    sharding = jax.sharding.NamedSharding(jax_mesh, to_partition_spec(layout))
  layout._jax_sharding = sharding  # pylint: disable=protected-access
  _SHARDING_LAYOUTS[id(sharding)] = layout
  return sharding


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
  layout_type = LayoutType.STATIC
  if mesh is None:
    origin = _SHARDING_LAYOUTS.get(id(sharding))
    if origin is not None and origin._jax_sharding is sharding:  # pylint: disable=protected-access
      mesh, layout_type = origin.mesh, origin.type
    else:
      mesh = _MESHES.get(sharding.mesh) or Mesh.from_jax_mesh(sharding.mesh)
  layout = Layout(specs, mesh)
  return layout.to_parted() if layout_type == LayoutType.PARTED else layout
