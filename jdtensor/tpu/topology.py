"""TPU topology: core ids, their merge across hosts, and simulated TPU pods.

DTensor's TPU system (``tpu_util.initialize_tpu_system``) has every host find
its local TPU core ids, merges them into one global table with an all-reduce
(each host fills its slot of a zero vector; a sum over all devices merges
them), and builds the topology from the merged core locations. This module
holds the pure pieces; `jdtensor.tpu.system` runs them (and the merge) once at
initialisation, and `jdtensor.runtime` keeps the result.

Core id of a core at chip (x, y, z), core c, in an X x Y x Z slice with C cores
per chip: ``c + C*(x + X*(y + Y*z))``.

Simulated TPU pods (``JDTENSOR_SIMULATED_TPU_TOPOLOGY="XxYxZxC"``) treat each
client's CPU devices as its TPU cores: hosts are 2x2x1-chip blocks (DTensor's
host bounds) clipped to the slice, numbered x fastest, then y, then z; client
k is host k; inside a host, cores are numbered core fastest, then x, then y.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jdtensor import _env

__all__ = [
    "JDTENSOR_SIMULATED_TPU_TOPOLOGY",
    "SimulatedTopology",
    "read_simulated_topology",
    "Topology",
    "core_id",
    "core_ids_to_locations",
    "device_core_ids",
    "build_topology",
]

JDTENSOR_SIMULATED_TPU_TOPOLOGY = _env.JDTENSOR_SIMULATED_TPU_TOPOLOGY


def core_id(x: int, y: int, z: int, core: int, bounds: Sequence[int]) -> int:
  """The core id of a location in a slice of `bounds` = [X, Y, Z, C]."""
  return core + bounds[3] * (x + bounds[0] * (y + bounds[1] * z))


def core_ids_to_locations(ids: Sequence[int], bounds: Sequence[int]
                          ) -> list[tuple[int, int, int, int]]:
  """Inverse of `core_id` (DTensor's ``tpu_core_ids_to_locations``)."""
  x_size, y_size, _, cores = bounds
  out = []
  for i in ids:
    chip, core = divmod(int(i), cores)
    out.append((chip % x_size, (chip // x_size) % y_size,
                chip // (x_size * y_size), core))
  return out


@dataclass(frozen=True)
class SimulatedTopology:
  """A TPU slice simulated on CPU devices (`JDTENSOR_SIMULATED_TPU_TOPOLOGY`).

  Attributes:
    shape: (X, Y, Z, C): chips along x, y, z and cores per chip.
  """
  shape: tuple[int, int, int, int]

  @property
  def text(self) -> str:
    """The shape as ``JDTENSOR_SIMULATED_TPU_TOPOLOGY`` writes it."""
    return "x".join(map(str, self.shape))

  @property
  def host_chips(self) -> tuple[int, int]:
    """Chips of one host along x and y (2x2, clipped to the slice)."""
    return min(2, self.shape[0]), min(2, self.shape[1])

  @property
  def hosts_along(self) -> tuple[int, int, int]:
    hx, hy = self.host_chips
    return self.shape[0] // hx, self.shape[1] // hy, self.shape[2]

  @property
  def num_hosts(self) -> int:
    nx, ny, nz = self.hosts_along
    return nx * ny * nz

  @property
  def cores_per_host(self) -> int:
    hx, hy = self.host_chips
    return hx * hy * self.shape[3]

  def host_locations(self, host: int) -> list[tuple[int, int, int, int]]:
    """Host `host`'s cores in local-ordinal order (core, then x, then y)."""
    nx, ny, _ = self.hosts_along
    hx, hy = self.host_chips
    x0, y0, z = (host % nx) * hx, (host // nx) % ny * hy, host // (nx * ny)
    return [(x0 + dx, y0 + dy, z, c) for dy in range(hy) for dx in range(hx)
            for c in range(self.shape[3])]

  def host_core_ids(self, host: int) -> list[int]:
    return [core_id(*loc, self.shape) for loc in self.host_locations(host)]


def read_simulated_topology(environ: Mapping[str, str] | None = None
                            ) -> SimulatedTopology | None:
  """The simulated slice ``JDTENSOR_SIMULATED_TPU_TOPOLOGY`` names; None when
  unset.

  Raises:
    ConfigError: For a malformed value (see `_env.read_simulated_tpu_shape`).
  """
  shape = _env.read_simulated_tpu_shape(environ)
  return None if shape is None else SimulatedTopology(shape)


@dataclass(frozen=True)
class Topology:
  """The merged TPU topology of the whole cluster (DTensor's Topology).

  Attributes:
    mesh_shape: [X, Y, Z, cores_per_chip] from the merged locations.
    device_coordinates: (num_tasks, devices_per_task, 4) locations by task
      and local ordinal.
    core_ids: Core id per task-device ordinal (the merged table).
  """
  mesh_shape: tuple[int, int, int, int]
  device_coordinates: np.ndarray
  core_ids: tuple[int, ...]

  def task_ordinal(self) -> dict[tuple[int, int, int, int], tuple[int, int]]:
    """location -> (task, local ordinal)."""
    tasks, per_task, _ = self.device_coordinates.shape
    return {tuple(int(v) for v in self.device_coordinates[t, k]): (t, k)
            for t in range(tasks) for k in range(per_task)}


def build_topology(core_ids: Sequence[int], bounds: Sequence[int],
                   num_tasks: int) -> Topology:
  """DTensor's ``_create_tpu_topology`` from the merged core ids."""
  locations = np.array(core_ids_to_locations(core_ids, bounds), dtype=np.int64)
  if locations.min(axis=0).tolist() != [0, 0, 0, 0]:
    raise ValueError(f"TPU core locations do not start at 0: minimum "
                     f"{locations.min(axis=0).tolist()}.")
  shape = tuple(int(v) + 1 for v in locations.max(axis=0))
  coords = locations.reshape(num_tasks, len(core_ids) // num_tasks, 4)
  coords.setflags(write=False)
  return Topology(shape, coords, tuple(int(i) for i in core_ids))  # type: ignore[arg-type]


def device_core_ids(devices: Sequence[Any]) -> tuple[list[int], list[int]]:
  """Core ids of real TPU devices, from their ``coords`` and ``core_on_chip``.

  Multi-slice (devices with several ``slice_index`` values, ``MEGASCALE_*``):
  every slice has its own coordinates, so the slices are stacked along z
  (slice s holds z in ``[s*Z, (s+1)*Z)``): core ids stay unique, and DTensor's
  ring orders put the slices on a mesh's outermost axis (it is z-major), so
  ``create_tpu_mesh(["slice", ...], [num_slices, ...])`` keeps each slice in
  one index of its first axis, with the ICI rings inside the slices.

  Args:
    devices: Every TPU device of the cluster (``jax.devices('tpu')``, or fake
      devices with ``process_index``, ``id``, ``coords``, ``core_on_chip`` and
      optionally ``slice_index``).

  Returns:
    (bounds [X, Y, Z, C] of the slice, or of the stacked slices; core id per
    task-device ordinal).

  Raises:
    ValueError: The slices differ in shape.
  """
  slices = [int(getattr(d, "slice_index", 0) or 0) for d in devices]
  shapes = {}
  for d, s in zip(devices, slices):
    loc = np.array(list(d.coords) + [d.core_on_chip])
    shapes[s] = np.maximum(shapes.get(s, loc), loc)
  per_slice = {s: [int(v) + 1 for v in shape] for s, shape in shapes.items()}
  first = next(iter(per_slice.values()))
  if any(b != first for b in per_slice.values()):
    raise ValueError(
        "The TPU slices differ in shape (" + ", ".join(
            f"slice {s}: {'x'.join(map(str, b))}" for s, b in sorted(per_slice.items()))
        + "); a multi-slice mesh needs slices of one topology.")
  z = first[2]
  bounds = first[:2] + [z * (max(slices) + 1)] + first[3:]
  where = {id(d): s for d, s in zip(devices, slices)}
  ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
  return bounds, [core_id(d.coords[0], d.coords[1], d.coords[2] + z * where[id(d)],
                          d.core_on_chip, bounds) for d in ordered]
