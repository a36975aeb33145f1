"""Start-up rendezvous on the coordinator port, before JAX is touched.

PURE: standard library only, no jax.

``jax.distributed.initialize`` aborts the whole process (a C++ fatal log and
a stack dump) when the coordinator's port is taken, when the coordinator never
comes up, or when a peer never registers. To turn each of those into a Python
exception that says what is wrong, every client first meets client 0 here:

1. Client 0 binds the coordinator address (``DTENSOR_JOBS[0]``'s host, or the
   bind address asked for) and listens on the coordinator port.
2. Every other client connects (retrying until the init deadline) and sends a
   JSON hello: its client id, the cluster as it sees it, its device count,
   whether its heartbeat is on.
3. Client 0 checks that all hellos agree (same ``DTENSOR_JOBS``, distinct
   ids, equal device counts, heartbeat on everywhere or nowhere), reserves a
   port for the heartbeat's private coordination service (`reserve_port`),
   answers ``go`` with that port, or the error, to everyone, and closes the
   listener; JAX's coordination service then binds the same port.

After it, every client is known to be alive and consistent, so JAX's own
initialisation does not hit its aborting time-outs. The connections stay open
as liveness links (`Links`), which the heartbeat watches.
"""

from __future__ import annotations

import errno
import json
import select
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from jdtensor.errors import StartupError, StartupTimeoutError

__all__ = ["Hello", "Links", "Meeting", "split_host_port", "bind_address",
           "reserve_port", "rendezvous", "wait_for_service"]

_PROTOCOL = 1
_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Hello:
  """What each client tells client 0."""
  client_id: int
  num_clients: int
  jobs: tuple[str, ...]
  local_devices: int
  heartbeat: bool = True
  # Settings every client must share, by variable name (heartbeat period and
  # policy, time-outs): compared as they are.
  settings: tuple[tuple[str, object], ...] = ()

  def to_json(self) -> bytes:
    return (json.dumps({"jdtensor": _PROTOCOL, "client_id": self.client_id,
                        "num_clients": self.num_clients, "jobs": list(self.jobs),
                        "local_devices": self.local_devices,
                        "heartbeat": self.heartbeat,
                        "settings": dict(self.settings)}) + "\n").encode()

  @classmethod
  def from_json(cls, line: bytes) -> Hello:
    data = json.loads(line)
    if data.get("jdtensor") != _PROTOCOL:
      raise ValueError(f"not a jdtensor hello: {line[:80]!r}")
    return cls(int(data["client_id"]), int(data["num_clients"]),
               tuple(data["jobs"]), int(data["local_devices"]),
               bool(data["heartbeat"]),
               tuple(sorted(dict(data.get("settings", {})).items())))


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


def reserve_port(host: str) -> socket.socket:
  """Reserves a free TCP port on `host` for a gRPC server to bind later.

  The socket is bound with SO_REUSEPORT but not listening: nobody can connect
  to it, and gRPC (which sets SO_REUSEPORT) can bind the same port while it is
  held, so no other process can take the port in between (a gRPC server that
  finds its port taken crashes the process). Close it once the server runs.
  """
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
  sock.bind((host, 0))
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
           deadline: float) -> Meeting:
  listener = _listen(host, port, coordinator)
  reserved: socket.socket | None = None
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
    # Close the listener before saying "go": from now on only JAX's
    # coordination service can accept on this port (see wait_for_service).
    listener.close()
    message: dict[str, object] = {"error": problems[0]} if problems else {"go": True}
    if not problems:
      reserved = reserve_port(host)
      message["heartbeat_port"] = reserved.getsockname()[1]
    for sock, _ in peers.values():
      _reply(sock, message)
    if problems:
      raise StartupError(problems[0])
    links = {client: sock for client, (sock, _) in peers.items()}
    peers.clear()  # Kept open as liveness links; not closed below.
    meeting = Meeting(Links(0, links), int(message["heartbeat_port"]), reserved)
    reserved = None  # Handed over; not closed below.
    return meeting
  finally:
    if reserved is not None:
      reserved.close()
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
  if hello.heartbeat != me.heartbeat:
    return (f"Client {hello.client_id} has the heartbeat "
            f"{'on' if hello.heartbeat else 'off'} but client 0 has it "
            f"{'on' if me.heartbeat else 'off'}; set DTENSOR_ENABLE_HEARTBEAT the "
            "same on every client.")
  theirs, mine = dict(hello.settings), dict(me.settings)
  for name in sorted(set(theirs) | set(mine)):
    if theirs.get(name) != mine.get(name):
      return (f"Client {hello.client_id} has {name}={theirs.get(name)!r} but "
              f"client 0 has {mine.get(name)!r}; set {name} the same on every "
              "client.")
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


def _join(me: Hello, coordinator: str, timeout: float, deadline: float
          ) -> Meeting:
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
    sock.setblocking(True)
    try:
      sock.sendall(me.to_json())
    except OSError:
      sock.close()
      time.sleep(_POLL_SECONDS)
      continue
    line = _recv_line(sock, deadline)
    if line is None:
      sock.close()
      if time.monotonic() >= deadline:
        continue  # Reported as a timeout above.
      raise StartupError(
          f"Client {me.client_id}: the process at DTENSOR_JOBS[0]="
          f"{coordinator!r} closed the connection during start-up; it is not "
          "a jdtensor client 0, or it failed. Check client 0's output.")
    reply = json.loads(line)
    if "error" in reply:
      sock.close()
      raise StartupError(f"Client {me.client_id}: start-up refused by client 0: "
                         f"{reply['error']}")
    return Meeting(Links(me.client_id, {0: sock}), int(reply["heartbeat_port"]))


def wait_for_service(coordinator: str, deadline: float, client_id: int) -> None:
  """Waits until client 0's JAX coordination service accepts connections.

  Connecting before it listens sends JAX's gRPC client into its reconnect
  back-off (about a second). After the rendezvous, client 0's own listener is
  closed, so the first accepted connection is the service's.

  Raises:
    StartupTimeoutError: If it does not come up by `deadline`.
  """
  host, port = split_host_port(coordinator)
  while time.monotonic() < deadline:
    try:
      socket.create_connection((host, port), timeout=1.0).close()
      return
    except OSError:
      time.sleep(0.005)
  raise StartupTimeoutError(
      f"Client {client_id}: client 0 met every client, but its JAX coordination "
      f"service at DTENSOR_JOBS[0]={coordinator!r} did not come up before the "
      "init timeout; check client 0's output.")


_TCP_ESTABLISHED = 1


def _peer_open(sock: socket.socket) -> bool:
  """Whether the other end of a connection is still open (Linux TCP_INFO)."""
  try:
    state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
  except OSError:
    return False  # Closed here already.
  return state == _TCP_ESTABLISHED


@dataclass
class Meeting:
  """What the rendezvous leaves behind.

  Attributes:
    links: The connections, kept open as liveness links (see `Links`).
    heartbeat_port: The port of the heartbeat's private coordination service,
      on client 0's coordinator host (reserved by client 0).
    heartbeat_socket: Client 0 only: the socket holding that port until the
      service binds it (see `reserve_port`).
  """
  links: Links
  heartbeat_port: int
  heartbeat_socket: socket.socket | None = None


def rendezvous(me: Hello, coordinator: str, bind: tuple[str, int],
               timeout: float) -> Meeting:
  """Meets every client at the coordinator port, or raises.

  Args:
    me: This client's view of the cluster.
    coordinator: ``DTENSOR_JOBS[0]``.
    bind: Where client 0 listens (see `bind_address`).
    timeout: Seconds to wait in all.

  Returns:
    The liveness links and the heartbeat service's port (see `Meeting`).

  Raises:
    StartupError: Port taken, bind address not on this host, inconsistent
      clusters, duplicate client ids, unequal device counts.
    StartupTimeoutError: A peer never connected (client 0), or the
      coordinator never came up (other clients).
  """
  deadline = time.monotonic() + timeout
  if me.client_id == 0:
    return _serve(me, bind[0], bind[1], coordinator, timeout, deadline)
  return _join(me, coordinator, timeout, deadline)


class Links:
  """The rendezvous connections, kept open to notice a dead process at once.

  A star: client 0 holds one connection per client, every other client one to
  client 0, which relays every message to the others. A process that exits
  normally says ``bye`` first; an end of stream without it means the process
  died. Failure reports (`report`), departures (`announce_departure`) and
  notices (`notice`) reach every client within milliseconds (JAX's own
  detection takes its heartbeat time-out, or aborts the survivors with a C++
  fatal log when client 0 dies).

  Events go to a handler object (`watch`) with any of these methods, called
  from a daemon thread:

  * ``peer_died(client, how)``: a linked process ended without a goodbye;
  * ``peer_reported(clients, why, reporter)``: a client reports `clients`
    failed (this client included, when it is the one named);
  * ``peer_left(client, code, why, failed)``: a client announces it is
    leaving, with its exit code and reason;
  * ``peer_notice(client, text)``: something the others should know.
  """

  def __init__(self, client_id: int, sockets: dict[int, socket.socket]):
    self.client_id = client_id
    self._sockets = dict(sockets)
    self._closing = False
    self._said_bye: set[int] = set()
    self._lock = threading.Lock()
    self._handler: object | None = None
    self._thread: threading.Thread | None = None

  def watch(self, handler: object | None) -> None:
    """Routes events to `handler` (None ignores them); starts watching."""
    with self._lock:
      self._handler = handler
      if self._thread is None:
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="jdtensor-liveness")
        self._thread.start()

  def _emit(self, event: str, *args: object) -> None:
    method = getattr(self._handler, event, None)
    if method is not None:
      method(*args)

  def _watch(self) -> None:
    buffers = {client: b"" for client in self._sockets}
    while self._sockets and not self._closing:
      by_socket = {s: c for c, s in self._sockets.items()}
      try:
        ready, _, _ = select.select(list(by_socket), [], [], 5.0)
      except (OSError, ValueError):
        return  # Closed under us: we are exiting.
      for sock in ready:
        client = by_socket[sock]
        try:
          chunk = sock.recv(4096)
        except OSError:
          chunk = b""
        if not chunk:
          self._drop(client)
          if not self._closing and client not in self._said_bye:
            self._emit("peer_died", client,
                       "its process ended without saying goodbye"
                       if client != 0 else "the coordinator's process ended")
          continue
        buffers[client] += chunk
        while b"\n" in buffers[client]:
          line, buffers[client] = buffers[client].split(b"\n", 1)
          try:
            message = json.loads(line)
          except ValueError:
            continue
          if isinstance(message, dict):
            self._dispatch(client, message)

  def _dispatch(self, client: int, message: dict[str, object]) -> None:
    if message.get("bye"):  # Its end of stream is now a normal exit.
      self._said_bye.add(client)
      return
    if self._closing:
      return
    if self.client_id == 0:  # The hub: relay to everyone else.
      self._send(message, skip={client})
    try:
      if "failed" in message:
        self._emit("peer_reported", [int(c) for c in message["failed"]],  # type: ignore[union-attr]
                   str(message.get("why", "")), int(message.get("by", client)))  # type: ignore[arg-type]
      elif "left" in message:
        self._emit("peer_left", int(message["left"]), int(message.get("code", 0)),  # type: ignore[arg-type]
                   str(message.get("why", "")), bool(message.get("failure")))
      elif "notice" in message:
        self._emit("peer_notice", int(message.get("by", client)),  # type: ignore[arg-type]
                   str(message["notice"]))
    except (TypeError, ValueError):
      pass  # A malformed message from a peer is ignored.

  def _drop(self, client: int) -> None:
    with self._lock:
      sock = self._sockets.pop(client, None)
    if sock is not None:
      sock.close()

  def _send(self, message: dict[str, object], skip: set[int] = frozenset()
            ) -> None:
    with self._lock:
      targets = [s for c, s in self._sockets.items() if c not in skip]
    for sock in targets:
      _reply(sock, message)

  def report(self, clients: Sequence[int], why: str) -> None:
    """Tells every other client which clients failed and why.

    Sent before this process's connections close, so every client learns the
    culprit rather than blaming this process's exit; the culprits hear it
    too, so that a client that was frozen names itself when it wakes.
    """
    self._send({"failed": [int(c) for c in clients], "why": why,
                "by": self.client_id})

  def announce_departure(self, code: int, why: str, failure: bool) -> None:
    """Tells every other client that this one is leaving, and why."""
    self._send({"left": self.client_id, "code": int(code), "why": why,
                "failure": bool(failure)})

  def notice(self, text: str) -> None:
    """Tells every other client something worth logging."""
    self._send({"notice": text, "by": self.client_id})

  def wait_peers_gone(self, timeout: float, ignore: Sequence[int] = ()) -> None:
    """Waits up to `timeout` s until every linked process (but `ignore`) ended.

    Safe from any thread, the watching one included: it reads each
    connection's TCP state (the peer's end closes when its process ends),
    not its stream, so no message is consumed or needed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      with self._lock:
        sockets = [s for c, s in self._sockets.items() if c not in ignore]
      if not any(_peer_open(sock) for sock in sockets):
        return
      time.sleep(0.02)

  def goodbye(self) -> None:
    """Tells the others this process is exiting normally.

    The connections stay open until the process ends, so that client 0,
    which hosts the coordination services, can wait for every other
    process to be really gone before it exits.
    """
    self._closing = True
    self._send({"bye": True})
