"""Client 0's side of the start-up handshake: it serves every connection at
once, checks each client's hello, reserves the heartbeat's port and answers.

PURE: standard library only. See `jdtensor.runtime.rendezvous` for the
protocol and why a bad peer cannot break it.
"""

from __future__ import annotations

import errno
import hmac
import os
import selectors
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jdtensor import _logging as logging
from jdtensor._device_nodes import GpuIdentity
from jdtensor._env.names import JDTENSOR_SHARE_GPUS
from jdtensor._wire import (MAX_FRAME, Frames, format_host_port, handshake_proof,
                            socket_host)
from jdtensor.errors import StartupError, StartupTimeoutError
from jdtensor.runtime.handshake import (CLIENTS_SHOWN, NONCE_RE, PROTOCOL, RUN_RE,
                                        STAGE_SECONDS, clients_text,
                                        START_EVERY_CLIENT, WAITING_SECONDS, Hello,
                                        Meeting, PeerHello, Software, jobs_digest,
                                        run_id, send, software_groups, software_mismatch,
                                        software_told)
from jdtensor.runtime.links import Links

__all__ = ["gpu_sharers", "serve"]


def _listen(host: str, port: int, coordinator: str, backlog: int) -> socket.socket:
  try:
    infos = socket.getaddrinfo(socket_host(host), port, type=socket.SOCK_STREAM)
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
  # Every client connects at once: a backlog short of the cluster drops
  # connection attempts, which TCP retries only after a second or more. The
  # kernel caps it (net.core.somaxconn, 4096 on current kernels).
  sock.listen(max(128, backlog))
  sock.setblocking(False)
  return sock


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
  hello: PeerHello | None = None


# Refused start-up connections logged one by one, a minute.
REFUSALS_LOGGED = 5


class _LogBudget:
  """At most `lines` log lines a `window` of seconds; past that, one line
  with the count (`said`, with the count and the window) when the window
  ends or the budget is closed."""

  def __init__(self, lines: int, window: float, said: str):
    self.lines, self.window, self.said = lines, window, said
    self.started: float | None = None
    self.used = self.dropped = 0

  def allow(self, now: float) -> bool:
    if self.started is None or now - self.started >= self.window:
      self.flush()
      self.started, self.used = now, 0
    if self.used < self.lines:
      self.used += 1
      return True
    self.dropped += 1
    return False

  def flush(self) -> None:
    if self.dropped:
      logging.warning(self.said, self.dropped, self.window)
      self.dropped = 0


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
    # Connections still in the handshake: only they can expire, so each
    # wake-up costs what is in flight, not every client met so far.
    self.pending: set[_Conn] = set()
    self.peers: dict[int, _Conn] = {}
    # GPU key -> (client, its identity), for the shared-GPU check in O(1).
    self.gpu_users: dict[str, tuple[int, GpuIdentity]] = {
        gpu.key: (0, gpu) for gpu in me.gpus}
    self.problem = ""
    self.refusals = _LogBudget(REFUSALS_LOGGED, 60.0, (
        "jdtensor: client 0 refused %d more start-up connections in the last %.0f s "
        "(not each logged)"))
    # Clients that connected with another secret: client -> what was said.
    self.secret_mismatch: dict[int, str] = {}

  def _refuse(self, conn: _Conn, reason: str, told: str | None = None) -> None:
    """Drops a connection, with one log line here (at most `REFUSALS_LOGGED`
    a minute, then a count: anyone who reaches the port could fill the log)
    and `told` to the peer."""
    if self.refusals.allow(time.monotonic()):
      logging.warning("jdtensor: client 0 refused a start-up connection from %s: %s",
                      conn.peer, reason)
    if told is not None:
      send(conn.sock, {"error": told})
    self._close(conn)

  def _close(self, conn: _Conn) -> None:
    self.conns.pop(conn.sock, None)
    self.pending.discard(conn)
    if conn.hello is not None and self.peers.get(conn.hello.client_id) is conn:
      # A client that met us and left before `go` (it failed, was stopped by
      # hand, or gave up): not part of the cluster any more; it may connect
      # again (a restarted client) before the init timeout.
      del self.peers[conn.hello.client_id]
      for gpu in conn.hello.gpus:
        if self.gpu_users.get(gpu.key, (None,))[0] == conn.hello.client_id:
          del self.gpu_users[gpu.key]
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
    self.pending.add(conn)
    self.selector.register(sock, selectors.EVENT_READ)
    if not send(sock, {"jdtensor": PROTOCOL, "nonce": conn.nonce,
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
      if conn.stage == "done" and conn.hello is not None:
        logging.warning(
            "jdtensor: client 0: client %d left the start-up before every client "
            "arrived (its connection closed); waiting for it to connect again",
            conn.hello.client_id)
        self._close(conn)
        return
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
    if (frame.get("jdtensor") != PROTOCOL or not isinstance(run, str)
        or not RUN_RE.fullmatch(run) or not isinstance(nonce, str)
        or not NONCE_RE.fullmatch(nonce) or not isinstance(proof, str)
        or len(proof) > 64):
      self._refuse(conn, "it sent a malformed authentication",
                   told="malformed handshake")
      return
    if run != self.run:
      claimed = frame.get("client")
      if (frame.get("jobs") == jobs_digest(self.me.jobs) and type(claimed) is int  # pylint: disable=unidiomatic-typecheck
          and 0 < claimed < self.me.num_clients):
        # The same DTENSOR_JOBS, another secret: said at once on both sides
        # (client 0 goes on waiting: an unauthenticated peer cannot end the
        # run, but its time-out names the cause).
        detail = (f"client {claimed} connected with a different "
                  f"JDTENSOR_RUN_SECRET (from {conn.peer}; the same DTENSOR_JOBS): set "
                  "the same JDTENSOR_RUN_SECRET on every client")
        self.secret_mismatch.setdefault(claimed, detail)
        self._refuse(conn, detail, told=(
            f"client 0 has a different JDTENSOR_RUN_SECRET than this client "
            f"({claimed}) (the same DTENSOR_JOBS): set the same JDTENSOR_RUN_SECRET "
            "on every client"))
        return
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
    if not send(conn.sock, {"proof": handshake_proof(self.secret, "server", nonce,
                                             conn.nonce)}):
      self._close(conn)

  def _hello(self, conn: _Conn, frame: dict[str, Any]) -> None:
    try:
      hello = PeerHello.parse(frame)
    except ValueError as e:
      self._refuse(conn, f"it sent a malformed hello ({e})",
                   told="malformed hello")
      return
    detail, told = _check(self.me, hello, self.peers, conn.authenticated,
                          self.gpu_users)
    if detail:
      logging.warning("jdtensor: client 0: %s", detail)
      self.problem = self.problem or detail
      send(conn.sock, {"error": told})
      self._close(conn)
      return
    conn.hello, conn.stage = hello, "done"
    self.pending.discard(conn)
    self.peers[hello.client_id] = conn
    for gpu in hello.gpus:
      self.gpu_users.setdefault(gpu.key, (hello.client_id, gpu))

  def _expire(self) -> None:
    now = time.monotonic()
    for conn in list(self.pending):
      if now > conn.deadline:
        self._refuse(conn, f"it sent nothing valid within {STAGE_SECONDS:g} s "
                     f"(the {conn.stage} stage)", told="too slow; try again")

  def _missing(self) -> list[int]:
    return [i for i in range(1, self.me.num_clients) if i not in self.peers]

  def _tell_waiting(self) -> None:
    """Tells every client that has met us whom we are still waiting for: it
    waits for a late client as long as the init timeout allows, and for a
    silent client 0 only CLIENT_STAGE_SECONDS."""
    missing = self._missing()
    frame = {"waiting": missing[:CLIENTS_SHOWN],
             "more": max(0, len(missing) - CLIENTS_SHOWN)}
    for conn in list(self.peers.values()):
      if not send(conn.sock, frame):
        self._close(conn)

  def serve(self, timeout: float, deadline: float) -> dict[int, socket.socket]:
    """Waits for every client; their connections, or raises."""
    told = time.monotonic()
    while len(self.peers) < self.me.num_clients - 1 and not self.problem:
      now = time.monotonic()
      remaining = deadline - now
      if remaining <= 0:
        missing = self._missing()
        mismatched = [self.secret_mismatch[c] for c in missing
                      if c in self.secret_mismatch]
        message = (
            f"Client 0 waited {timeout:g} s (the init timeout) at the "
            f"coordinator DTENSOR_JOBS[0]={self.coordinator!r} for client(s) "
            f"{clients_text(missing)}, which never connected. "
            + (f"{'; '.join(mismatched[:3])}." if mismatched else START_EVERY_CLIENT))
        for conn in list(self.peers.values()):  # They would wait on in vain.
          send(conn.sock, {"error": message, "timeout": True})
        raise StartupTimeoutError(message)
      if now - told >= WAITING_SECONDS:
        self._tell_waiting()
        told = now
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
    self.refusals.flush()
    self.selector.close()
    self.listener.close()


def _check(me: Hello, hello: PeerHello, peers: dict[int, _Conn],
           authenticated: bool,
           gpu_users: dict[str, tuple[int, GpuIdentity]]) -> tuple[str, str]:
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
  if hello.software != me.software:
    # Refused once every client has met, naming what each runs (`_refuse_
    # mixed_software`): what else differs (settings another jdtensor reads,
    # device counts another JAX sets) follows from it and would mislead.
    return "", ""
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
  if me.family and hello.family and hello.family != me.family:
    text = (f"Client {c}'s DTENSOR_JOBS[{c}]={me.jobs[c]!r} is an {hello.family} "
            f"address but client 0's DTENSOR_JOBS[0]={me.jobs[0]!r} is "
            f"{me.family}: JAX's CPU collectives (gloo) connect every client to "
            f"every other at its DTENSOR_JOBS address and cannot connect "
            f"{hello.family} to {me.family}. Give every DTENSOR_JOBS entry one "
            "address family: IPv4 (127.0.0.1, or host names that resolve to IPv4 "
            "first) or IPv6 ([::1], or names that resolve to IPv6 first).")
    return text, text
  if not mine.get(JDTENSOR_SHARE_GPUS):
    shared = next(((gpu_users[gpu.key], gpu) for gpu in hello.gpus
                   if gpu.key in gpu_users), None)
    if shared is not None:
      (other, theirs_gpu), mine_gpu = shared
      fix = (" NCCL fails the first cross-client collective of clients on one GPU "
             "('Duplicate GPU detected'). Give each client its own GPUs (`jdtensor "
             "launch --device-type GPU` does; else set CUDA_VISIBLE_DEVICES per "
             f"client), or, for a run that needs no cross-client GPU collective, set "
             f"{JDTENSOR_SHARE_GPUS}=1 on every client.")
      (a, a_gpu), (b, b_gpu) = sorted([(other, theirs_gpu), (c, mine_gpu)])
      detail = (f"Clients {a} and {b} would share one GPU: client {a} uses "
                f"{a_gpu.label}, client {b} uses {b_gpu.label}." + fix)
      told = detail if authenticated else (
          f"Client {c}'s {mine_gpu.label} is used by another client too." + fix)
      return detail, told
  return "", ""


def gpu_sharers(hellos: Sequence[tuple[int, Sequence[GpuIdentity]]]) -> dict[int, int]:
  """Client -> how many clients use its most shared GPU (1: none other)."""
  users: dict[str, set[int]] = {}
  for client, gpus in hellos:
    for gpu in gpus:
      users.setdefault(gpu.key, set()).add(client)
  return {client: max((len(users[g.key]) for g in gpus), default=1)
          for client, gpus in hellos}


def _refuse_mixed_software(me: Hello, peers: dict[int, _Conn]) -> None:
  """Once every client has met: raises StartupError, after telling every
  client why, unless all run the same `Software`. O(N)."""
  def software(conn: _Conn) -> Software | None:
    return None if conn.hello is None else conn.hello.software
  groups = software_groups([(0, me.software)] + [
      (c, software(peers[c])) for c in range(1, me.num_clients)])
  problem = software_mismatch(groups)
  if not problem:
    return
  # What a client that did not prove it knows the secret is told: its own
  # group's versions only (one text a group, not one a client).
  told: dict[Software | None, str] = {}
  for c in range(1, me.num_clients):
    conn = peers[c]
    if conn.authenticated:
      send(conn.sock, {"error": problem})
    else:
      theirs = software(conn)
      if theirs not in told:
        told[theirs] = software_told(groups, theirs)
      send(conn.sock, {"error": told[theirs]})
  raise StartupError(problem)


def serve(me: Hello, secret: str | None, host: str, port: int, coordinator: str,
           timeout: float, deadline: float) -> Meeting:
  server = _Server(me, secret, coordinator,
                   _listen(host, port, coordinator, me.num_clients))
  links: dict[int, socket.socket] = {}
  handed_over = False
  try:
    links = server.serve(timeout, deadline)
    # Close the listener before saying "go": from now on only JAX's
    # coordination service can accept on this port (see wait_for_service).
    server.listener.close()
    if server.problem:
      for sock in links.values():
        send(sock, {"error": server.problem if secret else
                     "another client's start-up failed; see client 0's output"})
      raise StartupError(server.problem)
    _refuse_mixed_software(me, server.peers)
    sharers = gpu_sharers([(0, me.gpus)] + [
        (c, conn.hello.gpus) for c, conn in server.peers.items()
        if conn.hello is not None])
    for client, sock in links.items():
      send(sock, {"go": True, "sharing": sharers.get(client, 1)})
      sock.setblocking(True)
    meeting = Meeting(Links(0, links), sharers.get(0, 1))
    handed_over = True  # The links live on.
    return meeting
  finally:
    server.close(keep=list(links.values()) if handed_over else ())
