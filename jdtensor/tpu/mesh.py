"""DTensor's ``create_tpu_mesh``, ``get_device_ids`` and ``get_device_locations``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jdtensor import _logging as logging

from jdtensor import config, runtime
from jdtensor.layout import Mesh
from jdtensor.tpu import ring

__all__ = ["create_tpu_mesh", "get_device_ids", "get_device_locations"]


def create_tpu_mesh(mesh_dim_names: Sequence[str],
                    mesh_shape: Sequence[int],
                    mesh_name: str,
                    ring_dims: int | None = None,
                    ring_axes: Sequence[str] | None = None,
                    ring_bounds: Sequence[int] | None = None,
                    can_split_host_across_rings: bool = True,
                    build_ring_across_rings: bool = False,
                    rotate_ring_across_rings: bool = False,
                    use_xla_spmd: bool = False) -> Mesh:
  """A mesh over every TPU core, ordered so that rings follow the torus.

  DTensor's algorithm bit for bit (see `jdtensor.tpu.ring.ring_order`). The
  mesh's `jax_mesh` holds the devices in that order; its local ids are this
  client's positions in it. The name is registered: creating two meshes of
  the same name is an error, as in DTensor.

  Args:
    mesh_dim_names: Names of the mesh dimensions.
    mesh_shape: Shape; its size must equal the number of TPU cores.
    mesh_name: Name; '' picks ``mesh_<n>``, the same on every client
      (DTensor's ``mesh_<time>`` differs between clients).
    ring_dims: See `ring_order`.
    ring_axes: See `ring_order`.
    ring_bounds: See `ring_order`.
    can_split_host_across_rings: See `ring_order`.
    build_ring_across_rings: See `ring_order`.
    rotate_ring_across_rings: See `ring_order`.
    use_xla_spmd: Use XLA SPMD.

  Raises:
    ValueError: DTensor's messages, in DTensor's order.
  """
  logging.info("Building a TPU mesh %s of shape %s", mesh_name, mesh_shape)
  logging.info("Requested ring_dims: %s", ring_dims)
  logging.info("Requested ring_axes: %s", ring_axes)
  logging.info("Requested ring_bounds: %s", ring_bounds)
  logging.info("Requested can_split_host_across_rings: %s",
               can_split_host_across_rings)
  if not mesh_name:
    mesh_name = runtime.next_auto_mesh_name()
  logging.info("Requested mesh_name: %s", mesh_name)
  shape = list(mesh_shape)
  logging.info("Actual ring_dims: %s", ring.check_ring_dims(ring_dims, shape))
  logging.info("Actual ring_axes: %s", ring.check_ring_axes(ring_axes))
  topology = runtime.state().tpu_topology
  if topology is None:
    # DTensor-compatible message.
    raise ValueError("Invalid TPU topology, run dtensor.initialize_tpu_system() "
                     "first")
  locations = ring.ring_order(
      topology.mesh_shape, shape, ring_dims=ring_dims, ring_axes=ring_axes,
      ring_bounds=ring_bounds,
      can_split_host_across_rings=can_split_host_across_rings,
      build_ring_across_rings=build_ring_across_rings,
      rotate_ring_across_rings=rotate_ring_across_rings)
  logging.vlog(1, "Permutated core locations: %s", locations)
  where = topology.task_ordinal()
  client = runtime.cluster().client_id  # type: ignore[union-attr]
  position = {loc: d for d, loc in enumerate(locations)}
  per_task = topology.device_coordinates.shape[1]
  local_ids = [position[tuple(int(v) for v in topology.device_coordinates[client, k])]
               for k in range(per_task)]
  mesh = Mesh(list(mesh_dim_names), np.arange(len(locations)).reshape(shape),
              local_ids, [d.to_string() for d in config.local_devices("TPU")],
              mesh_name=mesh_name, use_xla_spmd=use_xla_spmd)
  devices = [runtime.client_devices("TPU", task)[ordinal]
             for task, ordinal in (where[loc] for loc in locations)]
  runtime.register_tpu_mesh(mesh_name, devices)
  return mesh


def _check_tpu_mesh(mesh: Mesh, client_id: int | None, what: str) -> None:
  if mesh.device_type() != "TPU":
    # DTensor-compatible message.
    raise ValueError("The mesh must be a TPU mesh")
  if client_id is not None and client_id != config.client_id():
    # DTensor-compatible message.
    raise NotImplementedError(f"Looking up other clients' {what} is not "
                              "supported")


def get_device_ids(mesh: Mesh, client_id: int | None = None) -> list[int]:
  """This client's device ids in a TPU mesh (DTensor semantics)."""
  _check_tpu_mesh(mesh, client_id, "device IDs")
  return mesh.local_device_ids()


def get_device_locations(mesh: Mesh, client_id: int | None = None
                         ) -> list[dict[str, int]]:
  """This client's device locations in a TPU mesh (DTensor semantics)."""
  _check_tpu_mesh(mesh, client_id, "device locations")
  return mesh.local_device_locations()
