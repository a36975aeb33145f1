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

import dataclasses
import os
import queue
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol

from jdtensor import _env, _report
from jdtensor._deadline import Deadline
from jdtensor._wire import format_host_port, handshake_proof, split_host_port
from jdtensor.errors import LAUNCH_TIMEOUT_EXIT_CODE, ConfigError
from jdtensor.launcher import compile_cache, supervisor
from jdtensor.launcher.channels import (Channel, FailureNote, GroupDecision, GroupGo,
                                        NodeDone, NodeError, NodePorts, join, serve)
from jdtensor.launcher.output import say
from jdtensor.launcher.spec import (Attempt, NodeFailure, HeldPorts, LaunchResult,
                                    LaunchSpec)
from jdtensor.launcher.trace import RunTrace

__all__ = ["run", "NodeError"]

_DEFAULT_JOIN_SECONDS = 300.0  # Without --timeout: how long nodes wait to meet.
_ROUND_SECONDS = 120.0  # For a node's ports, or its "done", once running.
_EXIT_USAGE = 2


def _join_seconds(spec: LaunchSpec) -> float:
  """How long node 0 waits for every node to join (``--timeout``)."""
  return spec.timeout or _DEFAULT_JOIN_SECONDS


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


# -- attempts ---------------------------------------------------------------------

def _note(node: int, failure: NodeFailure) -> FailureNote:
  return FailureNote(node, failure.client, failure.what, failure.own, failure.at)


def _drain(inbox: queue.Queue) -> Iterator[tuple[int, dict[str, Any] | None]]:
  """What `inbox` holds now, without waiting."""
  while True:
    try:
      yield inbox.get_nowait()
    except queue.Empty:
      return


def _earliest(failures: list[FailureNote]) -> FailureNote | None:
  """The root cause among the nodes' reports: a client that failed by
  itself, earliest first; else the first report."""
  own = sorted((f for f in failures if f.own), key=lambda f: (f.at or 0.0, f.node))
  return own[0] if own else (failures[0] if failures else None)


def _summary(me: int, root: str, result: LaunchResult, grace: float) -> str:
  """This node's summary line: the run's root cause, and what this node's
  stop did (the same "stopped" as one node's launcher)."""
  return _report.summary(root, result.stopped, node=me, killed=result.killed,
                         grace=grace, frozen=result.frozen)


_Watchers = tuple[Callable[[], "str | None"] | None, Callable[[NodeFailure], None] | None]


class _NodeRole(Protocol):
  """One node's part in the attempts: `_OneNode` (one node, restarts),
  `_Node0` (decides for the group) or `_NodeR` (does what node 0 decides)."""

  def begin(self, attempt: int) -> Attempt:
    """Sets attempt `attempt` up (the group's ports, its ``go``)."""

  def watchers(self) -> _Watchers:
    """What the supervisor polls (another node's stop) and tells (this
    node's failure), or None each."""

  def decide(self, result: LaunchResult, signals: supervisor.Signals) -> _Decision:
    """After an attempt: over or started again, with the group's root cause."""

  def on_error(self, error: NodeError) -> None:
    """The group cannot go on (`error`)."""

  def close(self) -> None:
    """Ends this node's part (its connections)."""


class _Node0:
  """Node 0's side of the attempts: it gathers the nodes' ports, says ``go``,
  relays every failure, and decides for all."""

  def __init__(self, spec: LaunchSpec, chans: dict[int, Channel], address: str,
               cache: compile_cache.CompileCache | None = None,
               trace: RunTrace | None = None):
    self.spec, self.chans, self.address = spec, chans, address
    self.cache = cache
    self.trace = trace
    self.shipped: set[str] = set()  # The cache entries the nodes were sent.
    self.inbox: queue.Queue = queue.Queue()
    for rank, chan in chans.items():
      chan.listen(rank, self.inbox)
    self.lost: set[int] = set()
    self.failures: list[FailureNote] = []  # This attempt's, from any node.
    self.done: dict[int, NodeDone] = {}  # This attempt's, by node.

  def broadcast(self, frame: dict[str, Any], but: int | None = None) -> None:
    for rank, chan in self.chans.items():
      if rank != but and rank not in self.lost:
        chan.send(frame)

  def gather(self, kind: str, deadline: Deadline, on_other: Any = None,
             got: dict[int, Any] | None = None,
             read: Callable[[Any], Any] = lambda body: body) -> dict[int, Any]:
    """One `kind` frame from every node (`got`: those already received), its
    body as `read` reads it; raises NodeError for a node lost or silent."""
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
        try:
          got[rank] = read(frame[kind])
        except (KeyError, TypeError, ValueError):
          raise NodeError(f"node {rank} sent a malformed {kind}: "
                          f"{str(frame[kind])[:200]}") from None
      elif on_other is not None:
        on_other(rank, frame)
    return got

  def begin(self, attempt: int) -> Attempt:
    spec = self.spec
    held = _ports(spec, self.address)
    try:
      ports = {0: NodePorts(self.address, tuple(held.ports))}
      ports.update(self.gather("ports", Deadline(_ROUND_SECONDS),
                               read=NodePorts.from_frame))
      jobs = [format_host_port(ports[r].address, p) for r in range(spec.nnodes)
              for p in ports[r].ports]
      try:
        _env.parse_jobs(",".join(jobs))  # Distinct and well-formed.
      except ConfigError as e:
        problem = (f"the nodes' clients would not have distinct addresses: {e} "
                   "Give the nodes different addresses (--node-address) or "
                   "--port ranges, or let jdtensor pick free ports (no --port).")
        self.broadcast({"error": problem})
        raise NodeError(problem) from None
      go = GroupGo(tuple(jobs), attempt, secrets.token_hex(16),
                   None if spec.secret else secrets.token_hex(32),
                   None if self.trace is None else os.path.abspath(self.trace.path))
      if self.cache is not None and self.cache.owned:
        for name, frames in compile_cache.new_entries(self.cache, self.shipped):
          for frame in frames:
            self.broadcast({"cache": frame})
          self.shipped.add(name)
      self.broadcast(go.to_frame())
    finally:
      held.release()
    self.failures, self.done = [], {}
    return _attempt_for(spec, go)

  def _heard(self, rank: int, frame: dict[str, Any]) -> None:
    if "failed" in frame:
      self.failures.append(FailureNote.from_frame(frame["failed"]))
      self.broadcast({"stop": frame["failed"]}, but=rank)
    elif "done" in frame:
      self.done[rank] = NodeDone.from_frame(frame["done"])

  def _on_failure(self, failure: NodeFailure) -> None:
    note = _note(0, failure)
    self.failures.append(note)
    self.broadcast({"stop": note.to_frame()})

  def watchers(self) -> _Watchers:
    def stop_request() -> str | None:
      for rank, frame in _drain(self.inbox):
        if frame is None:
          self.lost.add(rank)
          self.failures.append(FailureNote.gone(rank))
          self.broadcast({"stop": self.failures[-1].to_frame()})
        else:
          self._heard(rank, frame)
      root = _earliest(self.failures)
      return None if root is None else f"stopped because of {root.text(0)}"
      return None
    return stop_request, self._on_failure

  def decide(self, result: LaunchResult, signals: supervisor.Signals) -> _Decision:
    spec, attempt, failures, done = self.spec, result.restarts, self.failures, self.done
    if signals.interrupt.signal is not None and not failures:
      self._on_failure(NodeFailure(None, "node 0's launcher was interrupted", True,
                               time.time()))
    self.gather("done", Deadline(spec.grace + _ROUND_SECONDS), on_other=self._heard,
                got=done, read=NodeDone.from_frame)
    failures += [report.failure for report in done.values() if report.failure]
    interrupted = signals.interrupt.signal is not None or any(
        report.interrupted for report in done.values())
    if result.exit_code == 0 and not failures and all(
        report.ok for report in done.values()):
      self.broadcast(GroupDecision(True, None).to_frame())
      return _Decision(True, result)
    root = _earliest(failures)
    root_text = root.text(0) if root else result.reason
    exit_code = next((r.exit_code for r in done.values()
                      if root and r.failure == root), None)
    if exit_code is None:
      exit_code = result.exit_code or 1
    timed_out = exit_code == LAUNCH_TIMEOUT_EXIT_CODE  # Never restarted.
    if interrupted or self.lost or timed_out or attempt >= spec.max_restarts:
      self.broadcast(GroupDecision(True, root, exit_code=exit_code).to_frame())
      result = dataclasses.replace(
          result, reason=_summary(0, root_text, result, spec.grace), exit_code=exit_code,
          first_failure=root.client if root else None)
      return _Decision(True, result, result.reason)
    self.broadcast(GroupDecision(False, root, attempt=attempt + 1).to_frame())
    return _Decision(False, _blame(result, root),
                     f"jdtensor launch (node 0): restarting the group "
                     f"({attempt + 1} of {spec.max_restarts}) after: {root_text}")

  def on_error(self, error: NodeError) -> None:
    """The group cannot go on: every node is told why."""
    self.broadcast({"error": str(error)})

  def close(self) -> None:
    for chan in self.chans.values():
      chan.close()


class _NodeR:
  """Node R's side: sends its ports, waits for ``go``, reports its failures
  and its ``done``, and does what node 0 decides."""

  def __init__(self, spec: LaunchSpec, chan: Channel, address: str,
               cache: compile_cache.CompileCache | None = None,
               trace: RunTrace | None = None):
    self.spec, self.chan, self.address = spec, chan, address
    self.cache = cache
    self.trace = trace
    self.me = spec.node_rank
    self.inbox: queue.Queue = queue.Queue()
    chan.listen(0, self.inbox)
    self.stopped_by: list[FailureNote] = []  # This attempt's, from node 0.
    self.mine: list[FailureNote] = []  # This attempt's own failures.

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

  def begin(self, attempt: int) -> Attempt:
    held = _ports(self.spec, self.address)
    # The first ``go`` comes once every node has joined: node 0 waits for the
    # last one up to the join time-out (nodes may boot minutes apart), and
    # says so (an error) if it never comes.
    wait = _ROUND_SECONDS + (_join_seconds(self.spec) if attempt == 0 else 0.0)
    try:
      self.chan.send(NodePorts(self.address, tuple(held.ports)).to_frame())
      # Node 0's compilation cache comes first (from the second attempt on):
      # only client 0 writes entries, and this node's clients would otherwise
      # compile what the others read.
      while "cache" in (frame := self.expect(("go", "finish", "cache"), Deadline(wait))):
        if self.cache is not None and self.cache.owned:
          compile_cache.receive(self.cache, frame["cache"])
    finally:
      held.release()
    if "finish" in frame:
      raise NodeError("node 0 ended the run before it started.")
    try:
      go = GroupGo.from_frame(frame["go"])
    except (KeyError, TypeError, ValueError):
      raise NodeError(f"node 0 sent a malformed go: {str(frame['go'])[:200]}") from None
    if self.trace is not None and go.trace is not None:
      self.trace.beside(go.trace)
    self.stopped_by, self.mine = [], []
    return _attempt_for(self.spec, go)

  def _on_failure(self, failure: NodeFailure) -> None:
    self.mine.append(_note(self.me, failure))
    self.chan.send({"failed": self.mine[-1].to_frame()})

  def watchers(self) -> _Watchers:
    def stop_request() -> str | None:
      for _, got in _drain(self.inbox):
        if got is None:
          self.stopped_by.append(FailureNote.gone(0))
        elif "stop" in got:
          self.stopped_by.append(FailureNote.from_frame(got["stop"]))
      if self.stopped_by:
        return f"stopped because of {self.stopped_by[0].text(self.me)}"
      return None
    return stop_request, self._on_failure

  def decide(self, result: LaunchResult, signals: supervisor.Signals) -> _Decision:
    spec, me = self.spec, self.me
    if signals.interrupt.signal is not None and not self.mine:
      self._on_failure(NodeFailure(None, f"node {me}'s launcher was interrupted", True,
                               time.time()))
    if self.stopped_by and self.stopped_by[0].lost and self.stopped_by[0].node == 0:
      raise NodeError("node 0's launcher is gone (connection closed).")
    self.chan.send(NodeDone(result.exit_code == 0, result.exit_code,
                            self.mine[0] if self.mine else None,
                            signals.interrupt.signal is not None).to_frame())
    group = GroupDecision.from_frame(
        self.expect(("next", "finish"), Deadline(spec.grace + _ROUND_SECONDS)))
    root = group.root
    if group.over:
      if not group.exit_code:
        return _Decision(True, dataclasses.replace(result, exit_code=0))
      result = dataclasses.replace(
          result, exit_code=group.exit_code, first_failure=root.client if root else None,
          reason=_summary(me, root.text(me) if root else "the run failed", result,
                          spec.grace))
      return _Decision(True, result, result.reason)
    return _Decision(False, _blame(result, root),
                     f"jdtensor launch (node {me}): restarting the group "
                     f"({group.attempt} of {spec.max_restarts}) "
                     f"after: {root.text(me) if root else 'a failure'}")

  def on_error(self, error: NodeError) -> None:
    pass  # Node 0 decides; it hears of this node's end from its connection.

  def close(self) -> None:
    self.chan.close()


def run(spec: LaunchSpec, out: IO[str], err: IO[str],
        env: Mapping[str, str], signals: supervisor.Signals,
        trace: RunTrace | None = None) -> LaunchResult:
  """Runs `spec` across its nodes and attempts; see the module docstring
  (`trace`: where each attempt's end is recorded, with ``--trace``)."""
  clients = None if spec.num_clients is None else spec.num_clients * spec.nnodes
  cache, line = compile_cache.plan(spec.compile_cache, spec.max_restarts,
                                   spec.device_type, env, clients)
  if line:
    say(err, line)
  if cache is not None:
    env = {**env, **cache.env}
  try:
    return _run_nodes(spec, out, err, env, signals, cache, trace)
  finally:
    if cache is not None:
      cache.remove()


def _run_nodes(spec: LaunchSpec, out: IO[str], err: IO[str], env: Mapping[str, str],
               signals: supervisor.Signals, cache: compile_cache.CompileCache | None,
               trace: RunTrace | None) -> LaunchResult:
  if spec.nnodes == 1:
    return _run_attempts(_OneNode(spec), spec, out, err, env, signals, cache, trace)
  deadline = Deadline(_join_seconds(spec))
  if not spec.secret:
    err.write(f"jdtensor launch: warning: the nodes' handshake is not "
              f"authenticated: {_env.JDTENSOR_RUN_SECRET} is not set; any process "
              f"that can reach {spec.coordinator} can join. Set the same one on "
              "every node.\n")
  try:
    if spec.node_rank == 0:
      chans = serve(spec, deadline, err)
      address = spec.node_address or split_host_port(spec.coordinator or "")[0]
      return _run_attempts(_Node0(spec, chans, address, cache, trace), spec, out, err,
                           env, signals, cache, trace)
    chan, seen_as = join(spec, deadline)
    return _run_attempts(_NodeR(spec, chan, spec.node_address or seen_as, cache, trace),
                         spec, out, err, env, signals, cache, trace)
  except NodeError as e:
    text = f"jdtensor launch (node {spec.node_rank}): {e}"
    say(err, text)
    return LaunchResult(reason=text, exit_code=_EXIT_USAGE)


@dataclass(frozen=True)
class _Decision:
  """What a node does after an attempt: whether the run is over, the
  attempt's `result` as the group ends it (the group's root cause, on any
  node), and `line` to print (the summary, or the restart line)."""
  over: bool
  result: LaunchResult
  line: str = ""


@dataclass
class _Restart:
  """One restart, for the time to recovery: the failure that ended the last
  attempt (``time.time()``), when the next attempt started and first
  completed a step on this node, and whether that attempt ended (failed, or
  was stopped) before its first step."""
  number: int
  failed_at: float
  cause: str
  started_at: float | None = None
  first_step_at: float | None = None
  ended_early: bool = False


def recovery_line(restarts: list[_Restart]) -> str:
  """The summary's line on the restarts' times to recovery (from the failure
  to the next attempt's first step, `jdtensor.step_done`), or '' for none."""
  if not restarts:
    return ""
  parts, unknown = [], False
  for r in restarts:
    start = ("" if r.started_at is None
             else f"{max(0.0, r.started_at - r.failed_at):.1f} s to start again")
    if r.first_step_at is None:
      # An attempt that ended first says nothing of the script's calls.
      unknown = unknown or not r.ended_early
      early = (f" (attempt {r.number + 1} ended before its first step)"
               if r.ended_early else "")
      parts.append(f"restart {r.number} after {r.cause}: {start or 'not started'}{early}")
      continue
    assert r.started_at is not None
    parts.append(f"restart {r.number} after {r.cause}: "
                 f"{max(0.0, r.first_step_at - r.failed_at):.1f} s ({start}, "
                 f"{max(0.0, r.first_step_at - r.started_at):.1f} s to the first step)")
  hint = (" (call jdtensor.step_done() after each step for the time to the first "
          "step)" if unknown else "")
  return "jdtensor launch: time to recovery: " + "; ".join(parts) + hint


def _run_attempts(node: _NodeRole, spec: LaunchSpec, out: IO[str], err: IO[str],
                  env: Mapping[str, str], signals: supervisor.Signals,
                  cache: compile_cache.CompileCache | None = None,
                  trace: RunTrace | None = None) -> LaunchResult:
  """The one restart loop: each attempt is set up by `node` (`begin`), run
  by `supervisor.run_attempt` with `node`'s watchers, and judged by `node`
  (`decide`): over, or started again."""
  attempt = 0
  restarts: list[_Restart] = []
  try:
    while True:
      plan = node.begin(attempt)
      stop_request, on_failure = node.watchers()
      result = dataclasses.replace(
          supervisor.run_attempt(spec, plan, out, err, env, signals, stop_request,
                                 on_failure, quiet=True),
          restarts=plan.restart_count)
      if trace is not None:
        trace.attempt(result)
      if restarts:
        restarts[-1].started_at = result.started_at
        restarts[-1].first_step_at = result.first_step_at
        restarts[-1].ended_early = result.first_step_at is None and result.exit_code != 0
      ended = time.time()
      decision = node.decide(result, signals)
      result, line = decision.result, decision.line
      if not decision.over and result.started_at is not None:
        line += f"; attempt {attempt + 1} ran {ended - result.started_at:.1f} s"
      if decision.over and restarts:  # Before the summary: that stays the last word.
        say(err, recovery_line(restarts))
      if line:
        say(err, line)
      for text in result.verdict_stacks:  # Under the summary it words.
        say(err, text)
      if decision.over:
        return result
      restarts.append(_Restart(attempt + 1, result.failed_at or ended,
                               _cause(result)))
      if cache is not None and cache.owned:  # The user's own is left alone.
        cache.drop_incomplete(since=result.started_at or ended)
      attempt += 1
  except NodeError as e:
    node.on_error(e)
    raise
  finally:
    node.close()


def _cause(result: LaunchResult) -> str:
  """The failure an attempt ended with, in a few words, for the recovery
  line: the root cause's client where known."""
  client = result.first_failure
  return "a failure" if client is None else f"client {client}'s failure"


def _blame(result: LaunchResult, root: FailureNote | None) -> LaunchResult:
  """`result` with the group's root cause (on any node), and when it failed."""
  if root is None:
    return result
  return dataclasses.replace(result, first_failure=root.client,
                             failed_at=root.at or result.failed_at)


class _OneNode:
  """One node with restarts: no network; each attempt on fresh local ports."""

  def __init__(self, spec: LaunchSpec):
    self.spec = spec

  def begin(self, attempt: int) -> Attempt:
    secret = self.spec.secret if attempt == 0 else secrets.token_hex(32)
    return Attempt.local(self.spec, attempt, secret)

  def watchers(self) -> _Watchers:
    return None, None

  def decide(self, result: LaunchResult, signals: supervisor.Signals) -> _Decision:
    spec, attempt = self.spec, result.restarts
    # A time-out bounds the whole run: it is never restarted.
    if (result.exit_code in (0, LAUNCH_TIMEOUT_EXIT_CODE)
        or signals.interrupt.signal is not None or attempt >= spec.max_restarts):
      return _Decision(True, result, result.reason)
    # One line per restart, with the whole summary of the attempt.
    why = result.reason.removeprefix("jdtensor launch: ")
    return _Decision(False, result, f"jdtensor launch: restarting ({attempt + 1} of "
                                    f"{spec.max_restarts}) after: {why}")

  def on_error(self, error: NodeError) -> None:
    pass

  def close(self) -> None:
    pass


def _attempt_for(spec: LaunchSpec, go: GroupGo) -> Attempt:
  n = spec.num_clients
  ids = tuple(range(spec.node_rank * n, (spec.node_rank + 1) * n))
  secret = go.secret or _client_secret(spec.secret, go.nonce)
  return Attempt(ids, go.jobs, secret, go.attempt)

