"""What jdtensor's Mesh/Layout need from JAX: devices, meshes, shardings.

JAX-aware, no state of its own beyond caches: device lookups go through
`jdtensor.runtime`, which owns the dense DTensor-id -> ``jax.Device`` table.
JAX device ids are never used as DTensor ids (process 1's CPU devices are
2048, 2049, ... in JAX).

It never imports `jdtensor.layout`: the data model calls down here from its
JAX conversion methods (``Mesh.jax_mesh``, ``Layout.to_jax_sharding``, ...)
and builds its own objects from the plain values returned; meshes and
layouts are read here by their attributes only.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from jdtensor import runtime
from jdtensor.device_spec import DeviceSpec

__all__ = ["resolve_device", "mesh_devices", "to_jax_mesh", "describe_jax_mesh",
           "single_device_sharding", "named_sharding", "note_mesh", "known_mesh",
           "note_sharding", "sharding_origin", "remember_layout",
           "recorded_layout", "local_jax_devices", "sum_over_devices",
           "forget_jax_objects"]


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


def mesh_devices(mesh: Any) -> list[Any]:
  """One ``jax.Device`` per global id of a jdtensor `Mesh`, in global-id order.

  Raises:
    ValueError: If a device does not exist, or the other clients' devices
      cannot be inferred.
  """
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


def to_jax_mesh(mesh: Any, axis_types: Any = None) -> Any:
  """The ``jax.sharding.Mesh`` of a jdtensor `Mesh` (axis types default to
  Auto); the mesh checked its dimension names when it was made."""
  import jax  # pylint: disable=g-import-not-at-top
  if mesh.is_single_device() or not mesh.shape():
    raise ValueError(
        f"Mesh {mesh.to_string()!r} has no dimensions, so it has no "
        "jax.sharding.Mesh; use Layout.to_jax_sharding() for a single device.")
  devices = mesh_devices(mesh)
  if len(set(devices)) != len(devices):
    raise ValueError(f"Mesh {mesh.to_string()!r} places two global ids on the "
                     "same device.")
  names = tuple(mesh.dim_names)
  if axis_types is None:
    axis_types = (jax.sharding.AxisType.Auto,) * len(names)
  array = np.empty(len(devices), dtype=object)
  array[:] = devices
  jax_mesh = jax.sharding.Mesh(array.reshape(mesh.shape()), names,
                               axis_types=tuple(axis_types))
  note_mesh(jax_mesh, mesh)
  return jax_mesh


def describe_jax_mesh(jax_mesh: Any) -> dict[str, Any]:
  """What a DTensor mesh of a ``jax.sharding.Mesh`` is made of.

  Returns:
    ``names``, ``shape``, ``devices`` (row-major), ``strings`` (their DTensor
    device strings), and this process's ``local_ids`` (positions) and
    ``local_strings``.

  Raises:
    TypeError: If `jax_mesh` is not a ``jax.sharding.Mesh``.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if not isinstance(jax_mesh, jax.sharding.Mesh):
    raise TypeError(f"jax_mesh must be a jax.sharding.Mesh, got "
                    f"{type(jax_mesh).__name__}.")
  devices = list(jax_mesh.devices.flat)
  strings = [runtime.device_string(d) for d in devices]
  me = runtime.process_index()
  local = [i for i, d in enumerate(devices) if d.process_index == me]
  return {"names": [str(n) for n in jax_mesh.axis_names],
          "shape": list(jax_mesh.devices.shape), "devices": devices,
          "strings": strings, "local_ids": local,
          "local_strings": [strings[i] for i in local]}


def single_device_sharding(device: str) -> Any:
  """``SingleDeviceSharding`` on a DTensor device string."""
  import jax  # pylint: disable=g-import-not-at-top
  # jax 0.12 deprecates the class for this factory (a DeprecationWarning in
  # the user's program); older JAX has only the class.
  make = getattr(jax.sharding, "make_single_device_sharding", None)
  if make is None:
    make = jax.sharding.SingleDeviceSharding
  return make(resolve_device(device))


def named_sharding(jax_mesh: Any, spec: Any) -> Any:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.sharding.NamedSharding(jax_mesh, spec)


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
_ARRAY_LAYOUTS: dict[int, tuple[Any, Any]] = {}
_SHARDING_LAYOUTS: weakref.WeakValueDictionary[int, Any] = (
    weakref.WeakValueDictionary())
_MESHES: collections.OrderedDict[Any, Any] = collections.OrderedDict()
_MESHES_LIMIT = 4096


def note_mesh(jax_mesh: Any, mesh: Any) -> None:
  """Records that `mesh` (a jdtensor Mesh) made `jax_mesh`."""
  with _lock:
    _MESHES.pop(jax_mesh, None)
    _MESHES[jax_mesh] = mesh
    while len(_MESHES) > _MESHES_LIMIT:
      _MESHES.popitem(last=False)


def known_mesh(jax_mesh: Any) -> Any:
  """The jdtensor Mesh most recently turned into `jax_mesh`, or None."""
  return _MESHES.get(jax_mesh)


def note_sharding(sharding: Any, layout: Any) -> None:
  """Records that `layout` made `sharding` (the layout keeps it)."""
  _SHARDING_LAYOUTS[id(sharding)] = layout


def sharding_origin(sharding: Any) -> Any:
  """The Layout that made `sharding`, or None."""
  layout = _SHARDING_LAYOUTS.get(id(sharding))
  if layout is not None and layout._jax_sharding is sharding:  # pylint: disable=protected-access
    return layout
  return None


def remember_layout(array: Any, layout: Any) -> Any:
  """Records that `array` has `layout`; returns `array`."""
  key = id(array)
  try:
    ref = weakref.ref(array, lambda _, key=key: _ARRAY_LAYOUTS.pop(key, None))
  except TypeError:  # Not weakly referenceable: nothing to remember.
    return array
  _ARRAY_LAYOUTS[key] = (ref, layout)
  return array


def recorded_layout(array: Any) -> Any:
  """The Layout jdtensor recorded for `array` or for its sharding, if any."""
  entry = _ARRAY_LAYOUTS.get(id(array))
  if entry is not None and entry[0]() is array:
    return entry[1]
  return sharding_origin(getattr(array, "sharding", None))


def local_jax_devices(layout: Any) -> list[Any]:
  """This client's devices of `layout`'s mesh, in local-device-id order.

  Read off the layout's (cached) sharding, so repeated pack and unpack calls
  do not parse device strings again.
  """
  sharding = layout.to_jax_sharding()
  mesh = layout.mesh
  if mesh.is_single_device() or not hasattr(sharding, "mesh"):
    return [resolve_device(d) for d in mesh.local_devices()]
  flat = sharding.mesh.devices.flat
  first = mesh.min_global_device_id()
  return [flat[i - first] for i in mesh.local_device_ids()]


_SUMS: collections.OrderedDict[Any, Any] = collections.OrderedDict()  # jax mesh -> jitted sum
_SUMS_LIMIT = 64


def _sum_rows(rows: Any) -> Any:
  return rows.sum(axis=0)


def sum_over_devices(devices: Sequence[Any], local_rows: Sequence[np.ndarray]
                     ) -> np.ndarray:
  """One all-reduce over `devices` (every client's), read back here.

  Args:
    devices: Every device taking part, in the same order on every client.
    local_rows: One array per device of this process, in the order they
      appear in `devices`, all of one shape and dtype.

  Returns:
    The element-wise sum of every device's row, on every client.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec  # pylint: disable=g-import-not-at-top
  me = jax.process_index()
  mine = [d for d in devices if d.process_index == me]
  if len(mine) != len(local_rows):
    raise ValueError(f"sum_over_devices: {len(local_rows)} rows for {len(mine)} "
                     "local devices.")
  array = np.empty(len(devices), dtype=object)
  array[:] = list(devices)
  jax_mesh = jax.sharding.Mesh(array, ("devices",))
  with _lock:
    summed = _SUMS.get(jax_mesh)
    if summed is None:
      summed = _SUMS[jax_mesh] = jax.jit(
          _sum_rows, out_shardings=named_sharding(jax_mesh, PartitionSpec()))
      while len(_SUMS) > _SUMS_LIMIT:
        _SUMS.popitem(last=False)
  shards = [jax.device_put(np.asarray(row)[None], d) for row, d in zip(local_rows, mine)]
  rows = jax.make_array_from_single_device_arrays(
      (len(devices), *np.shape(local_rows[0])),
      named_sharding(jax_mesh, PartitionSpec("devices")), shards)
  return np.asarray(summed(rows).addressable_data(0))


def forget_jax_objects() -> None:
  """Drops the JAX meshes and compiled sums this module keeps (they hold
  JAX's devices, and through them its backend); later calls rebuild them."""
  with _lock:
    _MESHES.clear()
    _SUMS.clear()
