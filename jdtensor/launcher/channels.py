"""How the launchers of several nodes meet: one connection from each node to
node 0, authenticated, with every node's settings checked.

PURE of JAX: standard library only. Node 0 listens at ``--coordinator``
(`serve`), every other node connects and retries until the time-out
(`join`); both sides prove the launchers' shared ``JDTENSOR_RUN_SECRET`` (a
challenge and an HMAC, as the clients do) and node 0 checks that the nodes'
hellos agree. The attempts over these connections are `jdtensor.launcher.nodes`'s.
"""

from __future__ import annotations

import hmac
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from jdtensor._deadline import Deadline
from jdtensor._wire import Frames, encode, handshake_proof, socket_host, split_host_port
from jdtensor.launcher.spec import LaunchSpec

__all__ = ["Channel", "NodeError", "FailureNote", "NodeDone", "GroupDecision", "NodePorts",
           "GroupGo", "serve", "join"]

_PROTOCOL = 1
_STAGE_SECONDS = 10.0  # For each handshake step of a peer that has connected.


@dataclass(frozen=True)
class FailureNote:
  """A failure one node's launcher tells the others of (node 0 relays it):
  the root cause among its clients, its launcher interrupted or timed out,
  or a node whose launcher is gone.

  Attributes:
    node: The node it happened on.
    client: The client that failed (a global id), or None (a launcher's own).
    what: What happened, as the summary says it.
    own: Whether it failed by itself (a root cause), not as a consequence.
    at: When (``time.time()``).
    lost: The node's launcher is gone (its connection closed).
  """
  node: int
  client: int | None
  what: str
  own: bool
  at: float | None
  lost: bool = False

  @classmethod
  def gone(cls, node: int) -> FailureNote:
    """The note of a node whose launcher's connection closed."""
    return cls(node, None, f"node {node}'s launcher is gone", True, time.time(), lost=True)

  def text(self, me: int) -> str:
    """What happened, as node `me` says it (naming another node)."""
    return self.what if self.node == me else f"{self.what} (on node {self.node})"

  def to_frame(self) -> dict[str, Any]:
    return {"node": self.node, "client": self.client, "what": self.what,
            "own": self.own, "at": self.at, "lost": self.lost}

  @classmethod
  def from_frame(cls, frame: dict[str, Any]) -> FailureNote:
    """The note `to_frame` sent.

    Raises:
      KeyError, TypeError, ValueError: A malformed frame.
    """
    client, at = frame.get("client"), frame.get("at")
    return cls(int(frame["node"]), None if client is None else int(client),
               str(frame["what"]), bool(frame.get("own")),
               None if at is None else float(at), bool(frame.get("lost")))


def read_note(frame: Any) -> FailureNote | None:
  """The `FailureNote` in a frame's field (None and '' for none)."""
  return FailureNote.from_frame(frame) if frame else None


def _note_frame(note: FailureNote | None) -> dict[str, Any] | None:
  return None if note is None else note.to_frame()


@dataclass(frozen=True)
class NodeDone:
  """A node's end of an attempt, told to node 0 (``done``).

  Attributes:
    ok: Every client of the node exited 0.
    exit_code: The node's own exit code for the attempt.
    failure: The node's own first failure, if any.
    interrupted: Its launcher was interrupted (a stop signal).
  """
  ok: bool
  exit_code: int
  failure: FailureNote | None
  interrupted: bool

  def to_frame(self) -> dict[str, Any]:
    return {"done": {"ok": self.ok, "exit_code": self.exit_code,
                     "failure": _note_frame(self.failure),
                     "interrupted": self.interrupted}}

  @classmethod
  def from_frame(cls, body: dict[str, Any]) -> NodeDone:
    """The ``done`` frame's body.

    Raises:
      KeyError, TypeError, ValueError: A malformed frame.
    """
    return cls(bool(body.get("ok")), int(body.get("exit_code", 1)),
               read_note(body.get("failure")), bool(body.get("interrupted")))


@dataclass(frozen=True)
class GroupDecision:
  """Node 0's decision after an attempt, for every node: the run is over
  (``finish``, with the group's exit code) or starts again (``next``, with
  the next attempt's number); `root` is the group's root cause, if any."""
  over: bool
  root: FailureNote | None
  exit_code: int = 0
  attempt: int = 0

  def to_frame(self) -> dict[str, Any]:
    if self.over:
      return {"finish": {"exit_code": self.exit_code, "root": _note_frame(self.root)}}
    return {"next": {"attempt": self.attempt, "root": _note_frame(self.root)}}

  @classmethod
  def from_frame(cls, frame: dict[str, Any]) -> GroupDecision:
    """The decision in a ``finish`` or ``next`` frame.

    Raises:
      KeyError, TypeError, ValueError: A malformed frame.
    """
    if "finish" in frame:
      body = frame["finish"]
      return cls(True, read_note(body.get("root")), exit_code=int(body.get("exit_code", 1)))
    body = frame["next"]
    return cls(False, read_note(body.get("root")), attempt=int(body["attempt"]))


@dataclass(frozen=True)
class NodePorts:
  """A node's ports for an attempt, told to node 0 (``ports``): the address
  the other nodes reach its clients at, and one port per client."""
  address: str
  ports: tuple[int, ...]

  def to_frame(self) -> dict[str, Any]:
    return {"ports": [self.address, list(self.ports)]}

  @classmethod
  def from_frame(cls, body: Any) -> NodePorts:
    """The ``ports`` frame's body.

    Raises:
      KeyError, TypeError, ValueError: A malformed frame.
    """
    address, ports = body
    return cls(str(address), tuple(int(p) for p in ports))


@dataclass(frozen=True)
class GroupGo:
  """Node 0's ``go`` for an attempt, to every node: every client's address
  (node by node), the attempt's number, the nonce each node derives the
  clients' secret from (or the secret itself, for a run without one), and
  the absolute path node 0 writes its trace to (None: no ``--trace``)."""
  jobs: tuple[str, ...]
  attempt: int
  nonce: str
  secret: str | None = None
  trace: str | None = None

  def to_frame(self) -> dict[str, Any]:
    return {"go": {"jobs": list(self.jobs), "attempt": self.attempt, "nonce": self.nonce,
                   "secret": self.secret, "trace": self.trace}}

  @classmethod
  def from_frame(cls, body: dict[str, Any]) -> GroupGo:
    """The ``go`` frame's body.

    Raises:
      KeyError, TypeError, ValueError: A malformed frame.
    """
    secret, trace = body.get("secret"), body.get("trace")
    return cls(tuple(str(j) for j in body["jobs"]), int(body["attempt"]),
               str(body["nonce"]), None if secret is None else str(secret),
               trace if isinstance(trace, str) else None)


class NodeError(Exception):
  """The nodes could not form or keep the group (said to the user as is)."""


class Channel:
  """Newline-ended JSON frames on one connection between two launchers."""

  def __init__(self, sock: socket.socket):
    self.sock = sock
    self._frames = Frames()
    self._ready: list[dict[str, Any]] = []
    self._send_lock = threading.Lock()

  def send(self, frame: dict[str, Any]) -> bool:
    data = encode(frame)
    with self._send_lock:
      try:
        self.sock.sendall(data)
        return True
      except OSError:
        return False

  def recv(self, timeout: float | None) -> dict[str, Any] | None:
    """The next frame; None at the end of the stream.

    Raises:
      TimeoutError: Nothing complete within `timeout`.
      ValueError: Something that is not a frame.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while not self._ready:
      remaining = None if deadline is None else deadline - time.monotonic()
      if remaining is not None and remaining <= 0:
        raise TimeoutError
      self.sock.settimeout(remaining)
      try:
        chunk = self.sock.recv(65536)
      except socket.timeout:
        raise TimeoutError from None
      except OSError:
        return None
      if not chunk:
        return None
      self._ready += self._frames.feed(chunk)
    return self._ready.pop(0)

  def listen(self, rank: int, into: queue.Queue) -> None:
    """Reads frames on a daemon thread into `into` as (rank, frame); (rank,
    None) when the connection ends."""
    def read() -> None:
      self.sock.settimeout(None)
      while True:
        try:
          frame = self.recv(None)
        except (ValueError, TimeoutError, OSError):
          frame = None
        into.put((rank, frame))
        if frame is None:
          return
    threading.Thread(target=read, daemon=True,
                     name=f"jdtensor-launch-node-{rank}").start()

  def close(self) -> None:
    try:
      self.sock.close()
    except OSError:
      pass


def _hello(spec: LaunchSpec) -> dict[str, Any]:
  return {"rank": spec.node_rank, "nnodes": spec.nnodes,
          # None: the environment gave no count, so JAX's default of 1.
          "clients": spec.num_clients, "devices": spec.devices_per_client or 1,
          "device_type": spec.device_type.upper(), "restarts": spec.max_restarts}


_AGREED = {"nnodes": "--nnodes", "clients": "-n (clients per node)",
           "devices": "--devices-per-client", "device_type": "--device-type",
           "restarts": "--max-restarts"}


def _disagreement(mine: dict[str, Any], theirs: dict[str, Any]) -> str | None:
  for key, flag in _AGREED.items():
    if theirs.get(key) != mine[key]:
      return (f"node {theirs.get('rank')} has {flag} {theirs.get(key)!r} but node 0 "
              f"has {mine[key]!r}; start every node with the same values.")
  return None


# -- meeting ----------------------------------------------------------------------

def serve(spec: LaunchSpec, deadline: Deadline, log: IO[str]
           ) -> dict[int, Channel]:
  """Node 0: accepts and authenticates every other node, or raises."""
  host, port = split_host_port(spec.coordinator or "")
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  server = socket.socket(family, socket.SOCK_STREAM)
  server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    server.bind((host, port))
  except OSError as e:
    server.close()
    raise NodeError(f"node 0 cannot listen at --coordinator {spec.coordinator}: "
                    f"{e.strerror}; give an address of this machine and a free "
                    "port.") from None
  server.listen(64)
  mine = _hello(spec)
  chans: dict[int, Channel] = {}
  try:
    while len(chans) < spec.nnodes - 1:
      if deadline.expired():
        missing = [r for r in range(1, spec.nnodes) if r not in chans]
        problem = (f"node(s) {', '.join(map(str, missing))} did not join at "
                   f"{spec.coordinator} within {deadline.seconds:g} s (--timeout); "
                   f"start them with --nnodes {spec.nnodes} --node-rank R "
                   f"--coordinator {spec.coordinator}.")
        for other in chans.values():
          other.send({"error": problem})
        raise NodeError(problem)
      server.settimeout(max(0.05, min(deadline.remaining(), 1.0)))
      try:
        sock, peer = server.accept()
      except socket.timeout:
        continue
      chan = Channel(sock)
      try:
        hello = _authenticate_node(chan, spec.secret, mine)
      except (NodeError, ValueError, TimeoutError, OSError) as e:
        log.write(f"jdtensor launch: refused a connection from {peer[0]}: {e}\n")
        log.flush()
        chan.close()
        continue
      problem = _disagreement(mine, hello)
      rank = hello.get("rank")
      if problem is None and (type(rank) is not int or not 0 < rank < spec.nnodes  # pylint: disable=unidiomatic-typecheck
                              or rank in chans):
        problem = f"node rank {rank!r} is taken or out of range 1..{spec.nnodes - 1}."
      if problem is not None:
        chan.send({"error": problem})
        chan.close()
        for other in chans.values():
          other.send({"error": problem})
        raise NodeError(problem)
      chan.send({"joined": True})
      chans[rank] = chan
    return chans
  except BaseException:
    for chan in chans.values():
      chan.close()
    raise
  finally:
    server.close()


def _authenticate_node(chan: Channel, secret: str | None,
                       mine: dict[str, Any]) -> dict[str, Any]:
  """Node 0's side of one node's handshake; the node's hello, or raises."""
  nonce = os.urandom(32).hex()
  chan.send({"jdtensor_nodes": _PROTOCOL, "nonce": nonce, "auth": bool(secret)})
  answer = chan.recv(_STAGE_SECONDS)
  if answer is None:
    raise NodeError("it closed the connection")
  theirs, hello = answer.get("nonce"), answer.get("hello")
  if not isinstance(theirs, str) or not isinstance(hello, dict):
    raise NodeError("it does not speak the launchers' handshake")
  if not hmac.compare_digest(str(answer.get("proof", "")),
                             handshake_proof(secret, "node", nonce, theirs)):
    raise NodeError("wrong or missing JDTENSOR_RUN_SECRET")
  chan.send({"proof": handshake_proof(secret, "node 0", theirs, nonce)})
  return hello


def join(spec: LaunchSpec, deadline: Deadline) -> tuple[Channel, str]:
  """Node R > 0: reaches node 0 and authenticates; (channel, this node's
  address as node 0 sees the connection come from)."""
  host, port = split_host_port(spec.coordinator or "")
  while True:
    try:
      sock = socket.create_connection((socket_host(host), port),
                                      timeout=max(0.1, min(deadline.remaining(), 2.0)))
      break
    except OSError:
      if deadline.expired():
        raise NodeError(
            f"node {spec.node_rank} could not reach node 0's launcher at "
            f"--coordinator {spec.coordinator} within {deadline.seconds:g} s "
            "(--timeout); start node 0 there.") from None
      time.sleep(0.2)
  chan = Channel(sock)
  address = sock.getsockname()[0]
  try:
    challenge = chan.recv(_STAGE_SECONDS)
    if challenge is None or challenge.get("jdtensor_nodes") != _PROTOCOL:
      raise NodeError(f"the process at {spec.coordinator} is not a jdtensor "
                      "launcher of this version (node 0).")
    if "error" in challenge:
      raise NodeError(f"node 0 refused this node: {challenge['error']}")
    if challenge.get("auth") != bool(spec.secret):
      raise NodeError("node 0 and this node disagree on having a "
                      "JDTENSOR_RUN_SECRET; set the same one on every node.")
    nonce, mine = str(challenge.get("nonce")), os.urandom(32).hex()
    chan.send({"nonce": mine, "proof": handshake_proof(spec.secret, "node", nonce, mine),
               "hello": _hello(spec)})
    reply = chan.recv(_STAGE_SECONDS)
    if reply is None:
      raise NodeError("node 0 closed the connection (a wrong JDTENSOR_RUN_SECRET?)")
    if "error" in reply:
      raise NodeError(f"node 0 refused this node: {reply['error']}")
    if not hmac.compare_digest(str(reply.get("proof", "")),
                               handshake_proof(spec.secret, "node 0", mine, nonce)):
      raise NodeError(f"the launcher at {spec.coordinator} did not prove it "
                      "knows JDTENSOR_RUN_SECRET.")
    joined = chan.recv(_STAGE_SECONDS)
    if joined is None or "error" in joined:
      raise NodeError(f"node 0 refused this node: "
                      f"{(joined or {}).get('error', 'connection closed')}")
  except (ValueError, TimeoutError, OSError) as e:
    chan.close()
    raise NodeError(f"the handshake with node 0 at {spec.coordinator} failed: "
                    f"{e or type(e).__name__}") from None
  except NodeError:
    chan.close()
    raise
  return chan, address
