"""Start-up rendezvous on the coordinator port, before JAX is touched.

PURE: standard library only, no jax.

``jax.distributed.initialize`` aborts the whole process (a C++ fatal log and
a stack dump) when the coordinator's port is taken, when the coordinator never
comes up, or when a peer never registers. To turn each of those into a Python
exception that says what is wrong, every client first meets client 0 here:

1. Client 0 binds the coordinator address (``DTENSOR_JOBS[0]``'s host, or the
   bind address asked for) and listens on the coordinator port.
2. Every other client connects (retrying until the init deadline) and sends a
   JSON hello: its client id, the cluster as it sees it, its device count.
3. Client 0 checks that all hellos agree (same ``DTENSOR_JOBS``, distinct
   ids, equal device counts), answers ``go`` or the error to everyone, and
   closes the listener; JAX's coordination service then binds the same port.

After it, every client is known to be alive and consistent, so JAX's own
initialisation does not hit its aborting time-outs.
"""

from __future__ import annotations

import errno
import json
import select
import socket
import time
from dataclasses import dataclass

from jdtensor.errors import StartupError, StartupTimeoutError

__all__ = ["Hello", "split_host_port", "bind_address", "rendezvous"]

_PROTOCOL = 1
_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Hello:
  """What each client tells client 0."""
  client_id: int
  num_clients: int
  jobs: tuple[str, ...]
  local_devices: int

  def to_json(self) -> bytes:
    return (json.dumps({"jdtensor": _PROTOCOL, "client_id": self.client_id,
                        "num_clients": self.num_clients, "jobs": list(self.jobs),
                        "local_devices": self.local_devices}) + "\n").encode()

  @classmethod
  def from_json(cls, line: bytes) -> Hello:
    data = json.loads(line)
    if data.get("jdtensor") != _PROTOCOL:
      raise ValueError(f"not a jdtensor hello: {line[:80]!r}")
    return cls(int(data["client_id"]), int(data["num_clients"]),
               tuple(data["jobs"]), int(data["local_devices"]))


def split_host_port(address: str) -> tuple[str, int]:
  """``'host:port'`` or ``'[v6]:port'`` -> (host, port)."""
  host, _, port = address.rpartition(":")
  return host.strip("[]"), int(port)


def bind_address(coordinator: str, override: str | None) -> tuple[str, int]:
  """Where client 0 binds the coordinator: `coordinator`'s host by default.

  ``localhost`` binds to loopback (127.0.0.1). `override` may be a host (the
  coordinator's port is kept) or ``host:port``.
  """
  host, port = split_host_port(coordinator)
  if override:
    if override.count(":") == 1 or override.startswith("["):
      if override.rsplit(":", 1)[-1].isdigit():
        return split_host_port(override)
    return override.strip("[]"), port
  if host == "localhost":
    host = "127.0.0.1"
  return host, port


def _format_bind(host: str, port: int) -> str:
  return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen(host: str, port: int, coordinator: str) -> socket.socket:
  try:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
  except socket.gaierror as e:
    raise StartupError(
        f"Client 0 cannot start the coordinator: the host of DTENSOR_JOBS[0]="
        f"{coordinator!r} ({host!r}) does not resolve ({e}). Fix DTENSOR_JOBS.") from None
  family, _, _, _, sockaddr = infos[0]
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind(sockaddr)
  except OSError as e:
    sock.close()
    if e.errno == errno.EADDRINUSE:
      why = ("is already in use by another process; stop it, or choose a free "
             "port for DTENSOR_JOBS[0] (`jdtensor launch` picks free ports)")
    elif e.errno == errno.EADDRNOTAVAIL:
      why = ("is not an address of this machine; run client 0 on the host "
             "named by DTENSOR_JOBS[0], or set JDTENSOR_COORDINATOR_BIND_ADDRESS")
    else:
      why = f"cannot be bound ({e.strerror})"
    raise StartupError(
        f"Client 0 cannot start the coordinator for DTENSOR_JOBS[0]="
        f"{coordinator!r}: {_format_bind(host, port)} {why}.") from None
  sock.listen(128)
  return sock


def _recv_line(sock: socket.socket, deadline: float) -> bytes | None:
  """One newline-terminated message, or None on EOF or at the deadline."""
  buf = b""
  while not buf.endswith(b"\n"):
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      return None
    ready, _, _ = select.select([sock], [], [], min(remaining, 1.0))
    if not ready:
      continue
    chunk = sock.recv(65536)
    if not chunk:
      return None
    buf += chunk
  return buf


def _serve(me: Hello, host: str, port: int, coordinator: str, timeout: float,
           deadline: float) -> None:
  listener = _listen(host, port, coordinator)
  peers: dict[int, tuple[socket.socket, Hello]] = {}
  pending: list[socket.socket] = []
  problems: list[str] = []
  try:
    while len(peers) < me.num_clients - 1 and not problems:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        missing = [i for i in range(1, me.num_clients) if i not in peers]
        raise StartupTimeoutError(
            f"Client 0 waited {timeout:g} s (the init timeout) at the "
            f"coordinator DTENSOR_JOBS[0]={coordinator!r} for client(s) "
            f"{', '.join(map(str, missing))}, which never connected. Start "
            "every client with the same DTENSOR_JOBS and its own "
            "DTENSOR_CLIENT_ID, or raise the init timeout "
            "(JDTENSOR_INIT_TIMEOUT).")
      ready, _, _ = select.select([listener, *pending], [], [],
                                  min(remaining, 1.0))
      for sock in ready:
        if sock is listener:
          conn, _ = listener.accept()
          pending.append(conn)
          continue
        pending.remove(sock)
        line = _recv_line(sock, time.monotonic() + 5)
        try:
          hello = Hello.from_json(line or b"")
        except (ValueError, KeyError, TypeError):
          sock.close()  # Not a jdtensor client (e.g. a port scanner).
          continue
        problem = _check(me, hello, peers)
        if problem:
          problems.append(problem)
          _reply(sock, {"error": problem})
          sock.close()
        else:
          peers[hello.client_id] = (sock, hello)
    message = {"error": problems[0]} if problems else {"go": True}
    for sock, _ in peers.values():
      _reply(sock, message)
    if problems:
      raise StartupError(problems[0])
    # Let the peers close first, so the port is free of TIME_WAIT on our side.
    for sock, _ in peers.values():
      _recv_line(sock, time.monotonic() + 2)
  finally:
    for sock in pending:
      sock.close()
    for sock, _ in peers.values():
      sock.close()
    listener.close()


def _check(me: Hello, hello: Hello, peers: dict[int, tuple[socket.socket, Hello]]
           ) -> str:
  if hello.jobs != me.jobs:
    return (f"Client {hello.client_id} has DTENSOR_JOBS={','.join(hello.jobs)!r} "
            f"but client 0 has {','.join(me.jobs)!r}; every client needs the "
            "same DTENSOR_JOBS.")
  if hello.client_id == 0 or hello.client_id in peers:
    return (f"Two processes claim DTENSOR_CLIENT_ID={hello.client_id}; give "
            f"each of the {me.num_clients} clients its own id "
            f"0..{me.num_clients - 1}.")
  if hello.local_devices != me.local_devices:
    return (f"Client {hello.client_id} has {hello.local_devices} local devices "
            f"but client 0 has {me.local_devices}; DTensor meshes need the same "
            "number of devices on every client.")
  return ""


def _reply(sock: socket.socket, message: dict[str, object]) -> None:
  try:
    sock.sendall((json.dumps(message) + "\n").encode())
  except OSError:
    pass


def _join(me: Hello, coordinator: str, timeout: float, deadline: float) -> None:
  host, port = split_host_port(coordinator)
  while True:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      raise StartupTimeoutError(
          f"Client {me.client_id} could not reach the coordinator at "
          f"DTENSOR_JOBS[0]={coordinator!r} within {timeout:g} s (the init "
          "timeout): client 0 has not started it. Start client 0 (it hosts the "
          "coordinator), check that every client has the same DTENSOR_JOBS, or "
          "raise the init timeout (JDTENSOR_INIT_TIMEOUT).")
    try:
      sock = socket.create_connection((host, port), timeout=min(remaining, 2.0))
    except OSError:
      time.sleep(min(_POLL_SECONDS, max(remaining, 0)))
      continue
    with sock:
      sock.setblocking(True)
      try:
        sock.sendall(me.to_json())
      except OSError:
        time.sleep(_POLL_SECONDS)
        continue
      line = _recv_line(sock, deadline)
    if line is None:
      if time.monotonic() >= deadline:
        continue  # Reported as a timeout above.
      raise StartupError(
          f"Client {me.client_id}: the process at DTENSOR_JOBS[0]="
          f"{coordinator!r} closed the connection during start-up; it is not "
          "a jdtensor client 0, or it failed. Check client 0's output.")
    reply = json.loads(line)
    if "error" in reply:
      raise StartupError(f"Client {me.client_id}: start-up refused by client 0: "
                         f"{reply['error']}")
    return


def rendezvous(me: Hello, coordinator: str, bind: tuple[str, int],
               timeout: float) -> None:
  """Meets every client at the coordinator port, or raises.

  Args:
    me: This client's view of the cluster.
    coordinator: ``DTENSOR_JOBS[0]``.
    bind: Where client 0 listens (see `bind_address`).
    timeout: Seconds to wait in all.

  Raises:
    StartupError: Port taken, bind address not on this host, inconsistent
      clusters, duplicate client ids, unequal device counts.
    StartupTimeoutError: A peer never connected (client 0), or the
      coordinator never came up (other clients).
  """
  deadline = time.monotonic() + timeout
  if me.client_id == 0:
    _serve(me, bind[0], bind[1], coordinator, timeout, deadline)
  else:
    _join(me, coordinator, timeout, deadline)
