"""Mesh creation with DTensor's defaults and errors (``create_mesh`` & co)."""

from __future__ import annotations

import numbers
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np
from jdtensor import _jaxlib_texts
from jdtensor import _logging as logging

from jdtensor import _env, config, runtime
from jdtensor.runtime import interop
from jdtensor.device_spec import DeviceSpec
from jdtensor.errors import BarrierTimeoutError, NotInitializedError
from jdtensor.layout import Mesh

__all__ = ["create_mesh", "create_distributed_mesh", "barrier", "MeshDims"]

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
    interop.resolve_device(device)


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
  runtime.check_health()
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


_TPU_ARG_MESSAGE = (
    "Do not specify {arg} for TPU meshes. It will be filled in automatically "
    "from environmental variables.See api.py for the list of environmental "
    "variables for DTensor.")


def create_distributed_mesh(mesh_dims: MeshDims,
                            mesh_name: str = "",
                            local_devices: Sequence[DeviceSpec | str] | int | None = None,
                            device_type: str | None = None,
                            use_xla_spmd: bool = False,
                            *,
                            num_global_devices: int | None = None,
                            num_clients: int | None = None,
                            client_id: int | None = None) -> Mesh:
  """Creates a mesh spanning every client (DTensor's ``create_distributed_mesh``).

  Global ids are ``arange(N).reshape(shape)``; client k owns the row-major
  slice ``[k*L, (k+1)*L)`` of them, where L is the number of local devices.
  ``mesh.jax_mesh`` spans every client's devices in that order.

  Two signatures, as in the seed:

  * current (TF 2.15+): ``(mesh_dims, mesh_name, local_devices, device_type,
    use_xla_spmd)``;
  * legacy (TF 2.9/2.10): ``(mesh_dims, mesh_name, num_global_devices,
    num_clients, client_id, device_type='CPU')``, used when any of
    `num_global_devices`, `num_clients`, `client_id` is given (or an int is
    passed third, positionally).

  Args:
    mesh_dims: ``[(name, size), ...]`` or ``{name: size}``.
    mesh_name: Name of the mesh.
    local_devices: This client's devices (``'CPU:0'`` strings, full specs or
      DeviceSpecs); default: all of them. Fewer than available is fine.
    device_type: CPU, GPU or TPU; defaults to the type of `local_devices`,
      else CPU.
    use_xla_spmd: Use XLA SPMD (TPU only).
    num_global_devices: Legacy: total devices.
    num_clients: Legacy: number of clients.
    client_id: Legacy: the client to build the mesh for.

  Returns:
    This client's view of the mesh.

  Raises:
    ValueError: DTensor's errors, in DTensor's order and with its messages.
  """
  runtime.check_health()
  if isinstance(local_devices, int) and not isinstance(local_devices, bool):
    num_global_devices, local_devices = local_devices, None
  if (num_global_devices is not None or num_clients is not None or
      client_id is not None):
    return _create_distributed_mesh_legacy(
        mesh_dims, mesh_name, num_global_devices, num_clients, client_id,
        device_type or "CPU")
  dim_names, shape = _normalize_mesh_dims(mesh_dims)
  if not runtime.is_initialized():
    # DTensor-compatible message.
    raise ValueError("Accelerators are uninitialized, please run "
                     "dtensor.initialize_accelerator_system() first.")
  if device_type and device_type.upper() == "TPU" and local_devices is not None:
    # DTensor-compatible message.
    raise ValueError("Do not specify devices for TPU meshes. Using a partial "
                     "list of devices for TPU is not supported.")
  specs, device_type = _make_device_specs(local_devices, device_type)
  if device_type in ("CPU", "GPU"):
    cluster = runtime.cluster() or _env.read_cluster_env()
    base = DeviceSpec(job=cluster.job_name, replica=0, task=cluster.client_id)
    specs = [base.make_merged_spec(d) for d in specs]
    return _distributed_mesh(dim_names, shape, specs, cluster.num_clients,
                             cluster.client_id, mesh_name, use_xla_spmd)
  if device_type == "TPU":
    cluster = runtime.cluster() or _env.read_cluster_env()
    from jdtensor.tpu.mesh import create_tpu_mesh  # pylint: disable=g-import-not-at-top
    mesh = create_tpu_mesh(dim_names, shape, mesh_name,
                           use_xla_spmd=use_xla_spmd)
    _print_context(config.num_global_devices("TPU"), cluster.num_clients,
                   cluster.client_id, "TPU", mesh)
    return mesh
  # DTensor-compatible message.
  raise ValueError(f"Device type {device_type} is not CPU, GPU or TPU")


def _distributed_mesh(dim_names: list[str], shape: list[int],
                      specs: list[DeviceSpec], num_clients: int, client_id: int,
                      mesh_name: str, use_xla_spmd: bool) -> Mesh:
  """The one place that lays out dense ids over clients."""
  num_global = len(specs) * num_clients
  if int(np.prod(shape)) != num_global:
    # DTensor-compatible message (shape printed as a tuple).
    raise ValueError(
        f"Global number of devices ({len(specs)} per client * {num_clients} "
        f"clients = {num_global}) must be equal to total size of the mesh of "
        f"shape {tuple(shape)}")
  global_ids = np.arange(num_global).reshape(shape)
  start = len(specs) * client_id
  local_ids = np.ravel(global_ids)[start:start + len(specs)].tolist()
  mesh = Mesh(dim_names=dim_names, global_device_ids=global_ids,
              local_device_ids=local_ids, local_devices=specs,
              mesh_name=mesh_name, use_xla_spmd=use_xla_spmd)
  if runtime.is_initialized() and client_id == runtime.cluster().client_id:  # type: ignore[union-attr]
    _check_devices_exist(mesh)
  _print_context(num_global, num_clients, client_id, specs[0].device_type or "",
                 mesh)
  return mesh


def _create_distributed_mesh_legacy(mesh_dims: MeshDims, mesh_name: str,
                                    num_global_devices: int | None,
                                    num_clients: int | None,
                                    client_id: int | None,
                                    device_type: str) -> Mesh:
  """The seed's TF 2.9 keyword form, with its checks in its order."""
  dim_names, shape = _normalize_mesh_dims(mesh_dims)
  shape_tuple = tuple(shape)
  if device_type.upper() in ("CPU", "GPU"):
    device_type = device_type.upper()
    if num_global_devices is None:
      num_global_devices = config.num_global_devices(device_type)
    # Seed-compatible messages from here on.
    if num_global_devices <= 0:
      raise ValueError(f"num_global_devices ({num_global_devices}) must be > 0")
    if num_global_devices != int(np.prod(shape)):
      raise ValueError(f"num_global_devices ({num_global_devices}) must be "
                       f"equal to total size of the mesh of shape {shape_tuple}")
    if num_clients is None:
      num_clients = config.num_clients()
    if num_clients <= 0:
      raise ValueError(f"num_clients ({num_clients}) must be > 0")
    if num_clients > 1 and not runtime.is_initialized():
      raise ValueError("Invalid multi-client topology, run "
                       "dtensor.initialize_multi_client() first")
    if client_id is None:
      client_id = config.client_id()
    if client_id < 0:
      raise ValueError(f"client_id ({client_id}) must be >= 0")
    if client_id >= num_clients:
      raise ValueError(f"client_id ({client_id}) must be < {num_clients}")
    if num_global_devices % num_clients != 0:
      raise ValueError(f"num_global_devices ({num_global_devices}) must be "
                       f"divisible by num_clients ({num_clients})")
    num_local = num_global_devices // num_clients
    available = config.num_local_devices(device_type)
    if num_local > available:
      raise ValueError(f"Not enough devices; {num_local} needed, only "
                       f"{available} available")
    specs = config.local_devices(device_type, client_id)[:num_local]
    return _distributed_mesh(dim_names, shape, specs, num_clients, client_id,
                             mesh_name, False)
  if device_type.upper() == "TPU":
    for arg, value in (("num_global_devices", num_global_devices),
                       ("num_clients", num_clients), ("client_id", client_id)):
      if value is not None:
        raise ValueError(_TPU_ARG_MESSAGE.format(arg=arg))
    cluster = runtime.cluster() or _env.read_cluster_env()
    from jdtensor.tpu.mesh import create_tpu_mesh  # pylint: disable=g-import-not-at-top
    mesh = create_tpu_mesh(dim_names, shape, mesh_name)
    _print_context(config.num_global_devices("TPU"), cluster.num_clients,
                   cluster.client_id, "TPU", mesh)
    return mesh
  raise ValueError(f"Device type {device_type} is not CPU, GPU or TPU")


# DTensor's default barrier time-out: "24 hours to stand in for infinite".
_DEFAULT_BARRIER_TIMEOUT_MS = 24 * 60 * 60 * 1000
# The coordination service takes a 32-bit int of milliseconds (24.8 days).
_MAX_BARRIER_TIMEOUT_MS = 2**31 - 1


def _barrier_devices(mesh: object) -> tuple[list[Any], int]:
  """The devices of `mesh` (a jdtensor `Mesh` or a JAX ``Mesh``), in order,
  and the mesh's size."""
  if isinstance(mesh, Mesh):
    return list(mesh.jax_mesh.devices.flat), mesh.size
  import jax  # pylint: disable=g-import-not-at-top
  if isinstance(mesh, jax.sharding.Mesh):
    return list(mesh.devices.flat), int(mesh.devices.size)
  kind = type(mesh)
  name = kind.__qualname__ if kind.__module__ == "builtins" else (
      f"{kind.__module__}.{kind.__qualname__}")
  raise TypeError(f"barrier's mesh must be a jdtensor Mesh (jdtensor.create_distributed_mesh)"
                  f" or a JAX jax.sharding.Mesh with devices (jax.make_mesh), got {name}")


def _check_barrier_timeout(timeout_in_ms: object) -> int:
  """`barrier`'s time-out: None (24 h, DTensor's default) or a positive int.

  Raises:
    TypeError: For anything but an int (a str, a float such as nan or 1e20).
    ValueError: For an int out of 1..2**31-1 milliseconds.
  """
  if timeout_in_ms is None:
    return _DEFAULT_BARRIER_TIMEOUT_MS
  if not isinstance(timeout_in_ms, numbers.Integral) or isinstance(timeout_in_ms,
                                                                   bool):
    raise TypeError(f"timeout_in_ms must be an int number of milliseconds, got "
                    f"{timeout_in_ms!r} of type {type(timeout_in_ms).__name__}.")
  if not 1 <= timeout_in_ms <= _MAX_BARRIER_TIMEOUT_MS:
    raise ValueError(f"timeout_in_ms={timeout_in_ms!r} must be from 1 to "
                     f"{_MAX_BARRIER_TIMEOUT_MS} milliseconds (about 24.8 days); "
                     "None waits DTensor's default of 24 hours.")
  return int(timeout_in_ms)


def barrier(mesh: Any, barrier_name: str | None = None,
            timeout_in_ms: int | None = None) -> None:
  """Blocks until every client reaches this point (DTensor's ``barrier``).

  In multi-client runs, a coordination-service barrier with DTensor's
  per-name ids (``name:0``, ``name:1``, ...), bounded by `timeout_in_ms`;
  then an all-reduce of ones over every device of `mesh`, checked against the
  mesh size. (DTensor runs the all-reduce first, so a missing client blocks
  it forever; here it raises `BarrierTimeoutError`.)

  Args:
    mesh: The mesh whose devices take part: a jdtensor `Mesh`, or a JAX
      ``jax.sharding.Mesh`` (``jax.make_mesh(...)``).
    barrier_name: Name for logs and the barrier id; default ``(barrier)``.
    timeout_in_ms: Coordination barrier time-out, an int of milliseconds from
      1 to 2**31-1; default 24 h (DTensor's).

  Raises:
    TypeError: For a `mesh` of another type (a JAX ``AbstractMesh`` has no
      devices), or a bad `timeout_in_ms`.
    ValueError: For a bad `timeout_in_ms`; DTensor's message if the
      all-reduce gives the wrong count.
    jdtensor.BarrierTimeoutError: If not every client arrived in time.
  """
  devices, size = _barrier_devices(mesh)
  runtime.check_health()
  timeout_in_ms = _check_barrier_timeout(timeout_in_ms)
  if barrier_name is None:
    barrier_name = "(barrier)"
  logging.info("entering barrier before op: %s", barrier_name)
  if runtime.state().multi_client:
    # Unlike DTensor, the bounded coordination barrier comes first: a client
    # that never arrives then raises BarrierTimeoutError instead of leaving
    # the others blocked inside the device all-reduce.
    _wait_at_barrier(_next_barrier_id(barrier_name), timeout_in_ms)
  me = runtime.process_index()
  ones = [np.ones([1], np.float32) for d in devices if d.process_index == me]
  value = float(interop.sum_over_devices(devices, ones)[0])
  if value != size:
    # DTensor-compatible message.
    raise ValueError("Global barrier produced wrong mesh size : {0} while mesh "
                     "has actualsize : {1}".format(value, size))
  logging.info("finished running barrier across all clients after op: %s",
               barrier_name)


# DTensor's per-name barrier ids (its mesh_util._BARRIER_DICT): every client
# calls barrier() in the same order, so the n-th call with a name has the
# same id everywhere.
_barrier_counts: dict[str, int] = {}
_barrier_lock = threading.Lock()


def _next_barrier_id(name: str) -> str:
  """``name:0``, ``name:1``, ..."""
  with _barrier_lock:
    count = _barrier_counts.get(name, 0)
    _barrier_counts[name] = count + 1
    return f"{name}:{count}"


def _wait_at_barrier(barrier_id: str, timeout_ms: int) -> None:
  """A coordination-service barrier over every client.

  Raises:
    BarrierTimeoutError: If not every client arrived within `timeout_ms`.
    RuntimeError: If the coordination service reported another failure.
  """
  from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
  client = jax_private.coordination_client()
  if client is None:
    raise NotInitializedError("No multi-client runtime: call "
                              "initialize_accelerator_system() first.")
  try:
    client.wait_at_barrier(barrier_id, int(timeout_ms))
  except Exception as e:  # JaxRuntimeError has no stable import path.
    if _jaxlib_texts.BARRIER_DEADLINE_EXCEEDED in str(e):
      raise BarrierTimeoutError(
          f"Barrier {barrier_id!r} timed out after {timeout_ms} ms: not every "
          "client arrived. A client that is slow, stuck, or has exited never "
          "reaches it; check the other clients' output.") from e
    raise RuntimeError(f"Barrier {barrier_id!r} failed: {e}") from e
