"""The one wire format of jdtensor's own connections.

PURE: standard library only.

Three conversations use it: the clients' start-up handshake and the liveness
links that stay open after it (`jdtensor.runtime.rendezvous`,
`jdtensor.runtime.links`), and the launchers of several nodes
(`jdtensor.launcher.nodes`). Each frame is one JSON object on one line, at
most `MAX_FRAME` bytes; every handshake proves itself with `handshake_proof`;
addresses are ``host:port`` or ``[v6]:port``. The liveness links also carry
the heartbeat's beats as short binary frames (`encode_binary`): a zero
byte, the payload's length in one byte, the payload (no JSON line starts
with a zero byte).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

__all__ = ["MAX_FRAME", "Frames", "encode", "encode_binary", "handshake_proof",
           "split_host_port", "format_host_port", "socket_host"]

# The largest frame accepted on the coordinator port, the links and between
# launchers.
MAX_FRAME = 64 * 1024


def encode(frame: dict[str, Any]) -> bytes:
  """One frame, ready to send."""
  return (json.dumps(frame) + "\n").encode()


def encode_binary(payload: bytes) -> bytes:
  """One binary frame (at most 255 bytes of payload), ready to send."""
  if len(payload) > 255:
    raise ValueError(f"a binary frame of {len(payload)} bytes (at most 255)")
  return bytes((0, len(payload))) + payload


class Frames:
  """Newline-ended JSON objects from a byte stream, at most `MAX_FRAME` each.

  Args:
    lenient: Skip what is not a frame instead of raising (the liveness links:
      a peer already met can only be ignored, not refused).
    limit: The largest frame accepted, in bytes.
    binary: Accept binary frames (`encode_binary`; the liveness links): they
      come out as `bytes`, the JSON ones as dictionaries.
  """

  def __init__(self, lenient: bool = False, limit: int = MAX_FRAME,
               binary: bool = False) -> None:
    self._buf = b""
    self._lenient = lenient
    self._limit = limit
    self._binary = binary

  @property
  def empty(self) -> bool:
    """Whether no part of a frame is held (the next byte starts one)."""
    return not self._buf

  def feed(self, data: bytes) -> list[Any]:
    """The complete frames so far.

    Raises:
      ValueError: For anything malformed (never when lenient).
    """
    buf = self._buf + data if self._buf else data
    frames: list[Any] = []
    start, end = 0, len(buf)
    while start < end:
      if self._binary and buf[start] == 0:
        if end - start < 2 or end - start < 2 + buf[start + 1]:
          break
        size = buf[start + 1]
        frames.append(buf[start + 2:start + 2 + size])
        start += 2 + size
        continue
      stop = buf.find(b"\n", start)
      if stop < 0:
        break
      line, start = buf[start:stop], stop + 1
      try:
        frames.append(self._parse(line))
      except ValueError:
        if not self._lenient:
          self._buf = buf[start:]
          raise
    self._buf = buf[start:]
    if len(self._buf) > self._limit:
      if not self._lenient:
        raise ValueError(f"more than {self._limit} bytes without a line end")
      self._buf = b""  # A peer gone mad: drop what cannot be a frame.
    return frames

  def _parse(self, line: bytes) -> dict[str, Any]:
    if len(line) > self._limit:
      raise ValueError(f"a frame of {len(line)} bytes (at most {self._limit})")
    try:
      frame = json.loads(line)
    except (ValueError, RecursionError):
      raise ValueError("a frame that is not JSON") from None
    if not isinstance(frame, dict):
      raise ValueError("a frame that is not a JSON object")
    return frame


def handshake_proof(secret: str | None, *parts: str) -> str:
  """HMAC-SHA256 of `parts` under `secret` ("" without one): every handshake's
  proof (the clients' and the launchers')."""
  if not secret:
    return ""
  return hmac.new(secret.encode(), "|".join(parts).encode(), hashlib.sha256).hexdigest()


def split_host_port(address: str) -> tuple[str, int]:
  """``'host:port'`` or ``'[v6]:port'`` -> (host, port)."""
  host, _, port = address.rpartition(":")
  return host.strip("[]"), int(port)


def socket_host(host: str) -> str | bytes:
  """`host` as `socket.getaddrinfo` (and `socket.create_connection`) take it
  without loading the ``idna`` codec.

  CPython encodes a ``str`` host with ``idna``, and the codec's first use
  imports ``encodings.idna``, ``stringprep`` and ``unicodedata``: about 2 ms,
  measured, on every client's start-up path, which raw JAX never pays. An
  ASCII name is the same name as bytes; any other goes through ``idna`` as
  before.
  """
  return host.encode("ascii") if host.isascii() else host


def format_host_port(host: str, port: int) -> str:
  """(host, port) -> ``'host:port'``, or ``'[v6]:port'``."""
  return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
