"""Start-up rendezvous on the coordinator port, before JAX is touched.

PURE: standard library only, no jax.

``jax.distributed.initialize`` aborts the whole process (a C++ fatal log and
a stack dump) when the coordinator's port is taken, when the coordinator never
comes up, or when a peer never registers. To turn each of those into a Python
exception that says what is wrong, every client first meets client 0 here:

1. Client 0 binds the coordinator address (``DTENSOR_JOBS[0]``'s host, or the
   bind address asked for) and listens on the coordinator port.
2. Every other client connects (retrying until the init deadline). They
   authenticate each other before anything about the cluster is said: client
   0 sends a challenge (a nonce, its run id, whether it has a secret); the
   client answers with its run id, its own nonce and an HMAC of both nonces
   under ``JDTENSOR_RUN_SECRET``; client 0 checks it and proves itself back.
3. The client sends its hello: client id, cluster size, a digest of
   ``DTENSOR_JOBS``, job name, device count, heartbeat on or off and the
   settings every client must share.
4. Client 0 checks that all hellos agree, reserves a port for the heartbeat's
   private coordination service (`reserve_port`), answers ``go`` with that
   port, or the error, to everyone, and closes the listener; JAX's
   coordination service then binds the same port.

**A bad peer cannot break it.** Client 0 serves every connection at once
(a selector), frames are newline-ended JSON objects of at most `MAX_FRAME`
bytes, each stage of a connection has `STAGE_SECONDS`, and anything malformed,
late, from another run or without the secret is refused with one log line on
client 0 (the peer's address and why) while client 0 keeps waiting for the
real clients. Nothing about the cluster is ever sent to a peer that has not
authenticated; without a secret (a warning says so) nobody is authenticated,
and errors name only what the peer sent.

After it, every client is known to be alive and consistent, so JAX's own
initialisation does not hit its aborting time-outs. The connections stay open
as liveness links (`Links`), which the heartbeat watches.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import re
import select
import selectors
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jdtensor import _logging as logging
from jdtensor._deadline import Deadline
from jdtensor._wire import (MAX_FRAME, Frames, encode, format_host_port, handshake_proof,
                            split_host_port)
from jdtensor.runtime.links import Links
from jdtensor.errors import StartupError, StartupTimeoutError

__all__ = ["Hello", "Meeting", "bind_address", "reserve_port", "rendezvous",
           "wait_for_service", "run_id", "jobs_digest", "STAGE_SECONDS"]

_PROTOCOL = 2
# The time a peer has for each stage of the handshake on client 0 (a
# legitimate client answers at once); frames are at most MAX_FRAME bytes.
STAGE_SECONDS = 2.0
# How long a client waits for client 0's answer at each stage.
_CLIENT_STAGE_SECONDS = 10.0
_POLL_SECONDS = 0.05
_NONCE_RE = re.compile(r"[0-9a-f]{64}")
_RUN_RE = re.compile(r"[0-9a-f]{0,32}")


def run_id(secret: str | None) -> str:
  """The run's name, derived from its secret ('' without one)."""
  if not secret:
    return ""
  return hashlib.sha256(b"jdtensor run id|" + secret.encode()).hexdigest()[:12]


def jobs_digest(jobs: Sequence[str]) -> str:
  """What clients compare instead of sending ``DTENSOR_JOBS`` itself."""
  return hashlib.sha256(",".join(jobs).encode()).hexdigest()


@dataclass(frozen=True)
class Hello:
  """What each client tells client 0 (once both are authenticated).

  Attributes:
    client_id, num_clients: This client and the cluster size.
    jobs: ``DTENSOR_JOBS`` (only its digest is sent).
    local_devices: This client's device count.
    heartbeat: ``DTENSOR_ENABLE_HEARTBEAT``.
    settings: Settings every client must share, by variable name (heartbeat
      period and policy, time-outs, ``DTENSOR_JOB_NAME``).
  """
  client_id: int
  num_clients: int
  jobs: tuple[str, ...]
  local_devices: int
  heartbeat: bool = True
  settings: tuple[tuple[str, object], ...] = ()

  def to_frame(self) -> dict[str, Any]:
    return {"jdtensor": _PROTOCOL, "client_id": self.client_id,
            "num_clients": self.num_clients, "jobs": jobs_digest(self.jobs),
            "num_jobs": len(self.jobs), "local_devices": self.local_devices,
            "heartbeat": self.heartbeat, "settings": dict(self.settings)}


@dataclass(frozen=True)
class _PeerHello:
  """A hello as received: checked field by field, nothing trusted."""
  client_id: int
  num_clients: int
  jobs: str
  num_jobs: int
  local_devices: int
  heartbeat: bool
  settings: dict[str, object]

  @classmethod
  def parse(cls, frame: dict[str, Any]) -> _PeerHello:
    """Raises ValueError naming the first field that is wrong."""
    def integer(name: str, low: int, high: int) -> int:
      value = frame.get(name)
      if type(value) is not int or not low <= value <= high:  # pylint: disable=unidiomatic-typecheck
        raise ValueError(f"field {name!r} is not an integer in {low}..{high}")
      return value
    if frame.get("jdtensor") != _PROTOCOL:
      raise ValueError("not a jdtensor hello of this version")
    jobs = frame.get("jobs")
    if not isinstance(jobs, str) or not re.fullmatch(r"[0-9a-f]{64}", jobs):
      raise ValueError("field 'jobs' is not a digest")
    heartbeat = frame.get("heartbeat")
    settings = frame.get("settings")
    if not isinstance(heartbeat, bool):
      raise ValueError("field 'heartbeat' is not a boolean")
    if not (isinstance(settings, dict) and len(settings) <= 64 and all(
        isinstance(k, str) and len(k) <= 64 and
        isinstance(v, (str, int, float, bool)) and len(str(v)) <= 256
        for k, v in settings.items())):
      raise ValueError("field 'settings' is malformed")
    return cls(integer("client_id", 0, 10**9), integer("num_clients", 1, 10**9),
               jobs, integer("num_jobs", 0, 10**9),
               integer("local_devices", 0, 10**9), heartbeat, settings)


def bind_address(coordinator: str, host: str | None, port: int | None
                 ) -> tuple[str, int]:
  """Where client 0 binds the coordinator: `coordinator`'s host and port,
  unless `host` or `port` (parsed from ``JDTENSOR_COORDINATOR_BIND_ADDRESS``)
  say otherwise. ``localhost`` binds to loopback (127.0.0.1)."""
  default_host, default_port = split_host_port(coordinator)
  if host is None:
    host = "127.0.0.1" if default_host == "localhost" else default_host
  return host, default_port if port is None else port


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
        f"{coordinator!r}: {format_host_port(host, port)} {why}.") from None
  sock.listen(128)
  sock.setblocking(False)
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


def _send(sock: socket.socket, frame: dict[str, Any]) -> bool:
  """Sends one frame; False if the peer is gone."""
  try:
    sock.setblocking(True)
    sock.settimeout(STAGE_SECONDS)
    sock.sendall(encode(frame))
    return True
  except OSError:
    return False
  finally:
    try:
      sock.setblocking(False)
    except OSError:
      pass


@dataclass(eq=False)
class _Conn:
  """One connection to client 0 during the handshake."""
  sock: socket.socket
  peer: str
  nonce: str
  deadline: float
  stage: str = "auth"  # auth -> hello -> done
  frames: Frames = field(default_factory=Frames)
  authenticated: bool = False
  hello: _PeerHello | None = None


class _Server:
  """Client 0's side: serves every connection at once, refuses bad peers."""

  def __init__(self, me: Hello, secret: str | None, coordinator: str,
               listener: socket.socket):
    self.me = me
    self.secret = secret
    self.run = run_id(secret)
    self.coordinator = coordinator
    self.listener = listener
    self.selector = selectors.DefaultSelector()
    self.selector.register(listener, selectors.EVENT_READ)
    self.conns: dict[socket.socket, _Conn] = {}
    self.peers: dict[int, _Conn] = {}
    self.problem = ""

  def _refuse(self, conn: _Conn, reason: str, told: str | None = None) -> None:
    """Drops a connection, with one log line here and `told` to the peer."""
    logging.warning("jdtensor: client 0 refused a start-up connection from %s: %s",
                    conn.peer, reason)
    if told is not None:
      _send(conn.sock, {"error": told})
    self._close(conn)

  def _close(self, conn: _Conn) -> None:
    self.conns.pop(conn.sock, None)
    try:
      self.selector.unregister(conn.sock)
    except (KeyError, ValueError):
      pass
    conn.sock.close()

  def _accept(self) -> None:
    try:
      sock, addr = self.listener.accept()
    except OSError:
      return
    sock.setblocking(False)
    peer = format_host_port(str(addr[0]), int(addr[1])) if isinstance(addr, tuple) else "?"
    conn = _Conn(sock, peer, os.urandom(32).hex(),
                 time.monotonic() + STAGE_SECONDS)
    self.conns[sock] = conn
    self.selector.register(sock, selectors.EVENT_READ)
    if not _send(sock, {"jdtensor": _PROTOCOL, "nonce": conn.nonce,
                        "run": self.run, "auth": bool(self.secret)}):
      self._close(conn)

  def _read(self, conn: _Conn) -> None:
    try:
      data = conn.sock.recv(MAX_FRAME)
    except (BlockingIOError, InterruptedError):
      return
    except OSError:
      data = b""
    if not data:
      self._refuse(conn, f"it closed the connection during the {conn.stage} stage")
      return
    try:
      frames = conn.frames.feed(data)
    except ValueError as e:
      self._refuse(conn, f"it sent {e}", told="malformed handshake")
      return
    for frame in frames:
      if conn.sock not in self.conns:
        return
      if conn.stage == "auth":
        self._authenticate(conn, frame)
      elif conn.stage == "hello":
        self._hello(conn, frame)

  def _authenticate(self, conn: _Conn, frame: dict[str, Any]) -> None:
    run, nonce, proof = frame.get("run"), frame.get("nonce"), frame.get("proof")
    if (frame.get("jdtensor") != _PROTOCOL or not isinstance(run, str)
        or not _RUN_RE.fullmatch(run) or not isinstance(nonce, str)
        or not _NONCE_RE.fullmatch(nonce) or not isinstance(proof, str)
        or len(proof) > 64):
      self._refuse(conn, "it sent a malformed authentication",
                   told="malformed handshake")
      return
    if run != self.run:
      self._refuse(conn, f"a client of another run (run id {run or 'none'}) "
                   "connected; refused",
                   told=f"this is client 0 of another run (run id "
                   f"{self.run or 'none'}; this client's is {run or 'none'}): the "
                   "runs share an address. Give each run its own DTENSOR_JOBS "
                   "ports and JDTENSOR_RUN_SECRET.")
      return
    expected = handshake_proof(self.secret, "client", conn.nonce, nonce, run)
    if not hmac.compare_digest(proof, expected):
      self._refuse(conn, "it did not prove it knows JDTENSOR_RUN_SECRET; "
                   "refused", told="authentication failed")
      return
    conn.authenticated = bool(self.secret)
    conn.stage = "hello"
    conn.deadline = time.monotonic() + STAGE_SECONDS
    if not _send(conn.sock, {"proof": handshake_proof(self.secret, "server", nonce,
                                             conn.nonce)}):
      self._close(conn)

  def _hello(self, conn: _Conn, frame: dict[str, Any]) -> None:
    try:
      hello = _PeerHello.parse(frame)
    except ValueError as e:
      self._refuse(conn, f"it sent a malformed hello ({e})",
                   told="malformed hello")
      return
    detail, told = _check(self.me, hello, self.peers, conn.authenticated)
    if detail:
      logging.warning("jdtensor: client 0: %s", detail)
      self.problem = self.problem or detail
      _send(conn.sock, {"error": told})
      self._close(conn)
      return
    conn.hello, conn.stage = hello, "done"
    self.peers[hello.client_id] = conn

  def _expire(self) -> None:
    now = time.monotonic()
    for conn in list(self.conns.values()):
      if conn.stage != "done" and now > conn.deadline:
        self._refuse(conn, f"it sent nothing valid within {STAGE_SECONDS:g} s "
                     f"(the {conn.stage} stage)", told="too slow; try again")

  def serve(self, timeout: float, deadline: float) -> dict[int, socket.socket]:
    """Waits for every client; their connections, or raises."""
    while len(self.peers) < self.me.num_clients - 1 and not self.problem:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        missing = [i for i in range(1, self.me.num_clients) if i not in self.peers]
        raise StartupTimeoutError(
            f"Client 0 waited {timeout:g} s (the init timeout) at the "
            f"coordinator DTENSOR_JOBS[0]={self.coordinator!r} for client(s) "
            f"{', '.join(map(str, missing))}, which never connected. Start "
            "every client with the same DTENSOR_JOBS and its own "
            "DTENSOR_CLIENT_ID, or raise the init timeout "
            "(JDTENSOR_INIT_TIMEOUT).")
      for key, _ in self.selector.select(min(remaining, 0.2)):
        if key.fileobj is self.listener:
          self._accept()
        else:
          conn = self.conns.get(key.fileobj)  # type: ignore[arg-type]
          if conn is not None:
            self._read(conn)
      self._expire()
    return {c: conn.sock for c, conn in self.peers.items()}

  def close(self, keep: Sequence[socket.socket] = ()) -> None:
    for conn in list(self.conns.values()):
      if conn.sock not in keep:
        self._close(conn)
    self.selector.close()
    self.listener.close()


def _check(me: Hello, hello: _PeerHello, peers: dict[int, _Conn],
           authenticated: bool) -> tuple[str, str]:
  """('', '') if `hello` agrees with client 0; else (what client 0 logs,
  what the peer is told: client 0's values only if it authenticated)."""
  c = hello.client_id
  if hello.num_clients != me.num_clients or hello.jobs != jobs_digest(me.jobs):
    mine = f" ({','.join(me.jobs)!r})" if authenticated else ""
    detail = (f"Client {c} has a DTENSOR_JOBS ({hello.num_jobs} entries) that "
              f"differs from client 0's ({len(me.jobs)} entries: "
              f"{','.join(me.jobs)!r}); every client needs the same DTENSOR_JOBS.")
    return detail, (f"Client {c} has a DTENSOR_JOBS that differs from client "
                    f"0's{mine}; every client needs the same DTENSOR_JOBS.")
  if c == 0 or c >= me.num_clients or c in peers:
    text = (f"Two processes claim DTENSOR_CLIENT_ID={c}; give each of the "
            f"{me.num_clients} clients its own id 0..{me.num_clients - 1}.")
    return text, text
  if hello.heartbeat != me.heartbeat:
    text = (f"Client {c} has the heartbeat {'on' if hello.heartbeat else 'off'} "
            f"but client 0 has it {'on' if me.heartbeat else 'off'}; set "
            "DTENSOR_ENABLE_HEARTBEAT the same on every client.")
    return text, text
  theirs, mine = hello.settings, dict(me.settings)
  for name in sorted(set(theirs) | set(mine)):
    if theirs.get(name) != mine.get(name):
      detail = (f"Client {c} has {name}={theirs.get(name)!r} but client 0 has "
                f"{mine.get(name)!r}; set {name} the same on every client.")
      told = detail if authenticated else (
          f"Client {c} has {name}={theirs.get(name)!r}, which differs from "
          f"client 0's; set {name} the same on every client.")
      return detail, told
  if hello.local_devices != me.local_devices:
    detail = (f"Client {c} has {hello.local_devices} local devices but client 0 "
              f"has {me.local_devices}; DTensor meshes need the same number of "
              "devices on every client.")
    told = detail if authenticated else (
        f"Client {c} has {hello.local_devices} local devices, which differs "
        "from client 0's; DTensor meshes need the same number on every client.")
    return detail, told
  return "", ""


def _serve(me: Hello, secret: str | None, host: str, port: int, coordinator: str,
           timeout: float, deadline: float) -> Meeting:
  server = _Server(me, secret, coordinator, _listen(host, port, coordinator))
  links: dict[int, socket.socket] = {}
  reserved: socket.socket | None = None
  handed_over = False
  try:
    links = server.serve(timeout, deadline)
    # Close the listener before saying "go": from now on only JAX's
    # coordination service can accept on this port (see wait_for_service).
    server.listener.close()
    if server.problem:
      for sock in links.values():
        _send(sock, {"error": server.problem if secret else
                     "another client's start-up failed; see client 0's output"})
      raise StartupError(server.problem)
    reserved = reserve_port(host)
    go = {"go": True, "heartbeat_port": reserved.getsockname()[1]}
    for sock in links.values():
      _send(sock, go)
      sock.setblocking(True)
    meeting = Meeting(Links(0, links), int(go["heartbeat_port"]), reserved)
    handed_over = True  # The links and the reserved port live on.
    return meeting
  finally:
    server.close(keep=list(links.values()) if handed_over else ())
    if reserved is not None and not handed_over:
      reserved.close()


class _Refused(Exception):
  """Client 0 asked this client to try again (it was too slow)."""


def _read_frame(sock: socket.socket, frames: Frames, pending: list[dict[str, Any]],
                deadline: float) -> dict[str, Any] | None:
  """The next frame from client 0, or None on end of stream or deadline."""
  while not pending:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      return None
    ready, _, _ = select.select([sock], [], [], min(remaining, 1.0))
    if not ready:
      continue
    try:
      chunk = sock.recv(MAX_FRAME)
    except OSError:
      return None
    if not chunk:
      return None
    pending.extend(frames.feed(chunk))
  return pending.pop(0)


def _handshake(me: Hello, secret: str | None, coordinator: str,
               sock: socket.socket, deadline: float) -> int:
  """This client's side on one connection; the heartbeat port, or raises."""
  mine = run_id(secret)
  frames, pending = Frames(), []
  where = f"DTENSOR_JOBS[0]={coordinator!r}"

  def frame() -> dict[str, Any]:
    got = _read_frame(sock, frames, pending,
                      min(deadline, time.monotonic() + _CLIENT_STAGE_SECONDS))
    if got is None:
      raise StartupError(
          f"Client {me.client_id}: the process at {where} closed the connection "
          "or fell silent during start-up; it is not a jdtensor client 0 of "
          "this run, or it failed. Check client 0's output.")
    if "error" in got:
      if got["error"] == "too slow; try again":
        raise _Refused()
      raise StartupError(f"Client {me.client_id}: start-up refused by client 0: "
                         f"{str(got['error'])[:2000]}")
    return got
  try:
    challenge = frame()
  except ValueError:
    raise StartupError(
        f"Client {me.client_id}: the process at {where} is not a jdtensor client "
        "0 (it does not speak the start-up handshake); check DTENSOR_JOBS[0] and "
        "that client 0 is a jdtensor of this version.") from None
  nonce, run, auth = challenge.get("nonce"), challenge.get("run"), challenge.get("auth")
  if (challenge.get("jdtensor") != _PROTOCOL or not isinstance(nonce, str)
      or not _NONCE_RE.fullmatch(nonce) or not isinstance(run, str)
      or not isinstance(auth, bool)):
    raise StartupError(
        f"Client {me.client_id}: the process at {where} is not a jdtensor client "
        "0 of this version (its challenge is malformed).")
  if auth != bool(secret):
    raise StartupError(
        f"Client {me.client_id}: {'client 0 has' if auth else 'this client has'} "
        "a JDTENSOR_RUN_SECRET and "
        f"{'this client has' if auth else 'client 0 has'} none; set the same "
        "JDTENSOR_RUN_SECRET on every client.")
  # A client 0 of another run refuses us by name in its answer (and logs it).
  my_nonce = os.urandom(32).hex()
  _send(sock, {"jdtensor": _PROTOCOL, "run": mine, "nonce": my_nonce,
               "proof": handshake_proof(secret, "client", nonce, my_nonce, mine)})
  reply = frame()
  if not hmac.compare_digest(str(reply.get("proof", "")),
                             handshake_proof(secret, "server", my_nonce, nonce)):
    raise StartupError(
        f"Client {me.client_id}: the process at {where} did not prove it knows "
        "JDTENSOR_RUN_SECRET; it is not this run's client 0.")
  _send(sock, me.to_frame())
  reply = frame()
  port = reply.get("heartbeat_port")
  if reply.get("go") is not True or type(port) is not int or not 0 < port < 65536:  # pylint: disable=unidiomatic-typecheck
    raise StartupError(f"Client {me.client_id}: client 0 answered the start-up "
                       "handshake with something unexpected.")
  return port


def _join(me: Hello, secret: str | None, coordinator: str, timeout: float,
          deadline: float) -> Meeting:
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
      socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
      if e.errno == socket.EAI_AGAIN:  # Name service busy: try again.
        time.sleep(_POLL_SECONDS)
        continue
      raise StartupError(
          f"Client {me.client_id}: the host of DTENSOR_JOBS[0]={coordinator!r} "
          f"({host!r}) does not resolve ({e}). Fix DTENSOR_JOBS.") from None
    try:
      sock = socket.create_connection((host, port), timeout=min(remaining, 2.0))
    except OSError:
      time.sleep(min(_POLL_SECONDS, max(remaining, 0)))
      continue
    try:
      heartbeat_port = _handshake(me, secret, coordinator, sock, deadline)
    except _Refused:
      sock.close()
      continue
    except BaseException:
      sock.close()
      raise
    sock.setblocking(True)
    sock.settimeout(None)
    return Meeting(Links(me.client_id, {0: sock}), heartbeat_port)


def wait_for_service(coordinator: str, deadline: Deadline, client_id: int) -> None:
  """Waits until client 0's JAX coordination service accepts connections.

  Connecting before it listens sends JAX's gRPC client into its reconnect
  back-off (about a second). After the rendezvous, client 0's own listener is
  closed, so the first accepted connection is the service's.

  Raises:
    StartupTimeoutError: If it does not come up by `deadline`.
  """
  host, port = split_host_port(coordinator)
  while not deadline.expired():
    try:
      socket.create_connection((host, port),
                               timeout=min(1.0, max(deadline.remaining(), 0.01))).close()
      return
    except OSError:
      time.sleep(0.005)
  raise StartupTimeoutError(
      f"Client {client_id}: client 0 met every client, but its JAX coordination "
      f"service at DTENSOR_JOBS[0]={coordinator!r} did not come up before the "
      "init timeout; check client 0's output.")


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
               deadline: Deadline, secret: str | None = None) -> Meeting:
  """Meets every client at the coordinator port, or raises.

  Args:
    me: This client's view of the cluster.
    coordinator: ``DTENSOR_JOBS[0]``.
    bind: Where client 0 listens (see `bind_address`).
    deadline: The start-up's deadline (the init timeout); this waits only
      for what is left of it.
    secret: The run's ``JDTENSOR_RUN_SECRET``; None runs unauthenticated.

  Returns:
    The liveness links and the heartbeat service's port (see `Meeting`).

  Raises:
    StartupError: Port taken, bind address not on this host, another run or
      a wrong secret at the address, inconsistent clusters, duplicate client
      ids, unequal device counts.
    StartupTimeoutError: A peer never connected (client 0), or the
      coordinator never came up (other clients).
  """
  timeout, at = deadline.seconds, deadline.at
  if me.client_id == 0:
    return _serve(me, secret, bind[0], bind[1], coordinator, timeout, at)
  return _join(me, secret, coordinator, timeout, at)


