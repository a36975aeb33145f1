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
