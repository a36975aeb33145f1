"""What the liveness links say, as typed messages, and their frames.

PURE: standard library only.

The one place that builds and reads the links' own JSON frames
(`jdtensor.runtime.links.Links`); the heartbeat's exchange messages (an
``hb`` key, and binary frames) are `jdtensor.heartbeat.wire`'s and
`jdtensor.heartbeat.exchange`'s, carried by the links unread. Each message
is a small frozen dataclass with ``to_frame`` (a JSON object for
`jdtensor._wire.encode`); `read` turns a received object back into one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

from jdtensor._report import Reason

__all__ = ["Failed", "Left", "Notice", "Ended", "Bye", "ServiceUp", "LinkMessage",
           "read", "SERVICE_UP"]

# Client 0's word, during start-up, that its JAX coordination service listens.
SERVICE_UP = "service"


def _ids(value: Any) -> tuple[int, ...]:
  return tuple(int(c) for c in value)


@dataclasses.dataclass(frozen=True)
class Failed:
  """Client `by` reports that `clients` failed (relayed by client 0)."""
  clients: tuple[int, ...]
  why: str
  subject: tuple[int, ...]
  by: int

  @property
  def reason(self) -> Reason:
    return Reason(self.why, self.subject, self.by)

  def to_frame(self) -> dict[str, Any]:
    return {"failed": list(self.clients), "why": self.why, "subject": list(self.subject),
            "by": self.by}


@dataclasses.dataclass(frozen=True)
class Left:
  """`client` is leaving: with a `failure` (`raised`: an exception; else exit
  `code`), or finished (then to client 0 only, never relayed)."""
  client: int
  code: int
  why: str
  failure: bool
  raised: bool = False

  def to_frame(self) -> dict[str, Any]:
    return {"left": self.client, "code": self.code, "why": self.why,
            "failure": self.failure, "raised": self.raised}


@dataclasses.dataclass(frozen=True)
class Notice:
  """Something client `by` says that the others should log."""
  text: str
  by: int

  def to_frame(self) -> dict[str, Any]:
    return {"notice": self.text, "by": self.by}


@dataclasses.dataclass(frozen=True)
class Ended:
  """Client 0's word that culprit `client`'s process has ended."""
  client: int

  def to_frame(self) -> dict[str, Any]:
    return {"ended": self.client}


@dataclasses.dataclass(frozen=True)
class Bye:
  """The sender exits normally: its end of stream is not a death."""

  def to_frame(self) -> dict[str, Any]:
    return {"bye": True}


@dataclasses.dataclass(frozen=True)
class ServiceUp:
  """Client 0's JAX coordination service listens (start-up only)."""

  def to_frame(self) -> dict[str, Any]:
    return {SERVICE_UP: True}


LinkMessage = Union[Failed, Left, Notice, Ended, Bye, ServiceUp]


def read(message: dict[str, Any], sender: int) -> LinkMessage | None:
  """The message `sender` sent as `message`; None for one this version does
  not know (ignored, as a newer peer's would be).

  Raises:
    ValueError, TypeError, KeyError: A malformed message.
  """
  if message.get("bye"):
    return Bye()
  if SERVICE_UP in message:
    return ServiceUp()
  if "ended" in message:
    return Ended(int(message["ended"]))
  if "failed" in message:
    return Failed(_ids(message["failed"]), str(message.get("why", "")),
                  _ids(message.get("subject", ())), int(message.get("by", sender)))
  if "left" in message:
    return Left(int(message["left"]), int(message.get("code", 0)),
                str(message.get("why", "")), bool(message.get("failure")),
                bool(message.get("raised")))
  if "notice" in message:
    return Notice(str(message["notice"]), int(message.get("by", sender)))
  return None
