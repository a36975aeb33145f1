"""The byte meter: what makes a client in its own code "making progress".

Real files, pipes and TCP sockets in this process; jdtensor's own sockets and
the coordination service's port left out.
"""

import os
import socket
import threading

import pytest

from jdtensor.heartbeat.progress import ByteMeter, tcp_bytes

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/io"),
                                reason="Linux's /proc/self/io")


def _pair():
  server = socket.create_server(("127.0.0.1", 0))
  client = socket.create_connection(server.getsockname())
  accepted, _ = server.accept()
  server.close()
  return client, accepted


def _drain(sock, size):
  got = 0
  while got < size:
    got += len(sock.recv(1 << 16))


def test_files_and_pipes_are_counted(tmp_path):
  meter = ByteMeter()
  before = meter.total()
  (tmp_path / "f").write_bytes(b"x" * 100_000)
  read_end, write_end = os.pipe()
  os.write(write_end, b"y" * 10_000)
  os.read(read_end, 10_000)
  os.close(read_end), os.close(write_end)
  assert 120_000 <= meter.total() - before < 130_000


def test_send_and_recv_on_tcp_are_counted_and_jdtensors_own_sockets_are_not():
  user, user_peer = _pair()
  own, own_peer = _pair()  # Stands for a liveness link.
  service, service_peer = _pair()
  meter = ByteMeter(lambda: [own.fileno(), own_peer.fileno()],
                    service_ports=[service.getsockname()[1]])
  assert tcp_bytes(user.fileno()) is not None
  meter.total()  # The first reading of a socket is its reference.
  before = meter.total()
  for sock, peer in ((own, own_peer), (service, service_peer)):
    sock.sendall(b"z" * 500_000)
    _drain(peer, 500_000)
  assert meter.total() - before < 10_000  # /proc/self/io's own reads only.
  user.sendall(b"u" * 200_000)  # send() is not in /proc/self/io.
  _drain(user_peer, 200_000)
  # Both ends are this process's: the bytes acknowledged on one and received
  # on the other.
  assert 400_000 <= meter.total() - before < 420_000
  for s in (user, user_peer, own, own_peer, service, service_peer):
    s.close()


def test_sockets_are_counted_only_when_asked():
  user, user_peer = _pair()
  meter = ByteMeter()
  meter.total()
  before = meter.total(sockets=False)
  user.sendall(b"u" * 100_000)
  _drain(user_peer, 100_000)
  assert meter.total(sockets=False) - before < 10_000
  # The next reading with sockets counts what moved since the last one.
  assert meter.total() - before >= 200_000
  user.close(), user_peer.close()


def test_a_blocked_thread_moves_nothing():
  meter = ByteMeter()
  lock = threading.Lock()
  lock.acquire()
  thread = threading.Thread(target=lambda: lock.acquire(timeout=0.3))
  before = meter.total()
  thread.start()
  thread.join(5)
  assert meter.total() - before < 1000
