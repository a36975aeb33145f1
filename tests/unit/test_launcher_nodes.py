"""Node R's side of a multi-node launch against a scripted node 0 (a socket
pair; no processes)."""

import socket
import threading
import time

import pytest

from jdtensor import launcher
from jdtensor._wire import Frames, encode
from jdtensor.launcher import channels, nodes


def test_a_node_waits_for_the_first_go_as_long_as_node_0_waits_for_the_last_node(
    monkeypatch):
  """Found on review: a node that joined early waited _ROUND_SECONDS (120 s)
  for ``go``, though node 0 waits up to the join time-out (300 s) for the
  last node to boot: nodes started more than two minutes apart failed with
  "node 0 did not answer". Scaled down: a round of 0.2 s, a go after 0.6 s."""
  monkeypatch.setattr(nodes, "_ROUND_SECONDS", 0.2)
  spec = launcher.LaunchSpec(command=("x",), num_clients=1, nnodes=2, node_rank=1,
                             coordinator="127.0.0.1:1", timeout=5)
  mine, node0 = socket.socketpair()
  with mine, node0:
    node = nodes._NodeR(spec, channels.Channel(mine), "127.0.0.1")  # pylint: disable=protected-access
    out = []
    t = threading.Thread(target=lambda: out.append(node.begin(0)), daemon=True)
    t.start()
    frames = Frames()
    got = []
    while not got:
      got = frames.feed(node0.recv(4096))
    assert "ports" in got[0]
    time.sleep(0.6)  # The last node boots late.
    node0.sendall(encode({"go": {"jobs": ["127.0.0.1:9001", "127.0.0.1:9002"],
                                 "attempt": 0, "nonce": "ab" * 16, "secret": "cd" * 32}}))
    t.join(5)
    assert out and out[0].client_ids == (1,), out
    # A restart's go is a round's work: not waited for as long.
    with pytest.raises(nodes.NodeError, match=r"node 0 did not answer within 0.2 s"):
      node.begin(1)


_NOTES = [channels.FailureNote(1, 3, "client 3 failed: ZeroDivisionError", True, 12.5),
          channels.FailureNote(0, None, "node 0's launcher was interrupted", True, None),
          channels.FailureNote.gone(2)]


@pytest.mark.parametrize("note", _NOTES, ids=["client", "launcher", "lost"])
def test_a_nodes_failure_crosses_the_wire_as_it_was(note):
  """What one node tells the others (through JSON, as on the connection)."""
  import json  # pylint: disable=g-import-not-at-top
  back = channels.FailureNote.from_frame(json.loads(json.dumps(note.to_frame())))
  assert back == note
  assert back.lost == (note.what == "node 2's launcher is gone")
  assert back.text(note.node) == note.what
  assert back.text(7) == f"{note.what} (on node {note.node})"


@pytest.mark.parametrize("message", [
    channels.NodeDone(True, 0, None, False),
    channels.NodeDone(False, 1, _NOTES[0], True),
    channels.GroupDecision(True, None),
    channels.GroupDecision(True, _NOTES[0], exit_code=1),
    channels.GroupDecision(False, _NOTES[2], attempt=2),
    channels.NodePorts("10.0.0.2", (9001, 9002)),
    channels.GroupGo(("10.0.0.1:9000", "10.0.0.2:9001"), 1, "ab" * 16),
    channels.GroupGo(("h:1",), 0, "ab" * 16, secret="cd" * 32, trace="/shared/run.json")],
    ids=["done-ok", "done-failed", "finish-ok", "finish-failed", "next", "ports",
         "go", "go-secret-trace"])
def test_the_nodes_messages_cross_the_wire_as_they_were(message):
  import json  # pylint: disable=g-import-not-at-top
  frame = json.loads(json.dumps(message.to_frame()))
  if isinstance(message, channels.NodeDone):
    assert channels.NodeDone.from_frame(frame["done"]) == message
  elif isinstance(message, channels.NodePorts):
    assert channels.NodePorts.from_frame(frame["ports"]) == message
  elif isinstance(message, channels.GroupGo):
    assert channels.GroupGo.from_frame(frame["go"]) == message
  else:
    assert set(frame) == {"finish" if message.over else "next"}
    assert channels.GroupDecision.from_frame(frame) == message


@pytest.mark.parametrize("frame", [{"node": "x", "what": "?"}, {"what": "no node"},
                                   {"node": 0}, {"node": 0, "what": "w", "at": "never"}])
def test_a_malformed_failure_note_is_refused(frame):
  with pytest.raises((KeyError, TypeError, ValueError)):
    channels.FailureNote.from_frame(frame)


@pytest.mark.parametrize("read,body", [
    (channels.NodePorts.from_frame, ["10.0.0.2"]),
    (channels.NodePorts.from_frame, ["10.0.0.2", ["x"]]),
    (channels.GroupGo.from_frame, {"attempt": 0, "nonce": "ab"}),
    (channels.GroupGo.from_frame, {"jobs": ["h:1"], "attempt": "first", "nonce": "ab"}),
    (channels.GroupGo.from_frame, {"jobs": 7, "attempt": 0, "nonce": "ab"})],
    ids=["ports-short", "ports-not-numbers", "go-no-jobs", "go-attempt", "go-jobs"])
def test_a_malformed_ports_or_go_is_refused(read, body):
  with pytest.raises((KeyError, TypeError, ValueError)):
    read(body)


def test_a_malformed_go_ends_the_node_with_what_it_got():
  spec = launcher.LaunchSpec(command=("x",), num_clients=1, nnodes=2, node_rank=1,
                             coordinator="127.0.0.1:1", timeout=5)
  mine, node0 = socket.socketpair()
  with mine, node0:
    node = nodes._NodeR(spec, channels.Channel(mine), "127.0.0.1")  # pylint: disable=protected-access
    node0.sendall(encode({"go": {"attempt": 0}}))
    with pytest.raises(nodes.NodeError, match=r"^node 0 sent a malformed go: "
                       r"\{'attempt': 0\}$"):
      node.begin(0)


def test_a_malformed_ports_ends_the_group_naming_the_node():
  spec = launcher.LaunchSpec(command=("x",), num_clients=1, nnodes=2, node_rank=0,
                             coordinator="127.0.0.1:1", timeout=5)
  mine, node1 = socket.socketpair()
  with mine, node1:
    node = nodes._Node0(spec, {1: channels.Channel(mine)}, "127.0.0.1")  # pylint: disable=protected-access
    node1.sendall(encode({"ports": ["10.0.0.2"]}))
    with pytest.raises(nodes.NodeError, match=r"^node 1 sent a malformed ports: "
                       r"\['10.0.0.2'\]$"):
      node.begin(0)
