"""Mesh creation with DTensor's defaults and errors (``create_mesh`` & co)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Union

import numpy as np
from absl import logging

from jdtensor import _interop, config
from jdtensor.device_spec import DeviceSpec
from jdtensor.layout import Mesh

__all__ = ["create_mesh", "MeshDims"]

MeshDims = Union[Sequence[tuple[str, int]], Mapping[str, int]]


def _normalize_mesh_dims(mesh_dims: MeshDims, num_devices: int | None = None
                         ) -> tuple[list[str], list[int]]:
  """The one `mesh_dims` normaliser: list of pairs or dict -> (names, sizes).

  Never mutates the caller's argument. When `num_devices` is given, a single
  dimension of size -1 takes all devices (`create_mesh` semantics).

  Raises:
    TypeError: If `mesh_dims` is not a list of (str, int) pairs or a dict.
    ValueError: For an empty list or a size below 1.
  """
  if isinstance(mesh_dims, Mapping):
    pairs = list(mesh_dims.items())
  elif isinstance(mesh_dims, Sequence) and not isinstance(mesh_dims, str):
    pairs = list(mesh_dims)
  else:
    raise TypeError("mesh_dims must be a list of (name, size) pairs or a dict "
                    f"{{name: size}}, got {mesh_dims!r}.")
  if not pairs:
    raise ValueError("mesh_dims must name at least one dimension, got "
                     f"{mesh_dims!r}.")
  names, sizes = [], []
  for pair in pairs:
    if (not isinstance(pair, Sequence) or isinstance(pair, str) or
        len(pair) != 2 or not isinstance(pair[0], str) or
        not isinstance(pair[1], numbers.Integral) or isinstance(pair[1], bool)):
      raise TypeError(f"mesh_dims entries must be (str, int) pairs, got {pair!r} "
                      f"in {mesh_dims!r}.")
    names.append(pair[0])
    sizes.append(int(pair[1]))
  if num_devices is not None and len(sizes) == 1 and sizes[0] == -1:
    sizes[0] = num_devices
  for name, size in zip(names, sizes):
    if size < 1:
      raise ValueError(f"mesh_dims: dimension {name!r} has size {size}; sizes "
                       f"must be >= 1. Got {mesh_dims!r}.")
  return names, sizes


def _make_device_specs(devices: Sequence[DeviceSpec | str] | None,
                       device_type: str | None) -> tuple[list[DeviceSpec], str]:
  """DTensor's ``_make_device_specs``: devices as specs, and their type."""
  if devices is None:
    if device_type is None:
      device_type = "CPU"
    return config.local_devices(device_type), device_type.upper()
  if isinstance(devices, (str, DeviceSpec)) or not isinstance(devices, Sequence):
    raise TypeError("devices must be a list of device strings or DeviceSpecs, "
                    f"got {devices!r}.")
  if not devices:
    raise ValueError("devices must not be empty; pass None to use every local "
                     "device.")
  specs = []
  for d in devices:
    if isinstance(d, DeviceSpec):
      specs.append(d)
    elif isinstance(d, str):
      specs.append(DeviceSpec.from_string(d))
    else:
      raise TypeError(f"devices must hold device strings or DeviceSpecs, got "
                      f"{d!r} of type {type(d).__name__}.")
  first_type = specs[0].device_type
  if first_type is None:
    raise ValueError(f"Device {devices[0]!r} has no device type; use e.g. "
                     "'CPU:0'.")
  if device_type is None:
    device_type = first_type
  if device_type.upper() != first_type.upper():
    # DTensor-compatible message.
    raise ValueError(f"Conflicting devices {specs} and device_type {device_type}")
  return specs, device_type.upper()


def _print_context(num_global_devices: int, num_clients: int, client_id: int,
                   device_type: str, mesh: Mesh) -> None:
  # DTensor's log lines, verbatim.
  logging.info("This is client %d of %d clients", client_id, num_clients)
  logging.info("Number of global %s devices: %d", device_type.upper(),
               num_global_devices)
  logging.info("Global device IDs: %s", mesh.global_device_ids())
  logging.info("Local device IDs: %s", mesh.local_device_ids())
  logging.info("Local devices: %s", mesh.local_devices())


def _check_devices_exist(mesh: Mesh) -> None:
  """Raises a clear ValueError for a local device this process lacks."""
  for device in mesh.local_devices():
    _interop.resolve_device(device)


def create_mesh(mesh_dims: MeshDims | None = None,
                mesh_name: str = "",
                devices: Sequence[DeviceSpec | str] | None = None,
                device_type: str | None = None,
                use_xla_spmd: bool = False) -> Mesh:
  """Creates a single-client mesh (DTensor's ``create_mesh``).

  Args:
    mesh_dims: ``[(name, size), ...]`` or ``{name: size}``; defaults to
      ``[('x', number of devices)]``. One dimension of size -1 takes all
      devices. The argument is never modified.
    mesh_name: Name of the mesh.
    devices: Devices to use, as strings (``'CPU:1'``, full specs) or
      DeviceSpecs; defaults to every local device of `device_type`. Fewer
      devices than available is fine.
    device_type: CPU, GPU or TPU; defaults to the type of `devices`, else CPU.
    use_xla_spmd: Use XLA SPMD (TPU only).

  Returns:
    The mesh, global ids ``arange(n)`` in row-major order, all local.

  Raises:
    ValueError: DTensor's errors (size mismatch, conflicting or mixed device
      types, XLA SPMD off TPU), or a device that does not exist in this
      process (TF segfaults later instead).
    TypeError: For arguments of the wrong type.
  """
  specs, device_type = _make_device_specs(devices, device_type)
  base = DeviceSpec(job=config.job_name(), replica=0, task=0)
  specs = [base.make_merged_spec(d) for d in specs]
  if mesh_dims is None:
    mesh_dims = [("x", len(specs))]
  dim_names, shape = _normalize_mesh_dims(mesh_dims, len(specs))
  if int(np.prod(shape)) != len(specs):
    # DTensor-compatible message.
    raise ValueError(f"length of devices ({len(specs)}) must be equal to total "
                     f"size of the mesh of shape {shape}")
  global_ids = np.arange(len(specs)).reshape(shape)
  mesh = Mesh(dim_names=dim_names, global_device_ids=global_ids,
              local_device_ids=np.ravel(global_ids).tolist(),
              local_devices=specs, mesh_name=mesh_name,
              use_xla_spmd=use_xla_spmd)
  _check_devices_exist(mesh)
  _print_context(len(specs), 1, 0, device_type, mesh)
  return mesh
