"""Bytes this process moves: whether a client in its own code is making
progress (an upload, a download, a slow read or write) or is stuck.

A hang (a sleep, a lock or a queue that never comes, a read that never
returns) moves no bytes; an upload or a checkpoint written in small pieces
does, while its CPU use stays near zero. Two counters, both Linux's, cover
what a training program moves:

* ``/proc/self/io`` (``rchar`` + ``wchar``): every byte passed to
  ``read``/``write`` and their kin: files (local or a network file system),
  pipes, terminals;
* each TCP socket's ``TCP_INFO`` (``tcpi_bytes_acked`` +
  ``tcpi_bytes_received``): what ``send``/``recv`` move, which
  ``/proc/self/io`` does not count (HTTP uploads, gRPC, object stores).

jdtensor's own traffic is left out: its liveness links (their descriptors
are known) and the coordination service's connections (by its port). What
neither counter sees (UDP, Unix-domain sockets through ``send``/``recv``,
memory-mapped files) reads as idle: the stall time-out then judges it.

`ByteMeter.total` is called once a beat from the heartbeat thread; it reads
``/proc/self/io`` and, only while the main thread runs its own code (the
only time a client can be named a staller), lists ``/proc/self/fd``: a
steady loop, inside JAX most of the time, pays one small file read a beat.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
from collections.abc import Callable, Iterable

__all__ = ["ByteMeter", "tcp_bytes"]

_TCP_INFO_SIZE = 232
# Offsets of tcpi_bytes_acked and tcpi_bytes_received in struct tcp_info
# (linux/tcp.h, Linux 4.2 and newer).
_BYTES_AT = struct.Struct("<QQ")
_BYTES_OFFSET = 120
_SOCKADDR_SIZE = 128

_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL | None:
  global _libc
  if _libc is None:
    try:
      _libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
      return None
  return _libc


def tcp_bytes(fd: int) -> int | None:
  """Bytes acknowledged plus bytes received on the TCP socket `fd`; None if
  it is not one (or the kernel is older than 4.2)."""
  libc = _c()
  if libc is None:
    return None
  buf = ctypes.create_string_buffer(_TCP_INFO_SIZE)
  size = ctypes.c_uint32(_TCP_INFO_SIZE)
  if libc.getsockopt(fd, socket.IPPROTO_TCP, socket.TCP_INFO, buf,
                     ctypes.byref(size)) != 0:
    return None
  if size.value < _BYTES_OFFSET + _BYTES_AT.size:
    return None
  acked, received = _BYTES_AT.unpack_from(buf.raw, _BYTES_OFFSET)
  return acked + received


def _ports(fd: int) -> tuple[int, int]:
  """(local port, peer port) of socket `fd` (0 where unknown); the port sits
  at the same offset for IPv4 and IPv6."""
  libc = _c()
  ports = []
  for call in ("getsockname", "getpeername"):
    buf = ctypes.create_string_buffer(_SOCKADDR_SIZE)
    size = ctypes.c_uint32(_SOCKADDR_SIZE)
    ok = libc is not None and getattr(libc, call)(fd, buf, ctypes.byref(size)) == 0
    ports.append(struct.unpack_from(">H", buf.raw, 2)[0] if ok else 0)
  return ports[0], ports[1]


def _proc_io() -> int | None:
  """rchar + wchar of this process; None where there is no /proc."""
  try:
    with open("/proc/self/io", "rb") as f:
      text = f.read()
  except OSError:
    return None
  total = 0
  for line in text.splitlines():
    if line.startswith((b"rchar:", b"wchar:")):
      total += int(line.split()[1])
  return total


class ByteMeter:
  """Counts the bytes this process moves, less jdtensor's own.

  Args:
    own_sockets: Returns the descriptors of jdtensor's own sockets (the
      liveness links), left out.
    service_ports: Ports whose connections are the coordination service's
      (the coordinator's), left out.
  """

  def __init__(self, own_sockets: Callable[[], Iterable[int]] = tuple,
               service_ports: Iterable[int] = ()):
    self._own_sockets = own_sockets
    self._service_ports = frozenset(p for p in service_ports if p)
    # A socket's /proc name ("socket:[inode]") -> whether it is counted.
    self._sockets: dict[str, bool] = {}
    self._tcp_seen: dict[int, int] = {}  # fd -> bytes at the last reading.
    self.tcp_total = 0  # TCP bytes counted since the meter started.

  def total(self, sockets: bool = True) -> int:
    """Bytes moved since the meter started: files and pipes; with `sockets`,
    the TCP bytes since the last reading with `sockets` too (so the first
    reading after a gap may carry a collective's traffic: one beat)."""
    files = _proc_io() or 0
    if sockets:
      self._count_tcp()
    return files + self.tcp_total

  def _count_tcp(self) -> None:
    own = set(self._own_sockets())
    try:
      fds = os.listdir("/proc/self/fd")
    except OSError:
      return
    seen: dict[int, int] = {}
    for name in fds:
      fd = int(name)
      if fd in own:
        continue
      try:
        target = os.readlink(f"/proc/self/fd/{name}")
      except OSError:
        continue
      if not target.startswith("socket:"):
        continue
      counted = self._sockets.get(target)
      if counted is None:
        counted = tcp_bytes(fd) is not None and not (
            set(_ports(fd)) & self._service_ports)
        self._sockets[target] = counted
      if not counted:
        continue
      moved = tcp_bytes(fd)
      if moved is None:
        continue
      seen[fd] = moved
      before = self._tcp_seen.get(fd)
      if before is not None and moved >= before:
        self.tcp_total += moved - before
    self._tcp_seen = seen
    if len(self._sockets) > 4 * len(fds) + 64:  # Closed sockets' inodes.
      self._sockets.clear()
