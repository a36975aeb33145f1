"""Several nodes, one `jdtensor launch` each, acting as one launcher; restarts.

PURE of JAX: standard library only.

``jdtensor launch --nnodes N --node-rank R --coordinator HOST:PORT -n C``:
node 0's launcher listens at the coordinator address, every other node's
connects (retrying until the time-out) and they authenticate each other as
the clients do (a challenge and an HMAC under the launchers' shared
``JDTENSOR_RUN_SECRET``; without one, a warning). Each node says hello
(rank, number of nodes, clients per node, devices per client, device type,
restarts); node 0 checks that they agree. Then, for each attempt:

1. every node picks free ports for its clients on its address and sends them;
2. node 0 answers ``go``: the whole ``DTENSOR_JOBS`` (clients numbered node
   by node), the attempt number, and a nonce from which every node derives
   the clients' run secret (a new one per attempt);
3. every node runs its clients; the first failure anywhere is sent to node 0
   and relayed to every node, which stops its clients at once;
4. every node says ``done``; node 0 decides for all: finished, start again
   (``--max-restarts``, with ``JDTENSOR_RESTART_COUNT``), or failed, and
   every node prints one summary line naming the root cause (with its node).

A node whose launcher disappears stops the run on every other node, named.
One node with ``--max-restarts`` runs the same attempts without the network.
"""

from __future__ import annotations

import hmac
import json
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from jdtensor import _report, _env
from jdtensor.launcher import supervisor
from jdtensor.launcher.spec import (EXIT_TIMEOUT, Attempt, Failure, HeldPorts, LaunchResult,
                                    LaunchSpec)
from jdtensor._deadline import Deadline
from jdtensor._wire import Frames, encode, format_host_port, handshake_proof, split_host_port
from jdtensor.errors import ConfigError

__all__ = ["run", "NodeError"]

_PROTOCOL = 1
_STAGE_SECONDS = 10.0  # For each handshake step of a peer that has connected.
_DEFAULT_JOIN_SECONDS = 300.0  # Without --timeout: how long nodes wait to meet.
_ROUND_SECONDS = 120.0  # For a node's ports, or its "done", once running.
_EXIT_USAGE = 2


class NodeError(Exception):
  """The nodes could not form or keep the group (said to the user as is)."""


def _client_secret(secret: str | None, nonce: str) -> str | None:
  """The clients' run secret for one attempt, derived on every node."""
  if not secret:
    return None
  return handshake_proof(secret, "jdtensor clients", nonce)


class _FixedPorts:
  """``--port P``: ports P, P+1, ... (nothing to hold)."""

  def __init__(self, first: int, n: int):
    self.ports = list(range(first, first + n))

  def release(self) -> None:
    pass


def _ports(spec: LaunchSpec, host: str
           ) -> HeldPorts | _FixedPorts:
  """This node's client ports, held until the group's `go` (two nodes on one
  host, e.g. on loopback, then never pick the same port)."""
  if spec.port is not None:
    return _FixedPorts(spec.port, spec.num_clients)
  return HeldPorts(spec.num_clients, host)


class _Channel:
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

def _serve(spec: LaunchSpec, deadline: Deadline, log: IO[str]
           ) -> dict[int, _Channel]:
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
  chans: dict[int, _Channel] = {}
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
      chan = _Channel(sock)
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


def _authenticate_node(chan: _Channel, secret: str | None,
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


def _join(spec: LaunchSpec, deadline: Deadline) -> tuple[_Channel, str]:
  """Node R > 0: reaches node 0 and authenticates; (channel, this node's
  address as node 0 sees the connection come from)."""
  host, port = split_host_port(spec.coordinator or "")
  while True:
    try:
      sock = socket.create_connection((host, port),
                                      timeout=max(0.1, min(deadline.remaining(), 2.0)))
      break
    except OSError:
      if deadline.expired():
        raise NodeError(
            f"node {spec.node_rank} could not reach node 0's launcher at "
            f"--coordinator {spec.coordinator} within {deadline.seconds:g} s "
            "(--timeout); start node 0 there.") from None
      time.sleep(0.2)
  chan = _Channel(sock)
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


# -- attempts ---------------------------------------------------------------------

@dataclass
class _Outcome:
  """How an attempt ended for the group (decided by node 0)."""
  ok: bool
  exit_code: int = 0
  root: str = ""  # E.g. "client 2 exited with code 1 (on node 1)".
  stop: bool = True  # No restart (an interrupt, a node gone, none left).


def _failure_frame(node: int, failure: Failure) -> dict[str, Any]:
  return {"node": node, "client": failure.client, "what": failure.what,
          "own": failure.own, "at": failure.at}


def _gone(node: int) -> dict[str, Any]:
  """The failure frame of a node whose launcher's connection closed."""
  return {"node": node, "client": None, "own": True, "at": time.time(),
          "what": f"node {node}'s launcher is gone"}


def _drain(inbox: queue.Queue) -> Iterator[tuple[int, dict[str, Any] | None]]:
  """What `inbox` holds now, without waiting."""
  while True:
    try:
      yield inbox.get_nowait()
    except queue.Empty:
      return


def _root_text(frame: dict[str, Any], me: int) -> str:
  where = "" if frame["node"] == me else f" (on node {frame['node']})"
  return f"{frame['what']}{where}"


def _earliest(failures: list[dict[str, Any]]) -> dict[str, Any] | None:
  """The root cause among the nodes' reports: a client that failed by
  itself, earliest first; else the first report."""
  own = sorted((f for f in failures if f.get("own")),
               key=lambda f: (f.get("at") or 0.0, f["node"]))
  return own[0] if own else (failures[0] if failures else None)


def _summary(me: int, root: str, result: LaunchResult, grace: float) -> str:
  """This node's summary line: the run's root cause, and what this node's
  stop did (the same "stopped" as one node's launcher)."""
  return _report.summary(root, result.stopped, node=me, killed=result.killed,
                         grace=grace)


class _Node0:
  """Node 0's side of the attempts."""

  def __init__(self, spec: LaunchSpec, chans: dict[int, _Channel],
               address: str):
    self.spec, self.chans, self.address = spec, chans, address
    self.inbox: queue.Queue = queue.Queue()
    for rank, chan in chans.items():
      chan.listen(rank, self.inbox)
    self.lost: set[int] = set()

  def broadcast(self, frame: dict[str, Any], but: int | None = None) -> None:
    for rank, chan in self.chans.items():
      if rank != but and rank not in self.lost:
        chan.send(frame)

  def gather(self, kind: str, deadline: Deadline, on_other: Any = None,
             got: dict[int, Any] | None = None) -> dict[int, Any]:
    """One `kind` frame from every node (`got`: those already received);
    raises NodeError for a node lost or silent."""
    got = {} if got is None else got
    while len(got) < len(self.chans):
      gone = sorted(self.lost - set(got))
      if gone:  # Seen gone during the attempt: it will never answer.
        raise NodeError(f"node {gone[0]}'s launcher is gone (connection closed).")
      try:
        rank, frame = self.inbox.get(timeout=max(0.01, deadline.remaining()))
      except queue.Empty:
        missing = sorted(set(self.chans) - set(got))
        raise NodeError(f"node(s) {', '.join(map(str, missing))} did not answer "
                        f"within {deadline.seconds:g} s.") from None
      if frame is None:
        self.lost.add(rank)
        raise NodeError(f"node {rank}'s launcher is gone (connection closed).")
      if kind in frame:
        got[rank] = frame[kind]
      elif on_other is not None:
        on_other(rank, frame)
    return got


class _NodeR:
  """Node R's side: frames from node 0 through a queue."""

  def __init__(self, chan: _Channel):
    self.chan = chan
    self.inbox: queue.Queue = queue.Queue()
    chan.listen(0, self.inbox)

  def expect(self, kinds: tuple[str, ...], deadline: Deadline) -> dict[str, Any]:
    while True:
      try:
        _, frame = self.inbox.get(timeout=max(0.01, deadline.remaining()))
      except queue.Empty:
        raise NodeError(f"node 0 did not answer within {deadline.seconds:g} s."
                        ) from None
      if frame is None:
        raise NodeError("node 0's launcher is gone (connection closed).")
      if "error" in frame:
        raise NodeError(f"node 0: {frame['error']}")
      if any(k in frame for k in kinds):
        return frame


def run(spec: LaunchSpec, out: IO[str], err: IO[str],
        env: Mapping[str, str], signals: supervisor.Signals) -> LaunchResult:
  """Runs `spec` across its nodes and attempts; see the module docstring."""
  if spec.nnodes == 1:
    return _run_one_node(spec, out, err, env, signals)
  join = Deadline(spec.timeout or _DEFAULT_JOIN_SECONDS)
  if not spec.secret:
    err.write(f"jdtensor launch: warning: the nodes' handshake is not "
              f"authenticated: {_env.JDTENSOR_RUN_SECRET} is not set; any process "
              f"that can reach {spec.coordinator} can join. Set the same one on "
              "every node.\n")
  try:
    if spec.node_rank == 0:
      chans = _serve(spec, join, err)
      address = spec.node_address or split_host_port(spec.coordinator or "")[0]
      return _run_node0(spec, out, err, env, signals, _Node0(spec, chans, address))
    chan, seen_as = _join(spec, join)
    return _run_node_r(spec, out, err, env, signals, _NodeR(chan),
                       spec.node_address or seen_as)
  except NodeError as e:
    text = f"jdtensor launch (node {spec.node_rank}): {e}"
    err.write(text + "\n")
    err.flush()
    return LaunchResult(reason=text, exit_code=_EXIT_USAGE)


def _run_one_node(spec: LaunchSpec, out: IO[str], err: IO[str],
                  env: Mapping[str, str], signals: supervisor.Signals) -> LaunchResult:
  attempt = 0
  while True:
    secret = spec.secret if attempt == 0 else secrets.token_hex(32)
    result = supervisor.run_attempt(
        spec, Attempt.local(spec, attempt, secret), out, err, env,
        signals, quiet=True)
    result.restarts = attempt
    # A time-out bounds the whole run: it is never restarted.
    if (result.exit_code in (0, EXIT_TIMEOUT)
        or signals.interrupt.signal is not None or attempt >= spec.max_restarts):
      if result.reason:
        err.write(result.reason + "\n")
        err.flush()
      return result
    # One line per restart, with the whole summary of the attempt.
    attempt += 1
    why = result.reason.removeprefix("jdtensor launch: ")
    err.write(f"jdtensor launch: restarting ({attempt} of {spec.max_restarts}) "
              f"after: {why}\n")
    err.flush()


def _attempt_for(spec: LaunchSpec, go: dict[str, Any]) -> Attempt:
  jobs = tuple(go["jobs"])
  n = spec.num_clients
  ids = tuple(range(spec.node_rank * n, (spec.node_rank + 1) * n))
  secret = go.get("secret") or _client_secret(spec.secret, go["nonce"])
  return Attempt(ids, jobs, secret, int(go["attempt"]))


def _run_node0(spec: LaunchSpec, out: IO[str], err: IO[str],
               env: Mapping[str, str], signals: supervisor.Signals, group: _Node0
               ) -> LaunchResult:
  attempt, result = 0, LaunchResult()
  try:
    while True:
      held = _ports(spec, group.address)
      try:
        ports = {0: (group.address, held.ports)}
        for rank, (address, node_ports) in group.gather(
            "ports", Deadline(_ROUND_SECONDS)).items():
          ports[rank] = (str(address), [int(p) for p in node_ports])
        jobs = [format_host_port(ports[r][0], p) for r in range(spec.nnodes)
                for p in ports[r][1]]
        try:
          _env.parse_jobs(",".join(jobs))  # Distinct and well-formed.
        except ConfigError as e:
          problem = (f"the nodes' clients would not have distinct addresses: {e} "
                     "Give the nodes different addresses (--node-address) or "
                     "--port ranges, or let jdtensor pick free ports (no --port).")
          group.broadcast({"error": problem})
          raise NodeError(problem) from None
        nonce = secrets.token_hex(16)
        go = {"jobs": jobs, "attempt": attempt, "nonce": nonce,
              "secret": None if spec.secret else secrets.token_hex(32)}
        group.broadcast({"go": go})
      finally:
        held.release()
      failures: list[dict[str, Any]] = []
      done: dict[int, Any] = {}

      def note(rank: int, frame: dict[str, Any]) -> None:
        if "failed" in frame:
          failures.append(frame["failed"])
          group.broadcast({"stop": frame["failed"]}, but=rank)
        elif "done" in frame:
          done[rank] = frame["done"]

      def stop_request() -> str | None:
        for rank, frame in _drain(group.inbox):
          if frame is None:
            group.lost.add(rank)
            failures.append(_gone(rank))
            group.broadcast({"stop": failures[-1]})
          else:
            note(rank, frame)
        if failures:
          return f"stopped because of {_root_text(_earliest(failures), 0)}"
        return None

      def on_failure(failure: Failure) -> None:
        frame = _failure_frame(0, failure)
        failures.append(frame)
        group.broadcast({"stop": frame})
      result = supervisor.run_attempt(spec, _attempt_for(spec, go), out, err, env,
                                    signals, stop_request, on_failure, quiet=True)
      result.restarts = attempt
      if signals.interrupt.signal is not None and not failures:
        on_failure(Failure(None, "node 0's launcher was interrupted",
                                    True, time.time()))
      group.gather("done", Deadline(spec.grace + _ROUND_SECONDS), on_other=note,
                   got=done)
      for report in done.values():
        if report.get("failure"):
          failures.append(report["failure"])
      interrupted = signals.interrupt.signal is not None or any(
          report.get("interrupted") for report in done.values())
      if result.exit_code == 0 and not failures and all(
          report.get("ok") for report in done.values()):
        group.broadcast({"finish": {"exit_code": 0, "root": ""}})
        return result
      root = _earliest(failures)
      root_text = _root_text(root, 0) if root else result.reason
      exit_code = next((r.get("exit_code") for r in [*done.values()]
                        if root and r.get("failure") == root), None)
      if exit_code is None:
        exit_code = result.exit_code or 1
      timed_out = exit_code == EXIT_TIMEOUT  # Never restarted.
      if interrupted or group.lost or timed_out or attempt >= spec.max_restarts:
        group.broadcast({"finish": {"exit_code": exit_code, "root": root}})
        result.reason = _summary(0, root_text, result, spec.grace)
        result.exit_code = exit_code
        result.first_failure = root.get("client") if root else None
        err.write(result.reason + "\n")
        err.flush()
        return result
      attempt += 1
      group.broadcast({"next": {"attempt": attempt, "root": root}})
      err.write(f"jdtensor launch (node 0): restarting the group ({attempt} of "
                f"{spec.max_restarts}) after: {root_text}\n")
      err.flush()
  except NodeError as e:
    group.broadcast({"error": str(e)})
    raise
  finally:
    for chan in group.chans.values():
      chan.close()


def _run_node_r(spec: LaunchSpec, out: IO[str], err: IO[str],
                env: Mapping[str, str], signals: supervisor.Signals, node: _NodeR,
                address: str) -> LaunchResult:
  me = spec.node_rank
  try:
    while True:
      held = _ports(spec, address)
      try:
        node.chan.send({"ports": [address, held.ports]})
        frame = node.expect(("go", "finish"), Deadline(_ROUND_SECONDS))
      finally:
        held.release()
      if "finish" in frame:
        raise NodeError("node 0 ended the run before it started.")
      go = frame["go"]
      stopped_by: list[dict[str, Any]] = []

      def stop_request() -> str | None:
        for _, got in _drain(node.inbox):
          if got is None:
            stopped_by.append(_gone(0))
          elif "stop" in got:
            stopped_by.append(got["stop"])
        if stopped_by:
          return f"stopped because of {_root_text(stopped_by[0], me)}"
        return None

      mine: list[dict[str, Any]] = []

      def on_failure(failure: Failure) -> None:
        mine.append(_failure_frame(me, failure))
        node.chan.send({"failed": mine[-1]})
      result = supervisor.run_attempt(spec, _attempt_for(spec, go), out, err, env,
                                    signals, stop_request, on_failure, quiet=True)
      result.restarts = int(go["attempt"])
      if signals.interrupt.signal is not None and not mine:
        on_failure(Failure(None, f"node {me}'s launcher was interrupted",
                                    True, time.time()))
      if stopped_by and stopped_by[0]["what"] == _gone(0)["what"]:
        raise NodeError("node 0's launcher is gone (connection closed).")
      node.chan.send({"done": {
          "ok": result.exit_code == 0, "exit_code": result.exit_code,
          "failure": mine[0] if mine else None,
          "interrupted": signals.interrupt.signal is not None}})
      decision = node.expect(("next", "finish"), Deadline(spec.grace + _ROUND_SECONDS))
      if "finish" in decision:
        end = decision["finish"]
        result.exit_code = int(end.get("exit_code", 1))
        if result.exit_code:
          root = end.get("root")
          result.first_failure = root.get("client") if root else None
          result.reason = _summary(me, _root_text(root, me) if root else
                                   "the run failed", result, spec.grace)
          err.write(result.reason + "\n")
          err.flush()
        return result
      root = decision["next"].get("root")
      err.write(f"jdtensor launch (node {me}): restarting the group "
                f"({decision['next']['attempt']} of {spec.max_restarts}) after: "
                f"{_root_text(root, me) if root else 'a failure'}\n")
      err.flush()
  finally:
    node.chan.close()

