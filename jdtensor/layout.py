"""DTensor's `Mesh` and `Layout`, as pure Python over numpy.

PURE: importing this module never imports jax. The JAX conversions
(`Mesh.jax_mesh`, `Mesh.from_jax_mesh`, `Layout.to_jax_sharding`,
`Layout.from_jax_sharding`) call down into `jdtensor.runtime.interop` when called:
the one sanctioned upward import in the layer table (docs/guides/architecture.md),
which never imports this module back.

Constructor checks, string formats and messages follow TF DTensor 2.21
exactly (``Mesh(...)`` runs the Python constructor's 13 checks in order;
``Mesh.from_string`` runs the C++ ``Mesh::FromString``/``GetMesh`` checks).
Where TF would crash (``std::stoi`` on a bad id) or accept a string it cannot
use, jdtensor raises a `ValueError` that shows the offending part instead.
"""

from __future__ import annotations

import enum
import itertools
import numbers
import re
from collections import namedtuple
from collections.abc import Sequence
from typing import Any

import numpy as np

from jdtensor.device_spec import DeviceSpec

__all__ = [
    "UNSHARDED",
    "MATCH",
    "EMPTY_MESH",
    "USE_XLA_SPMD_STRING",
    "MeshDimension",
    "LayoutType",
    "Mesh",
    "Layout",
]

UNSHARDED = "unsharded"
MATCH = "match"
_ANY = "any"
_SCALAR = "scalar"
EMPTY_MESH = "empty_mesh"
_EMPTY_LAYOUT = "empty_layout"
USE_XLA_SPMD_STRING = "use_xla_spmd"
_RESERVED_DIM_NAMES = (_ANY, MATCH, UNSHARDED)
# The largest mesh jdtensor builds (2**20 devices: well above any TPU pod),
# checked before anything is allocated.
MAX_MESH_SIZE = 2**20
# Characters the mesh string format uses as separators.
_DIM_NAME_FORBIDDEN = re.compile(r"[|,=:*\s]")

MeshDimension = namedtuple("MeshDimension", ["name", "size"])


class LayoutType(enum.Enum):
  """DTensor's layout kinds."""
  STATIC = "STATIC"
  PARTED = "PARTED"
  SINGLE_DEVICE = "SINGLE_DEVICE"


def _device_to_string(device: Any, arg: str) -> str:
  if isinstance(device, DeviceSpec):
    return device.to_string()
  if isinstance(device, str):
    return DeviceSpec.from_string(device).to_string()
  raise TypeError(f"{arg} must hold DeviceSpec objects or device strings, got "
                  f"{device!r} of type {type(device).__name__}.")


def _set_repr(items: set[str]) -> str:
  # Sorted so that the message is the same on every run.
  return "{" + ", ".join(repr(i) for i in sorted(items)) + "}"


def _shorten(text: str, limit: int = 200) -> str:
  return text if len(text) <= limit else text[:limit - 20] + "..." + text[-15:]


def _parse_int_list(field: str, text: str, mesh_str: str) -> list[int]:
  if not text:
    return []
  items = text.split(",")
  if len(items) > MAX_MESH_SIZE:
    raise ValueError(f"Mesh string {_shorten(mesh_str)!r}: {field} lists "
                     f"{len(items):,} ids; jdtensor supports at most "
                     f"{MAX_MESH_SIZE:,}.")
  out = []
  for item in items:
    if not re.fullmatch(r"-?[0-9]{1,9}", item, re.ASCII):
      raise ValueError(f"Mesh string {_shorten(mesh_str)!r}: {field} contains "
                       f"{_shorten(item, 40)!r}, which is not an integer of at "
                       "most 9 digits.")
    out.append(int(item))
  return out


def _check_dim_names(dim_names: Sequence[Any]) -> None:
  """Mesh dimension names: str, not reserved, not repeated, no separators.

  Raises:
    TypeError: For a name that is not a str.
    ValueError: DTensor's messages for repeated and reserved names; a clear
      one for a name the mesh string format could not hold.
  """
  seen: set[str] = set()
  for name in dim_names:
    if not isinstance(name, str):
      raise TypeError(f"dim_names must be a list of str, got {list(dim_names)!r}.")
    if name in seen:
      raise ValueError("repeated mesh dimension")  # DTensor-compatible.
    if name in _RESERVED_DIM_NAMES:
      # DTensor-compatible message.
      raise ValueError(f"mesh dimension name {name} is reserved")
    if not name or _DIM_NAME_FORBIDDEN.search(name):
      raise ValueError(
          f"Mesh dimension name {name!r} cannot be used: a name must be "
          "non-empty and without '|', ',', '=', ':', '*' or white space (the "
          "mesh string format uses them as separators).")
    seen.add(name)


class Mesh:
  """A DTensor mesh: named dimensions over dense global device ids.

  Global device ids are ``0..N-1`` (possibly offset) in row-major order over
  the mesh shape; each client owns the ids in `local_device_ids()`, placed on
  the devices in `local_devices()`. `jax_mesh` gives the equivalent
  ``jax.sharding.Mesh``.

  Args:
    dim_names: Names of the mesh dimensions.
    global_device_ids: ndarray of consecutive ids, shaped like the mesh.
    local_device_ids: This client's ids (a list of ints).
    local_devices: This client's devices (a list of DeviceSpecs or strings),
      one per local id.
    mesh_name: Optional name; it takes part in equality, as in DTensor.
    global_devices: Optional list of every device in global-id order.
    use_xla_spmd: Use XLA SPMD (TPU meshes only, as in DTensor).

  Raises:
    ValueError: DTensor's 13 constructor checks, in DTensor's order and
      with its messages.
    TypeError: If a device or id has the wrong type.
  """

  def __init__(self,
               dim_names: Sequence[str],
               global_device_ids: np.ndarray,
               local_device_ids: list[int],
               local_devices: list[DeviceSpec | str],
               mesh_name: str = "",
               global_devices: list[DeviceSpec | str] | None = None,
               use_xla_spmd: bool = False):
    # The checks below are DTensor-compatible: same order, same messages.
    if not isinstance(global_device_ids, np.ndarray):
      raise ValueError("Variable global_device_ids must be an ndarray.")
    if global_device_ids.size == 0:
      raise ValueError("Variable global_device_ids must be non-empty.")
    flat = np.ravel(global_device_ids)
    if not np.issubdtype(flat.dtype, np.integer):
      raise TypeError("global_device_ids must hold integers, got dtype "
                      f"{global_device_ids.dtype}.")
    if np.any(flat - np.arange(flat.size) != flat[0]):
      raise ValueError("global_device_ids must sequentially increase: %s" %
                       global_device_ids)
    if isinstance(dim_names, str) or not isinstance(dim_names, Sequence):
      raise TypeError(f"dim_names must be a list of str, got {dim_names!r}.")
    if len(dim_names) != global_device_ids.ndim:
      raise ValueError("Number of mesh dimensions does not match number of "
                       "dimension names.")
    if not isinstance(local_device_ids, list):
      raise ValueError("Variable local_device_ids must be a list of integers.")
    if not isinstance(local_devices, list):
      raise ValueError("Variable local_devices must be a list of DeviceSpecs.")
    if global_devices and not isinstance(global_devices, list):
      raise ValueError("Variable global_devices must be a list of DeviceSpecs.")
    if not local_devices and not global_devices:
      raise ValueError("Empty list of devices not allowed.")

    local_strs = [_device_to_string(d, "local_devices") for d in local_devices]
    local_specs = [DeviceSpec.from_string(s) for s in local_strs]
    global_strs = [_device_to_string(d, "global_devices")
                   for d in (global_devices or [])]
    global_specs = [DeviceSpec.from_string(s) for s in global_strs]

    local_set = set(local_specs)
    only_host_cpu = len(local_set) == 1 and local_specs[0].device_type == "CPU"
    if not only_host_cpu and len(local_devices) != len(local_set):
      raise ValueError(
          "Duplicate devices found in mesh specification %s." %
          [d for d in local_devices if local_devices.count(d) > 1])
    if len(local_device_ids) != len(local_devices):
      raise ValueError("Variable local_device_ids does not have same size as "
                       "local_devices.")
    if len(local_device_ids) > flat.size:
      raise ValueError("Cannot have more local than gobal device IDs.")

    specs = local_specs or global_specs
    device_types = {s.device_type for s in specs}
    if None in device_types:
      raise ValueError("device_type is required")
    if len(device_types) > 1:
      raise ValueError("Devices containing multiple device_types : %s" %
                       _set_repr(device_types))  # type: ignore[arg-type]
    device_type = specs[0].device_type
    if use_xla_spmd and device_type != "TPU":
      raise ValueError("XLA SPMD is not currently not supported for %s mesh." %
                       device_type)

    # Beyond DTensor: checks its C++ layer skips, which a JAX mesh and the
    # mesh string format need (TF's constructor accepts ['x', 'x'] and 'x=1,y',
    # which then cannot round-trip).
    _check_dim_names(dim_names)
    if not isinstance(mesh_name, str):
      raise TypeError(f"mesh_name must be a str, got {mesh_name!r}.")
    if "|" in mesh_name or mesh_name == EMPTY_MESH:
      raise ValueError(f"mesh_name={mesh_name!r} cannot be used: a mesh name may "
                       f"not contain '|' or be {EMPTY_MESH!r} (the mesh string "
                       "format uses them).")
    ids = []
    for i in local_device_ids:
      if not isinstance(i, numbers.Integral) or isinstance(i, bool):
        raise TypeError(f"local_device_ids must hold ints, got {i!r} of type "
                        f"{type(i).__name__}.")
      ids.append(int(i))
    self._init_fields(mesh_name, list(dim_names), global_device_ids, ids,
                      local_strs, global_strs, bool(use_xla_spmd))

  # -- construction helpers ----------------------------------------------------

  def _init_fields(self, name: str, dim_names: list[str], global_ids: np.ndarray,
                   local_ids: list[int], local_devices: list[str],
                   global_devices: list[str], use_xla_spmd: bool,
                   single_device: str | None = None) -> None:
    self._name = name
    self._dim_names = tuple(dim_names)
    ids = np.array(global_ids, dtype=np.int64)
    ids.setflags(write=False)
    self._global_ids = ids
    self._local_ids = tuple(local_ids)
    self._local_devices = tuple(local_devices)
    self._global_devices = tuple(global_devices)
    self._use_xla_spmd = use_xla_spmd
    self._single_device = single_device
    self._jax_mesh_cache: Any = None
    if ids.size:
      first = int(ids.flat[0])
      bad = [i for i in local_ids if not first <= i < first + ids.size]
      if bad:
        raise ValueError(
            f"local_device_ids {list(local_ids)} contains {bad[0]}, which is not "
            f"a global device id of this mesh ({first}..{first + ids.size - 1}).")
      if len(set(local_ids)) != len(local_ids):
        raise ValueError(
            f"local_device_ids {list(local_ids)} contains duplicates.")

  @classmethod
  def _from_fields(cls, *args: Any, **kwargs: Any) -> Mesh:
    mesh = cls.__new__(cls)
    mesh._init_fields(*args, **kwargs)
    return mesh

  @classmethod
  def _empty(cls) -> Mesh:
    return cls._from_fields("", [], np.zeros((0,), np.int64), [], [], [], False)

  @classmethod
  def from_device(cls, device: str | DeviceSpec) -> Mesh:
    """A single-device mesh, e.g. ``Mesh.from_device('/job:localhost/replica:0/task:0/device:CPU:0')``.

    Raises:
      ValueError: If the device is not fully specified (job, task and type).
    """
    spec = device if isinstance(device, DeviceSpec) else DeviceSpec.from_string(device)
    if not spec.is_full:
      raise ValueError(
          f"Mesh.from_device needs a full device name with job, task and "
          f"device type, got {device!r}, e.g. "
          "'/job:localhost/replica:0/task:0/device:CPU:0'.")
    return cls._from_fields("", [], np.zeros((0,), np.int64), [], [], [], False,
                            single_device=spec.to_string())

  @classmethod
  def from_string(cls, mesh_str: str) -> Mesh:
    """Parses a mesh string written by `to_string` or by TF DTensor.

    Accepts ``empty_mesh``, a single device string, the 5-, 6- and 7-part
    forms and the 3-part test form ``name|dims|*TPU``.

    Raises:
      TypeError: If `mesh_str` is not a str.
      ValueError: DTensor's ``Mesh::FromString`` errors, plus a clear message
        for any part TF would crash on.
    """
    if not isinstance(mesh_str, str):
      raise TypeError(f"mesh_str must be a str, got {mesh_str!r} of type "
                      f"{type(mesh_str).__name__}.")
    if mesh_str == EMPTY_MESH:
      return cls._empty()
    if "|" not in mesh_str:
      return cls.from_device(mesh_str)
    parts = mesh_str.split("|")
    if len(parts) not in (3, 5, 6, 7):
      raise ValueError(
          f"Expected either 5, 6, 7 or 3 mesh parts but found{len(parts)}")
    name = parts[0]
    dims: list[tuple[str, int]] = []
    if parts[1]:
      total = 1
      for item in parts[1].split(","):
        dim_name, eq, size = item.partition("=")
        if not eq or not re.fullmatch(r"\s*[0-9]{1,9}\s*", size, re.ASCII):
          raise ValueError(
              f"Mesh string {_shorten(mesh_str)!r}: dimension {_shorten(item)!r} "
              "is not of the form name=size (size in ASCII digits, at most 9).")
        dims.append((dim_name, int(size)))
        total *= int(size)
      if total > MAX_MESH_SIZE:
        raise ValueError(
            f"Mesh string {_shorten(mesh_str)!r} describes {total:,} devices; "
            f"jdtensor supports at most {MAX_MESH_SIZE:,}.")
    if len(parts) == 3:
      kind, star, device_type = parts[2].partition("*")
      if not star or kind or "*" in device_type:
        raise ValueError("Expected a * in mesh_gen_instructions but found "
                         f"{parts[2]}")
      size = int(np.prod([s for _, s in dims])) if dims else 0
      devices = [f"/job:localhost/task:0/device:{device_type}:{i}"
                 for i in range(size)]
      return cls._get_mesh(mesh_str, name, dims, list(range(size)),
                           list(range(size)), devices, [], False)
    global_ids = _parse_int_list("global device ids", parts[2], mesh_str)
    local_ids = _parse_int_list("local device ids", parts[3], mesh_str)
    local_devices = parts[4].split(",") if parts[4] else []
    use_xla_spmd = False
    global_devices: list[str] = []
    if len(parts) == 6 and parts[5]:
      if parts[5] == USE_XLA_SPMD_STRING:
        use_xla_spmd = True
      else:
        global_devices = parts[5].split(",")
    if len(parts) == 7 and parts[6]:
      if parts[6] != USE_XLA_SPMD_STRING:
        raise ValueError(f"Expected string {USE_XLA_SPMD_STRING}as the 7th "
                         f"argument but got: {parts[6]}")
      use_xla_spmd = True
    if len(parts) == 7 and parts[5]:
      global_devices = parts[5].split(",")
    return cls._get_mesh(mesh_str, name, dims, global_ids, local_ids,
                         local_devices, global_devices, use_xla_spmd)

  @classmethod
  def _get_mesh(cls, mesh_str: str, name: str, dims: list[tuple[str, int]],
                global_ids: list[int], local_ids: list[int],
                local_devices: list[str], global_devices: list[str],
                use_xla_spmd: bool) -> Mesh:
    # DTensor-compatible: C++ Mesh::GetMesh checks and messages, in order.
    seen: set[str] = set()
    for dim_name, _ in dims:
      if dim_name in seen:
        raise ValueError("repeated mesh dimension")
      if dim_name in _RESERVED_DIM_NAMES:
        raise ValueError(f"mesh dimension name {dim_name} is reserved")
      seen.add(dim_name)
    global_n, local_n, dev_n = len(global_ids), len(local_ids), len(local_devices)
    if not (global_n >= local_n and dev_n == local_n):
      raise ValueError(
          f"number of global_device_ids {global_n} local_devices ids {local_n} "
          f"and local devices {dev_n}not meeting requirements")
    if global_n == 0:
      return cls._empty()
    if local_n and global_n % local_n != 0:
      raise ValueError(f"Uneven local clusters with global_ids {global_n} and "
                       f"local_devices ids {local_n}")
    shape = [s for _, s in dims]
    if (int(np.prod(shape)) if dims else 0) != global_n:
      raise ValueError("mesh size doesn't match number of devices")
    types: set[str] = set()
    parsed = []
    for device in local_devices:
      try:
        spec = DeviceSpec.from_string(device)
      except ValueError:
        spec = DeviceSpec()
      if not spec.is_full:
        raise ValueError("Failed to either identify host or device type")
      types.add(spec.device_type)  # type: ignore[arg-type]
      if len(types) > 1:
        raise ValueError("More than one device type per mesh not supported. "
                         f"Found {len(types)}")
      parsed.append(spec.to_string())
    # Beyond DTensor: ids must be consecutive (every mesh TF writes has them),
    # and global devices must parse, since jdtensor maps them to JAX devices.
    if any(g - i != global_ids[0] for i, g in enumerate(global_ids)):
      raise ValueError(f"Mesh string {mesh_str!r}: global device ids must be "
                       f"consecutive, got {global_ids}.")
    for device in global_devices:
      try:
        DeviceSpec.from_string(device)
      except ValueError as e:
        raise ValueError(f"Mesh string {mesh_str!r}: bad global device "
                         f"{device!r}: {e}") from None
    ids = np.array(global_ids, dtype=np.int64).reshape(shape)
    return cls._from_fields(name, [d for d, _ in dims], ids, local_ids,
                            local_devices, global_devices, use_xla_spmd)

  # -- DTensor API ---------------------------------------------------------------

  @property
  def dim_names(self) -> list[str]:
    """Names of the mesh dimensions, in order."""
    return list(self._dim_names)

  @property
  def name(self) -> str:
    """The mesh name ('' by default)."""
    return self._name

  @property
  def size(self) -> int:
    """Number of devices; 0 for single-device and empty meshes (as DTensor)."""
    return int(self._global_ids.size) if self._dim_names else 0

  def shape(self) -> list[int]:
    """Sizes of the mesh dimensions."""
    return list(self._global_ids.shape) if self._dim_names else []

  def dim_size(self, dim_name: str) -> int:
    """Size of one dimension.

    Raises:
      ValueError: DTensor's message if `dim_name` is not a dimension.
    """
    if dim_name in self._dim_names:
      return self.shape()[self._dim_names.index(dim_name)]
    raise ValueError(f"Dimension {dim_name} does not exist in mesh."
                     f"Available dimensions: {','.join(self._dim_names)}")

  def __getitem__(self, dim_name: str) -> MeshDimension:
    return MeshDimension(name=dim_name, size=self.dim_size(dim_name))

  def contains_dim(self, dim_name: str) -> bool:
    """Whether `dim_name` is a dimension of this mesh."""
    return dim_name in self._dim_names

  def __contains__(self, dim_name: object) -> bool:
    return dim_name in self._dim_names

  @property
  def strides(self) -> list[int]:
    """Row-major strides, e.g. shape (8, 16, 2, 4) -> [128, 8, 4, 1]."""
    strides = [1]
    for size in reversed(self.shape()[1:]):
      strides.insert(0, strides[0] * size)
    return strides if self._dim_names else []

  def coords(self, device_idx: int) -> np.ndarray:
    """Row-major coordinates of `device_idx` (wrapping past `size`)."""
    return ((device_idx // np.array(self.strides, np.int64)) %
            np.array(self.shape(), np.int64)).astype(np.int32)

  def unravel_index(self) -> dict[int, dict[str, int]]:
    """``{device offset: {dim name: index}}`` in row-major order."""
    ranges = [range(s) for s in self.shape()]
    return {i: dict(zip(self._dim_names, pos))
            for i, pos in enumerate(itertools.product(*ranges))}

  def local_device_locations(self) -> list[dict[str, int]]:
    """The `unravel_index` entry of each local device id."""
    index = self.unravel_index()
    return [index[i - self.min_global_device_id()] for i in self._local_ids]

  def device_location(self, offset: int) -> list[int]:
    """Coordinates of the device at `offset`.

    Raises:
      ValueError: DTensor's message if `offset` is outside the mesh.
    """
    if offset < 0 or offset > self.size - 1:
      raise ValueError("Mesh offset cannot be negative or exceed Mesh's size. "
                       f"Offset size:{offset} and Mesh size:{self.size}")
    return [int(c) for c in np.unravel_index(offset, self.shape())]

  def device_type(self) -> str:
    """CPU, GPU or TPU; '' for the empty mesh."""
    first = (self._global_devices or self._local_devices or
             ((self._single_device,) if self._single_device else ()))
    if not first:
      return ""
    return DeviceSpec.from_string(first[0]).device_type or ""

  def local_device_ids(self) -> list[int]:
    """This client's global device ids."""
    return list(self._local_ids)

  def global_device_ids(self) -> np.ndarray:
    """All global device ids (int64), shaped like the mesh."""
    return self._global_ids.copy()

  def local_devices(self) -> list[str]:
    """This client's device strings, one per local id."""
    return list(self._local_devices)

  def global_devices(self) -> list[str]:
    """Every device string in global-id order, if given; else []."""
    return list(self._global_devices)

  def num_local_devices(self) -> int:
    """Number of this client's devices in the mesh."""
    return len(self._local_devices)

  def min_global_device_id(self) -> int:
    """The first global device id."""
    return int(self._global_ids.flat[0]) if self._global_ids.size else 0

  def is_remote(self) -> bool:
    """True if this client has no device in the mesh."""
    return not self._local_ids and self._global_ids.size > 0

  def use_xla_spmd(self) -> bool:
    """Whether the mesh uses XLA SPMD."""
    return self._use_xla_spmd

  def is_single_device(self) -> bool:
    """Whether this is a single-device mesh (`from_device`)."""
    return self._single_device is not None

  @property
  def single_device(self) -> str:
    """The device of a single-device mesh, else ''."""
    return self._single_device or ""

  def host_mesh(self) -> Mesh:
    """The same ids on this client's devices re-typed to CPU.

    As DTensor: drops the name, ``use_xla_spmd`` and the global device list,
    so a mesh with no device of this client becomes ``|x=2|0,1||``.
    """
    local = [DeviceSpec.from_string(d).make_merged_spec(
        DeviceSpec(device_type="CPU")).to_string() for d in self._local_devices]
    return Mesh._from_fields("", list(self._dim_names), self._global_ids,
                             list(self._local_ids), local, [], False)

  def to_string(self) -> str:
    """DTensor's exact string form, e.g. ``|x=2|0,1|0,1|/job:...CPU:0,/job:...CPU:1``."""
    if self._single_device is not None:
      return self._single_device
    if not self._global_ids.size:
      return EMPTY_MESH
    dims = ",".join(f"{n}={s}" for n, s in zip(self._dim_names, self.shape()))
    out = "|".join([
        self._name, dims, ",".join(str(int(i)) for i in self._global_ids.flat),
        ",".join(str(i) for i in self._local_ids), ",".join(self._local_devices)
    ])
    if self._global_devices:
      out += "|" + ",".join(self._global_devices)
    if self._use_xla_spmd:
      out += "|" + USE_XLA_SPMD_STRING
    return out

  def _key(self) -> tuple[Any, ...]:
    return (self._name, self._dim_names, self._global_ids.shape,
            self._global_ids.tobytes(), self._local_ids, self._local_devices,
            self._global_devices, self._use_xla_spmd, self._single_device)

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Mesh):
      return NotImplemented
    return self._key() == other._key()

  def __hash__(self) -> int:
    return hash(self._key())

  def __repr__(self) -> str:
    return f"Mesh.from_string({self.to_string()})"

  __str__ = __repr__

  def __reduce__(self) -> tuple[Any, ...]:
    return Mesh.from_string, (self.to_string(),)

  # -- protos ------------------------------------------------------------------------

  def as_proto(self) -> Any:
    """DTensor's ``MeshProto`` (`jdtensor._proto.MeshProto`: the same fields,
    and ``SerializeToString`` gives TF's bytes)."""
    from jdtensor import _proto  # pylint: disable=g-import-not-at-top
    return _proto.MeshProto(
        mesh_dimensions=[_proto.MeshDimensionProto(n, s)
                         for n, s in zip(self._dim_names, self.shape())],
        global_device_ids=[int(i) for i in self._global_ids.flat],
        name=self._name, local_device_ids=list(self._local_ids),
        local_devices=list(self._local_devices),
        global_devices=list(self._global_devices),
        use_xla_spmd=self._use_xla_spmd, single_device=self._single_device or "")

  @classmethod
  def from_proto(cls, proto: Any) -> Mesh:
    """The mesh of a ``MeshProto``: jdtensor's, TF's (any object with
    ``SerializeToString``), or its serialized bytes.

    Raises:
      ValueError: For malformed bytes, or a proto the mesh checks reject.
      TypeError: For anything else.
    """
    from jdtensor import _proto  # pylint: disable=g-import-not-at-top
    proto = _proto.coerce(proto, _proto.MeshProto, "proto")
    if proto.single_device:
      return cls.from_device(proto.single_device)
    dims = [(d.name, d.size) for d in proto.mesh_dimensions]
    total = int(np.prod([s for _, s in dims])) if dims else 0
    if total > MAX_MESH_SIZE or any(s < 0 for _, s in dims):
      raise ValueError(f"MeshProto describes {total:,} devices; jdtensor supports "
                       f"0 to {MAX_MESH_SIZE:,}.")
    return cls._get_mesh(f"MeshProto({proto.name!r})", proto.name, dims,
                         list(proto.global_device_ids),
                         list(proto.local_device_ids), list(proto.local_devices),
                         list(proto.global_devices), proto.use_xla_spmd)

  # -- JAX interop ----------------------------------------------------------------

  @property
  def jax_mesh(self) -> Any:
    """The equivalent ``jax.sharding.Mesh`` (axis types ``Auto``).

    Global id ``g`` sits at ``np.unravel_index(g - min_id, shape)``, on the JAX
    device that jdtensor's dense id table maps it to. Starts the JAX backend.

    Raises:
      ValueError: If a device of the mesh does not exist in this cluster.
    """
    if self._jax_mesh_cache is None:
      from jdtensor.runtime import interop  # pylint: disable=g-import-not-at-top
      self._jax_mesh_cache = interop.to_jax_mesh(self)
    return self._jax_mesh_cache

  def to_jax_mesh(self, axis_types: Any = None) -> Any:
    """Like `jax_mesh`, with explicit ``jax.sharding.AxisType`` s per axis."""
    from jdtensor.runtime import interop  # pylint: disable=g-import-not-at-top
    return interop.to_jax_mesh(self, axis_types)

  @classmethod
  def from_jax_mesh(cls, jax_mesh: Any, mesh_name: str = "",
                    use_xla_spmd: bool = False) -> Mesh:
    """The DTensor mesh for a ``jax.sharding.Mesh``.

    Global ids follow the JAX mesh's row-major device order; local ids are
    the positions of this process's devices. If the order is not the dense
    order jdtensor would infer, ``global_devices`` is filled in so that
    `jax_mesh` returns the same devices again.

    Raises:
      TypeError: If `jax_mesh` is not a ``jax.sharding.Mesh``.
    """
    from jdtensor.runtime import interop  # pylint: disable=g-import-not-at-top
    parts = interop.describe_jax_mesh(jax_mesh)
    ids = np.arange(len(parts["devices"])).reshape(parts["shape"])
    args = (parts["names"], ids, parts["local_ids"], parts["local_strings"],
            mesh_name)
    try:
      mesh = cls(*args, use_xla_spmd=use_xla_spmd)
      if interop.mesh_devices(mesh) == parts["devices"]:
        return mesh
    except ValueError:
      pass
    return cls(*args, global_devices=parts["strings"], use_xla_spmd=use_xla_spmd)


class Layout:
  """How a tensor's dimensions are sharded over a `Mesh`.

  Args:
    sharding_specs: One entry per tensor dimension: a mesh dimension name,
      `UNSHARDED` or `MATCH`.
    mesh: The mesh.

  Raises:
    ValueError: DTensor's checks and messages.
    TypeError: If a spec is not a str.
  """

  def __init__(self, sharding_specs: Sequence[str], mesh: Mesh):
    # DTensor-compatible checks and messages.
    if not isinstance(mesh, Mesh):
      raise ValueError("mesh is not a valid Mesh object.")
    if isinstance(sharding_specs, str) or not isinstance(sharding_specs, Sequence):
      raise TypeError("sharding_specs must be a list of str, got "
                      f"{sharding_specs!r}.")
    specs = list(sharding_specs)
    for spec in specs:
      if not isinstance(spec, str):
        raise TypeError(f"sharding_specs must hold str, got {spec!r} in {specs}.")
    for spec in specs:
      if spec in (UNSHARDED, MATCH):
        continue
      if specs.count(spec) > 1:
        raise ValueError(
            f"Mesh dimension {spec} was repeated in sharding specification "
            f"{specs}. Mesh dimensions must be unique in a layout.")
      if spec not in mesh:
        raise ValueError(f"{spec}: A dimension sharding must either be a valid "
                         "mesh dimension or UNSHARDED.")
    self._init_fields(specs, mesh, LayoutType.STATIC)

  def _init_fields(self, specs: list[str], mesh: Mesh, layout_type: LayoutType,
                   ) -> None:
    # DTensor-compatible: C++ Layout::GetLayout checks.
    seen: set[str] = set()
    for spec in specs:
      if spec in (UNSHARDED, _ANY):
        continue
      if spec in seen:
        raise ValueError("Attempted to shard two or more tensor dimensions over "
                         f"mesh dimension {spec}")
      seen.add(spec)
    self._specs = tuple(specs)
    self._mesh = mesh
    self._type = layout_type
    self._jax_sharding: Any = None  # Made once by to_jax_sharding.

  @classmethod
  def _from_fields(cls, specs: list[str], mesh: Mesh,
                   layout_type: LayoutType) -> Layout:
    layout = cls.__new__(cls)
    layout._init_fields(specs, mesh, layout_type)
    return layout

  # -- constructors ----------------------------------------------------------------

  @classmethod
  def replicated(cls, mesh: Mesh, rank: int) -> Layout:
    """A fully replicated layout of `rank` dimensions."""
    return cls([UNSHARDED] * _check_rank(rank), mesh)

  @classmethod
  def batch_sharded(cls, mesh: Mesh, batch_dim: str, rank: int,
                    axis: int = 0) -> Layout:
    """Sharded over `batch_dim` on tensor axis `axis`, replicated elsewhere."""
    specs = [UNSHARDED] * _check_rank(rank)
    if not -rank <= axis < rank:
      raise ValueError(f"axis={axis} is out of range for rank={rank}.")
    specs[axis] = batch_dim
    return cls(specs, mesh)

  @classmethod
  def inner_sharded(cls, mesh: Mesh, inner_dim: str, rank: int) -> Layout:
    """Sharded over `inner_dim` on the last tensor axis."""
    return cls.batch_sharded(mesh, inner_dim, rank, axis=rank - 1)

  @classmethod
  def from_single_device_mesh(cls, mesh: Mesh) -> Layout:
    """The layout of a single-device mesh."""
    if not mesh.is_single_device():
      raise ValueError(f"Mesh {mesh.to_string()!r} is not a single-device mesh.")
    return cls._from_fields([], mesh, LayoutType.SINGLE_DEVICE)

  @classmethod
  def from_device(cls, device: str) -> Layout:
    """A single-device layout on `device`."""
    return cls.from_single_device_mesh(Mesh.from_device(device))

  @classmethod
  def from_string(cls, layout_str: str) -> Layout:
    """Parses DTensor's layout string (``sharding_specs:x,unsharded, mesh:...``).

    Also ``parted:...``, ``maximal:true, mesh:<device>`` and ``empty_layout``.

    Raises:
      TypeError: If `layout_str` is not a str.
      ValueError: DTensor's ``Layout::FromString`` errors, or a clear message
        for strings TF would misread (a missing trailing comma or prefix).
    """
    if not isinstance(layout_str, str):
      raise TypeError(f"layout_str must be a str, got {layout_str!r} of type "
                      f"{type(layout_str).__name__}.")
    if layout_str == _EMPTY_LAYOUT:
      return cls._from_fields([], Mesh._empty(), LayoutType.STATIC)
    parts = layout_str.split(" ")
    if len(parts) != 2:
      raise ValueError(f"Expected 2 items but found {len(parts)}{parts[0]}")
    spec_part, mesh_part = parts
    if not mesh_part.startswith("mesh:"):
      raise ValueError(f"Layout string {layout_str!r}: the second part must "
                       "start with 'mesh:'.")
    mesh = Mesh.from_string(mesh_part[len("mesh:"):])
    if spec_part.startswith("maximal:"):
      if spec_part != "maximal:true,":
        raise ValueError(f"Layout string {layout_str!r}: expected 'maximal:true,'.")
      return cls.from_single_device_mesh(mesh)
    for prefix, layout_type in (("sharding_specs:", LayoutType.STATIC),
                                ("parted:", LayoutType.PARTED)):
      if spec_part.startswith(prefix):
        body = spec_part[len(prefix):]
        break
    else:
      raise ValueError(f"Layout string {layout_str!r} must start with "
                       "'sharding_specs:', 'parted:' or 'maximal:'.")
    if body and not body.endswith(","):
      raise ValueError(f"Layout string {layout_str!r}: every sharding spec must "
                       "be followed by a comma, e.g. 'sharding_specs:x,unsharded,'.")
    specs = body.split(",")[:-1] if body else []
    if any(not s for s in specs):
      raise ValueError(f"Layout string {layout_str!r} has an empty sharding spec.")
    for spec in specs:
      if spec not in (UNSHARDED, _ANY, MATCH, _SCALAR) and spec not in mesh:
        raise ValueError(f"sharding spec ({spec}) refers to mesh dimension not "
                         f"contained in mesh {mesh.to_string()}")
    if _SCALAR in specs:
      if len(specs) > 1:
        raise ValueError(
            "A scalar sharding_spec can only be used as a single sharding_spec "
            "instruction, not as part of list of sharding_specs as attempted "
            f"here with {len(specs)} sharding_specs")
      specs = []
    return cls._from_fields(specs, mesh, layout_type)

  # -- DTensor API -----------------------------------------------------------------

  @property
  def sharding_specs(self) -> list[str]:
    """One spec per tensor dimension."""
    return list(self._specs)

  @property
  def rank(self) -> int:
    """Tensor rank."""
    return len(self._specs)

  @property
  def mesh(self) -> Mesh:
    """The mesh."""
    return self._mesh

  @property
  def type(self) -> LayoutType:
    """STATIC, PARTED or SINGLE_DEVICE."""
    return self._type

  @property
  def shape(self) -> list[int]:
    """The mesh shape (DTensor 2.14+ semantics)."""
    return self._mesh.shape()

  def num_shards(self, idx: int) -> int:
    """Shards along tensor axis `idx`: 1 unsharded, the mesh dim size if sharded, -1 for MATCH."""
    spec = self._specs[idx]
    if spec in (UNSHARDED, _ANY):
      return 1
    if spec == MATCH:
      return -1
    return self._mesh.dim_size(spec)

  def _num_shards_all(self) -> list[int]:
    return [self.num_shards(i) for i in range(self.rank)]

  def is_fully_replicated(self) -> bool:
    """True if no tensor axis is split into more than one shard."""
    return all(n <= 1 for n in self._num_shards_all())

  def is_batch_parallel(self) -> bool:
    """True if only the first tensor axis may be sharded."""
    return all(self.num_shards(i) == 1 for i in range(1, self.rank))

  def is_single_device(self) -> bool:
    """True for a single-device layout."""
    return self._type == LayoutType.SINGLE_DEVICE

  def unravel(self, unpacked_tensors: Sequence[Any]) -> np.ndarray:
    """Arranges one shard per mesh device (in offset order, as `unpack` of
    every client would give) by shard position: an object ndarray of shape
    ``[num_shards(i) for i in range(rank)]`` (TF DTensor's ``Layout.unravel``).

    Raises:
      ValueError: If there is not one tensor per device of the mesh.
    """
    offsets = self.offset_to_shard()
    if len(unpacked_tensors) != len(offsets):
      raise ValueError(f"unravel: got {len(unpacked_tensors)} tensors, but the "
                       f"mesh has {len(offsets)} devices; pass one per device, "
                       "in device-offset order.")
    out = np.empty([self.num_shards(i) for i in range(self.rank)], dtype=object)
    for offset, location in enumerate(offsets):
      out[tuple(location)] = unpacked_tensors[offset]
    return out

  def to_parted(self) -> Layout:
    """The same specs as a PARTED layout."""
    return Layout._from_fields(list(self._specs), self._mesh, LayoutType.PARTED)

  def delete(self, dims: int | list[int]) -> Layout:
    """Drops the given tensor axes."""
    drop = dims if isinstance(dims, list) else [dims]
    return Layout([s for i, s in enumerate(self._specs) if i not in drop],
                  self._mesh)

  def offset_to_shard(self) -> list[tuple[int, ...]]:
    """For each device offset, the shard index along every tensor axis."""
    locations = self._mesh.unravel_index()
    return [tuple(0 if s in (UNSHARDED, _ANY) else loc[s] for s in self._specs)
            for _, loc in sorted(locations.items())]

  def offset_tuple_to_global_index(self, offset_tuple: Sequence[int]) -> int:
    """Row-major index of a shard tuple among all shards."""
    index = 0
    for i, o in enumerate(offset_tuple):
      m = 1
      for x in range(i + 1, self.rank):
        m *= self.num_shards(x)
      index += m * o
    return index

  def local_shape_from_global_shape(self, global_shape: Sequence[int]
                                    ) -> tuple[int, ...]:
    """Per-device shard shape, e.g. [4, 6] -> (2, 3) for [y, x] on a 2x2 mesh.

    Raises:
      ValueError: On a rank mismatch or a dimension that does not divide
        evenly (DTensor silently rounds down).
    """
    shape = self._check_shape("global_shape", global_shape)
    out = []
    for axis, (size, shards) in enumerate(zip(shape, self._num_shards_all())):
      if shards > 1 and size % shards:
        raise ValueError(
            f"global_shape {list(shape)}: axis {axis} has size {size}, which "
            f"does not divide into {shards} shards over mesh dimension "
            f"{self._specs[axis]!r}.")
      out.append(size // shards if shards > 1 else size)
    return tuple(out)

  def global_shape_from_local_shape(self, local_shape: Sequence[int]
                                    ) -> tuple[int, ...]:
    """Global shape from a per-device shard shape, e.g. (1, 3, 5) -> (2, 6, 5)."""
    shape = self._check_shape("local_shape", local_shape)
    return tuple(size * max(shards, 1)
                 for size, shards in zip(shape, self._num_shards_all()))

  def _check_shape(self, arg: str, shape: Sequence[int]) -> list[int]:
    values = [int(s) for s in shape]
    if len(values) != self.rank:
      raise ValueError(f"{arg} {list(shape)} has rank {len(values)}, but the "
                       f"layout has rank {self.rank}.")
    return values

  def to_string(self) -> str:
    """DTensor's exact string form."""
    if self._type == LayoutType.SINGLE_DEVICE:
      return f"maximal:true, mesh:{self._mesh.to_string()}"
    if not self._specs and self._mesh.to_string() == EMPTY_MESH:
      return _EMPTY_LAYOUT
    prefix = "parted:" if self._type == LayoutType.PARTED else "sharding_specs:"
    return (prefix + "".join(s + "," for s in self._specs) + " mesh:" +
            self._mesh.to_string())

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Layout):
      return NotImplemented
    return (self._specs, self._mesh, self._type) == (other._specs, other._mesh,
                                                     other._type)

  def __hash__(self) -> int:
    return hash((self._specs, self._mesh, self._type))

  def __repr__(self) -> str:
    return f"Layout.from_string({self.to_string()})"

  __str__ = __repr__

  def __reduce__(self) -> tuple[Any, ...]:
    return Layout.from_string, (self.to_string(),)

  # -- protos ------------------------------------------------------------------------

  def as_proto(self) -> Any:
    """DTensor's ``LayoutProto`` (`jdtensor._proto.LayoutProto`; its
    ``SerializeToString`` gives TF's bytes)."""
    from jdtensor import _proto  # pylint: disable=g-import-not-at-top
    return _proto.LayoutProto(
        sharding_specs=[_proto.ShardingSpec(s) for s in self._specs],
        mesh_config=self._mesh.as_proto(),
        type=_proto.LAYOUT_TYPES[self._type.value])

  @classmethod
  def from_proto(cls, layout_proto: Any) -> Layout:
    """The layout of a ``LayoutProto``: jdtensor's, TF's, or its bytes.

    Raises:
      ValueError: For malformed bytes or an unknown layout type.
      TypeError: For anything else.
    """
    from jdtensor import _proto  # pylint: disable=g-import-not-at-top
    proto = _proto.coerce(layout_proto, _proto.LayoutProto, "layout_proto")
    mesh = Mesh.from_proto(proto.mesh_config)
    kinds = {v: k for k, v in _proto.LAYOUT_TYPES.items()}
    kind = kinds.get(proto.type)
    if kind in (None, "UNKNOWN"):
      raise ValueError(f"LayoutProto has layout type {proto.type}, which is not "
                       "STATIC (1), PARTED (2) or SINGLE_DEVICE (3).")
    if kind == "SINGLE_DEVICE":
      return cls.from_single_device_mesh(mesh)
    layout = cls([s.sharding_spec for s in proto.sharding_specs], mesh)
    return layout.to_parted() if kind == "PARTED" else layout

  # -- JAX interop -----------------------------------------------------------------

  def to_partition_spec(self) -> Any:
    """The ``jax.sharding.PartitionSpec`` (UNSHARDED -> None).

    Raises:
      ValueError: For MATCH/any specs, which have no JAX equivalent.
    """
    from jax.sharding import PartitionSpec  # pylint: disable=g-import-not-at-top
    entries = []
    for spec in self._specs:
      if spec in (MATCH, _ANY):
        raise ValueError(f"Layout {self.to_string()!r}: sharding spec {spec!r} "
                         "has no jax.sharding equivalent; resolve it to a mesh "
                         "dimension or UNSHARDED first.")
      entries.append(None if spec == UNSHARDED else spec)
    return PartitionSpec(*entries)

  def to_jax_sharding(self) -> Any:
    """The ``jax.sharding.NamedSharding`` on `mesh.jax_mesh` (or a
    ``SingleDeviceSharding`` for a single-device layout).

    Made once per Layout (it keeps it) and recorded, so that arrays with
    this sharding give this exact layout back (`jdtensor.fetch_layout`).
    """
    if self._jax_sharding is None:
      from jdtensor.runtime import interop  # pylint: disable=g-import-not-at-top
      if self._type == LayoutType.SINGLE_DEVICE:
        sharding = interop.single_device_sharding(self._mesh.single_device)
      else:
        jax_mesh = self._mesh.jax_mesh
        # This mesh is now the latest one behind its JAX mesh (meshes that
        # differ only in name give equal JAX meshes).
        interop.note_mesh(jax_mesh, self._mesh)
        sharding = interop.named_sharding(jax_mesh, self.to_partition_spec())
      self._jax_sharding = sharding
      interop.note_sharding(sharding, self)
    return self._jax_sharding

  @classmethod
  def from_jax_sharding(cls, sharding: Any, rank: int | None = None,
                        mesh: Mesh | None = None) -> Layout:
    """The DTensor layout of a ``NamedSharding``.

    Args:
      sharding: A ``jax.sharding.NamedSharding``.
      rank: Tensor rank; the PartitionSpec is padded with UNSHARDED up to it
        (JAX allows a spec shorter than the rank). Defaults to its length.
      mesh: The DTensor mesh to use; defaults to the Layout that made
        `sharding`, else the jdtensor mesh last turned into its JAX mesh, else
        ``Mesh.from_jax_mesh(sharding.mesh)``.

    Raises:
      ValueError: If one tensor axis is sharded over several mesh axes, or the
        spec is longer than `rank`.
      TypeError: If `sharding` is not a NamedSharding.
    """
    import jax  # pylint: disable=g-import-not-at-top

    from jdtensor.runtime import interop  # pylint: disable=g-import-not-at-top
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
              f"PartitionSpec {sharding.spec}: tensor axis {axis} is sharded "
              f"over several mesh axes {entry}; a DTensor layout shards each "
              "tensor axis over at most one mesh dimension.")
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
      origin = interop.sharding_origin(sharding)
      if origin is not None:
        mesh, layout_type = origin.mesh, origin.type
      else:
        mesh = interop.known_mesh(sharding.mesh) or Mesh.from_jax_mesh(
            sharding.mesh)
    layout = cls(specs, mesh)
    return layout.to_parted() if layout_type == LayoutType.PARTED else layout


def _check_rank(rank: int) -> int:
  if not isinstance(rank, numbers.Integral) or isinstance(rank, bool) or rank < 0:
    raise ValueError(f"rank must be a non-negative int, got {rank!r}.")
  return int(rank)
