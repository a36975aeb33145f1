"""TF-style device specifications (``/job:worker/replica:0/task:1/device:CPU:0``).

PURE: no jax import. A small, immutable stand-in for ``tf.DeviceSpec`` with
the same string format and parsing rules, so that meshes written by TF DTensor
round-trip unchanged. One deliberate difference: the types CPU, GPU and TPU are
always upper-cased (TF keeps ``/device:tpu:0`` lower-case, then fails later).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

__all__ = ["DeviceSpec", "DEVICE_TYPES", "NAME_RE"]

DEVICE_TYPES = ("CPU", "GPU", "TPU")
# TF's DeviceNameUtils job and device-type names: a letter, then letters,
# digits or '_'.
NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def _parse_index(field: str, value: str, spec: str) -> int:
  if not value.isdigit():
    raise ValueError(
        f"Device spec {spec!r}: {field} {value!r} is not a non-negative "
        "integer.")
  return int(value)


@dataclass(frozen=True)
class DeviceSpec:
  """One device, possibly partially specified (None = unspecified).

  Attributes:
    job: Job name, e.g. ``"worker"``.
    replica: Replica index.
    task: Task (client) index.
    device_type: ``"CPU"``, ``"GPU"``, ``"TPU"`` or another type name.
    device_index: Device ordinal within the task.
  """

  job: str | None = None
  replica: int | None = None
  task: int | None = None
  device_type: str | None = None
  device_index: int | None = None

  def __post_init__(self) -> None:
    if self.device_type is not None and self.device_type.upper() in DEVICE_TYPES:
      object.__setattr__(self, "device_type", self.device_type.upper())

  @classmethod
  def from_string(cls, spec: str) -> DeviceSpec:
    """Parses every form ``tf.DeviceSpec.from_string`` accepts.

    Examples: ``/job:worker/replica:0/task:1/device:CPU:0``, ``CPU:1``,
    ``/device:tpu:0``, ``/tpu:0``, ``job:localhost/replica:0/task:0/TPU:0``.

    Raises:
      TypeError: If `spec` is not a str.
      ValueError: For an unknown component or a malformed index; the message
        shows the whole spec.
    """
    if not isinstance(spec, str):
      raise TypeError(f"Device spec must be a str, got {spec!r} of type "
                      f"{type(spec).__name__}.")
    job = replica = task = device_type = device_index = None
    for part in spec.split("/"):
      if not part:
        continue
      fields = part.split(":")
      n = len(fields)
      if n == 2 and fields[0] == "job":
        job = fields[1]
      elif n == 2 and fields[0] == "replica":
        replica = _parse_index("replica", fields[1], spec)
      elif n == 2 and fields[0] == "task":
        task = _parse_index("task", fields[1], spec)
      elif n in (1, 2) and fields[0].upper() in DEVICE_TYPES:
        if device_type is not None:
          raise ValueError(f"Multiple device types are not allowed while "
                           f"parsing the device spec: {spec}.")
        device_type = fields[0].upper()
        if n == 2 and fields[1] != "*":
          device_index = _parse_index("device index", fields[1], spec)
      elif n == 3 and fields[0] == "device":
        if device_type is not None:
          raise ValueError(f"Multiple device types are not allowed while "
                           f"parsing the device spec: {spec}.")
        if not NAME_RE.fullmatch(fields[1]):
          raise ValueError(f"Device spec {spec!r}: device type {fields[1]!r} is "
                           "not a valid name (a letter, then letters, digits "
                           "or '_').")
        device_type = fields[1]
        if fields[2] != "*":
          device_index = _parse_index("device index", fields[2], spec)
      else:
        raise ValueError(f"Unknown attribute '{fields[0]}' is encountered "
                         f"while parsing the device spec: '{spec}'.")
    if job is not None and not NAME_RE.fullmatch(job):
      raise ValueError(f"Device spec {spec!r}: job name {job!r} is not a valid "
                       "job name (a letter, then letters, digits or '_').")
    return cls(job, replica, task, device_type, device_index)

  def to_string(self) -> str:
    """The canonical TF string, e.g. ``/job:worker/replica:0/task:1/device:CPU:0``."""
    out = ""
    if self.job is not None:
      out += f"/job:{self.job}"
    if self.replica is not None:
      out += f"/replica:{self.replica}"
    if self.task is not None:
      out += f"/task:{self.task}"
    if self.device_type is not None:
      index = "*" if self.device_index is None else str(self.device_index)
      out += f"/device:{self.device_type}:{index}"
    return out

  def make_merged_spec(self, other: DeviceSpec) -> DeviceSpec:
    """Returns this spec with every field that `other` specifies replaced."""
    return dataclasses.replace(self, **{
        f.name: getattr(other, f.name)
        for f in dataclasses.fields(other)
        if getattr(other, f.name) is not None
    })

  @property
  def is_full(self) -> bool:
    """True if job, task and device type are set (TF's "full name")."""
    return (self.job is not None and self.task is not None and
            self.device_type is not None)

  def __str__(self) -> str:
    return self.to_string()

  def __repr__(self) -> str:
    return (f"<DeviceSpec(job={self.job}, replica={self.replica}, "
            f"task={self.task}, device_type={self.device_type}, "
            f"device_index={self.device_index})>")
