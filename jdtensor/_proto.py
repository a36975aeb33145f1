"""DTensor's ``MeshProto`` and ``LayoutProto``, written by hand.

PURE: standard library only. No protobuf dependency: these few messages are
encoded and decoded here in the protocol buffers wire format, byte for byte
as TF DTensor writes them (``tensorflow/dtensor/proto/layout.proto``; pinned
by tests against bytes TF 2.21 produced). The classes offer protobuf's
``SerializeToString`` and ``FromString``, so a real TF message converts with
``MeshProto.FromString(tf_message.SerializeToString())``.

Field numbers::

  MeshDimensionProto { string name = 1; int64 size = 2; }
  MeshProto { repeated MeshDimensionProto mesh_dimensions = 1;
              repeated int64 global_device_ids = 2; string name = 3;
              repeated int64 local_device_ids = 4; repeated string local_devices = 5;
              repeated string global_devices = 6; bool use_xla_spmd = 7;
              string single_device = 8; }
  ShardingSpec { string sharding_spec = 2; }
  LayoutProto { repeated ShardingSpec sharding_specs = 1; MeshProto mesh_config = 2;
                LayoutType type = 3; }   // UNKNOWN 0, STATIC 1, PARTED 2, SINGLE_DEVICE 3
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["MeshDimensionProto", "MeshProto", "ShardingSpec", "LayoutProto",
           "LAYOUT_TYPES", "coerce"]

_VARINT, _LEN = 0, 2
LAYOUT_TYPES = {"UNKNOWN": 0, "STATIC": 1, "PARTED": 2, "SINGLE_DEVICE": 3}
_MAX_MESSAGE = 64 * 2**20
_Message = TypeVar("_Message")


def _varint(value: int) -> bytes:
  value &= 2**64 - 1  # int64 is two's complement on the wire.
  out = bytearray()
  while True:
    byte = value & 0x7F
    value >>= 7
    if value:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
  return _varint(number << 3 | wire_type)


def _bytes_field(number: int, data: bytes) -> bytes:
  return _key(number, _LEN) + _varint(len(data)) + data


def _string(number: int, text: str) -> bytes:
  return _bytes_field(number, text.encode()) if text else b""


def _packed(number: int, values: list[int]) -> bytes:
  return _bytes_field(number, b"".join(_varint(v) for v in values)) if values else b""


def _scalar(number: int, value: int) -> bytes:
  return _key(number, _VARINT) + _varint(value) if value else b""


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    if pos >= len(data) or shift > 63:
      raise ValueError("truncated or oversized varint in a DTensor proto")
    byte = data[pos]
    pos += 1
    value |= (byte & 0x7F) << shift
    if not byte & 0x80:
      return value, pos
    shift += 7


def _signed(value: int) -> int:
  return value - 2**64 if value >= 2**63 else value


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
  """(field number, wire type, value) for every field of a message."""
  if not isinstance(data, (bytes, bytearray)) or len(data) > _MAX_MESSAGE:
    raise ValueError("a DTensor proto must be bytes of at most 64 MiB")
  pos = 0
  while pos < len(data):
    key, pos = _read_varint(data, pos)
    number, wire_type = key >> 3, key & 7
    if wire_type == _VARINT:
      value, pos = _read_varint(data, pos)
      yield number, wire_type, value
    elif wire_type == _LEN:
      size, pos = _read_varint(data, pos)
      if pos + size > len(data):
        raise ValueError("truncated field in a DTensor proto")
      yield number, wire_type, bytes(data[pos:pos + size])
      pos += size
    elif wire_type == 1:  # 64-bit: skipped (no such field here).
      pos += 8
    elif wire_type == 5:  # 32-bit: skipped.
      pos += 4
    else:
      raise ValueError(f"wire type {wire_type} is not valid in a DTensor proto")
  if pos != len(data):
    raise ValueError("truncated field in a DTensor proto")


def _ints(wire_type: int, value: int | bytes) -> list[int]:
  """A repeated int64 field's values, packed or not."""
  if wire_type == _VARINT:
    return [_signed(value)]  # type: ignore[arg-type]
  out, pos = [], 0
  while pos < len(value):  # type: ignore[arg-type]
    item, pos = _read_varint(value, pos)  # type: ignore[arg-type]
    out.append(_signed(item))
  return out


def _text(value: int | bytes) -> str:
  if not isinstance(value, bytes):
    raise ValueError("a string field of a DTensor proto has a number")
  try:
    return value.decode()
  except UnicodeDecodeError:
    raise ValueError("a string field of a DTensor proto is not UTF-8") from None


@dataclass
class MeshDimensionProto:
  name: str = ""
  size: int = 0

  def SerializeToString(self) -> bytes:  # pylint: disable=invalid-name
    return _string(1, self.name) + _scalar(2, self.size)

  @classmethod
  def FromString(cls, data: bytes) -> MeshDimensionProto:  # pylint: disable=invalid-name
    out = cls()
    for number, wire_type, value in _fields(data):
      if number == 1:
        out.name = _text(value)
      elif number == 2 and wire_type == _VARINT:
        out.size = _signed(value)  # type: ignore[arg-type]
    return out


@dataclass
class MeshProto:
  mesh_dimensions: list[MeshDimensionProto] = field(default_factory=list)
  global_device_ids: list[int] = field(default_factory=list)
  name: str = ""
  local_device_ids: list[int] = field(default_factory=list)
  local_devices: list[str] = field(default_factory=list)
  global_devices: list[str] = field(default_factory=list)
  use_xla_spmd: bool = False
  single_device: str = ""

  def SerializeToString(self) -> bytes:  # pylint: disable=invalid-name
    return b"".join([
        *(_bytes_field(1, d.SerializeToString()) for d in self.mesh_dimensions),
        _packed(2, self.global_device_ids), _string(3, self.name),
        _packed(4, self.local_device_ids),
        *(_bytes_field(5, d.encode()) for d in self.local_devices),
        *(_bytes_field(6, d.encode()) for d in self.global_devices),
        _scalar(7, int(self.use_xla_spmd)), _string(8, self.single_device)])

  @classmethod
  def FromString(cls, data: bytes) -> MeshProto:  # pylint: disable=invalid-name
    """Parses the wire format; ValueError for anything malformed."""
    out = cls()
    for number, wire_type, value in _fields(data):
      if number == 1 and isinstance(value, bytes):
        out.mesh_dimensions.append(MeshDimensionProto.FromString(value))
      elif number == 2:
        out.global_device_ids += _ints(wire_type, value)
      elif number == 3:
        out.name = _text(value)
      elif number == 4:
        out.local_device_ids += _ints(wire_type, value)
      elif number == 5:
        out.local_devices.append(_text(value))
      elif number == 6:
        out.global_devices.append(_text(value))
      elif number == 7 and wire_type == _VARINT:
        out.use_xla_spmd = bool(value)
      elif number == 8:
        out.single_device = _text(value)
    return out


@dataclass
class ShardingSpec:
  sharding_spec: str = ""

  def SerializeToString(self) -> bytes:  # pylint: disable=invalid-name
    return _string(2, self.sharding_spec)

  @classmethod
  def FromString(cls, data: bytes) -> ShardingSpec:  # pylint: disable=invalid-name
    out = cls()
    for number, _, value in _fields(data):
      if number == 2:
        out.sharding_spec = _text(value)
    return out


@dataclass
class LayoutProto:
  sharding_specs: list[ShardingSpec] = field(default_factory=list)
  mesh_config: MeshProto = field(default_factory=MeshProto)
  type: int = 0

  def SerializeToString(self) -> bytes:  # pylint: disable=invalid-name
    mesh = self.mesh_config.SerializeToString()
    return b"".join([
        *(_bytes_field(1, s.SerializeToString()) for s in self.sharding_specs),
        _bytes_field(2, mesh), _scalar(3, self.type)])

  @classmethod
  def FromString(cls, data: bytes) -> LayoutProto:  # pylint: disable=invalid-name
    """Parses the wire format; ValueError for anything malformed."""
    out = cls()
    for number, wire_type, value in _fields(data):
      if number == 1 and isinstance(value, bytes):
        out.sharding_specs.append(ShardingSpec.FromString(value))
      elif number == 2 and isinstance(value, bytes):
        out.mesh_config = MeshProto.FromString(value)
      elif number == 3 and wire_type == _VARINT:
        out.type = int(value)  # type: ignore[arg-type]
    return out


def coerce(proto: Any, message: type[_Message], argument: str) -> _Message:
  """`proto` as jdtensor's `message` type: from itself, its bytes, or any
  object with ``SerializeToString`` (TF's generated classes).

  Raises:
    TypeError: For anything else, naming `argument`.
    ValueError: For malformed bytes.
  """
  if isinstance(proto, message):
    return proto
  if isinstance(proto, (bytes, bytearray)):
    return message.FromString(bytes(proto))  # type: ignore[attr-defined]
  serialize = getattr(proto, "SerializeToString", None)
  if serialize is None:
    raise TypeError(f"{argument} must be a {message.__name__} or its bytes, got "
                    f"{type(proto).__name__}.")
  return message.FromString(serialize())  # type: ignore[attr-defined]
