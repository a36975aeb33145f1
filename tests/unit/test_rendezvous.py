"""The start-up handshake with threads as clients (no JAX, no processes)."""

import itertools
import json
import socket
import threading
import time

import pytest

from jdtensor import _wire
from jdtensor.runtime import handshake, rendezvous as rendezvous_mod
from jdtensor._deadline import Deadline
from jdtensor.runtime.rendezvous import Hello, rendezvous
from jdtensor.errors import StartupError, StartupTimeoutError
from jdtensor.launcher import free_ports

SECRET = "0123456789abcdef" * 2


def cluster(n=2):
  ports = free_ports(n)
  return tuple(f"localhost:{p}" for p in ports)


def hello(jobs, client, devices=2, **settings):
  return Hello(client, len(jobs), jobs, devices, True,
               tuple(sorted({"DTENSOR_JOB_NAME": "worker", **settings}.items())))


def meet(hellos, secrets, timeout=5.0, client_0_late_by=0.0):
  """Runs every client's rendezvous in a thread; their results (or errors).
  Client 0 starts first, or `client_0_late_by` seconds after the others."""
  jobs = hellos[0].jobs
  out = [None] * len(hellos)

  def run(i):
    try:
      out[i] = rendezvous(hellos[i], jobs[0], ("127.0.0.1", int(jobs[0].rsplit(":", 1)[1])),
                          Deadline(timeout), secrets[i])
    except Exception as e:  # pylint: disable=broad-except
      out[i] = e
  threads = [threading.Thread(target=run, args=(i,)) for i in range(len(hellos))]
  if client_0_late_by:
    for t in threads[1:]:
      t.start()
    time.sleep(client_0_late_by)
    threads[0].start()
  else:
    threads[0].start()
    time.sleep(0.05)
    for t in threads[1:]:
      t.start()
  for t in threads:
    t.join(timeout + 5)
  return out


def connect_when_up(port, timeout=5.0):
  """A connection to client 0 once it listens."""
  deadline = time.monotonic() + timeout
  while True:
    try:
      return socket.create_connection(("127.0.0.1", port))
    except OSError:
      assert time.monotonic() < deadline, "client 0 never listened"
      time.sleep(0.02)


def close(meetings):
  for m in meetings:
    if isinstance(m, rendezvous_mod.Meeting):
      for sock in m.links._sockets.values():
        sock.close()


def test_authenticated_clients_meet_and_keep_their_links_to_client_0():
  jobs = cluster(3)
  out = meet([hello(jobs, c) for c in range(3)], [SECRET] * 3)
  try:
    assert all(isinstance(m, rendezvous_mod.Meeting) for m in out), out
    # The heartbeat beats on these: client 0 holds one per client, the others
    # one each, to client 0.
    assert sorted(out[0].links._sockets) == [1, 2]
    assert [sorted(m.links._sockets) for m in out[1:]] == [[0], [0]]
  finally:
    close(out)


def test_unauthenticated_clients_still_meet():
  jobs = cluster(2)
  out = meet([hello(jobs, c) for c in range(2)], [None, None])
  try:
    assert all(isinstance(m, rendezvous_mod.Meeting) for m in out), out
  finally:
    close(out)


def record_sleeps(monkeypatch):
  """The rendezvous module's `time`, with its sleeps recorded in the list returned."""
  sleeps = []

  class Clock:
    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def sleep(seconds):
      sleeps.append(seconds)
      time.sleep(seconds)
  monkeypatch.setattr(rendezvous_mod, "time", Clock)
  return sleeps


def test_a_client_before_client_0_retries_within_10_ms_and_still_meets(monkeypatch):
  """Clients started together reach the rendezvous tens of milliseconds
  apart: one that finds client 0 not yet listening tries again after 1 ms,
  doubling to 10 ms (a fixed 50 ms put up to 50 ms on the start-up's critical
  path), and meets client 0 when it comes."""
  sleeps = record_sleeps(monkeypatch)
  jobs = cluster(2)
  out = meet([hello(jobs, c) for c in range(2)], [SECRET] * 2, client_0_late_by=0.3)
  try:
    assert all(isinstance(m, rendezvous_mod.Meeting) for m in out), out
    assert sleeps[:5] == [0.001, 0.002, 0.004, 0.008, 0.01], sleeps
    assert len(sleeps) > 5 and set(sleeps[5:]) == {0.01}, sleeps
  finally:
    close(out)


def test_a_long_wait_for_client_0_slows_the_attempts_to_the_poll_interval():
  """After a second of waiting (client 0 seconds late, as under
  oversubscription) a waiting client tries only every `POLL_SECONDS`: at
  about 0.1 ms of CPU an attempt, a hundred waiting clients must not take
  the CPU that client 0 needs to get there."""
  delays = list(itertools.islice(handshake.retry_delays(), 200))
  fast = list(itertools.takewhile(lambda d: d <= 0.01, delays))
  assert 1.0 <= sum(fast) < 1.02 and len(fast) < 105, fast
  assert delays[len(fast):len(fast) + 3] == [0.02, 0.04, handshake.POLL_SECONDS]
  assert set(delays[len(fast) + 2:]) == {handshake.POLL_SECONDS}


def test_jax_s_service_is_polled_every_ms_then_every_5_ms(monkeypatch):
  """After the rendezvous JAX's service listens a few ms later: a client
  polls it every 1 ms (5 ms put a mean 2.5 ms on the critical path), for
  half a second, then every 5 ms, and returns when it listens."""
  sleeps = record_sleeps(monkeypatch)
  port = free_ports(1)[0]
  server = socket.socket()
  server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

  def listen_late():
    time.sleep(0.8)
    server.bind(("127.0.0.1", port))
    server.listen(1)
  late = threading.Thread(target=listen_late)
  late.start()
  try:
    rendezvous_mod.wait_for_service(f"127.0.0.1:{port}", Deadline(10.0), 1)
    fast = list(itertools.takewhile(lambda d: d == 0.001, sleeps))
    assert 10 < len(fast) <= 500 and set(sleeps[len(fast):]) == {0.005}, sleeps
    assert len(sleeps) > len(fast), sleeps  # It waited past the window.
  finally:
    late.join(5)
    server.close()


@pytest.mark.parametrize("host, family", [("localhost", None), ("127.0.0.1", socket.AF_INET),
                                          ("::1", socket.AF_INET6)])
def test_an_ascii_host_resolves_as_bytes_to_the_same_addresses(host, family):
  """`socket_host` spares the idna codec (2 ms of imports) and changes nothing
  else: the same addresses, and a name that is not ASCII is left to idna."""
  if family == socket.AF_INET6 and not socket.has_ipv6:
    pytest.skip("no IPv6 here")
  assert _wire.socket_host(host) == host.encode()
  def resolve(name):
    return socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
  try:
    expected = resolve(host)
  except socket.gaierror:
    pytest.skip(f"{host} does not resolve here")
  assert resolve(_wire.socket_host(host)) == expected
  assert _wire.socket_host("bücher.example") == "bücher.example"


def test_a_wrong_secret_is_refused_and_client_0_keeps_waiting():
  jobs = cluster(2)
  out = meet([hello(jobs, 0), hello(jobs, 1)], [SECRET, "x" * 32], timeout=2)
  assert isinstance(out[1], StartupError)
  assert "start-up refused by client 0: this is client 0 of another run" in str(out[1])
  assert isinstance(out[0], StartupTimeoutError)  # Still waiting for the real one.


def test_settings_that_differ_are_named_with_both_values():
  jobs = cluster(2)
  out = meet([hello(jobs, 0, JDTENSOR_HEARTBEAT_PERIOD=0.5),
              hello(jobs, 1, JDTENSOR_HEARTBEAT_PERIOD=30.0)], [SECRET] * 2)
  message = ("Client 1 has JDTENSOR_HEARTBEAT_PERIOD=30.0 but client 0 has 0.5; "
             "set JDTENSOR_HEARTBEAT_PERIOD the same on every client.")
  assert str(out[0]) == message
  assert str(out[1]) == f"Client 1: start-up refused by client 0: {message}"


def test_unauthenticated_errors_do_not_show_client_0s_values():
  jobs = cluster(2)
  out = meet([hello(jobs, 0, devices=2), hello(jobs, 1, devices=3)], [None, None])
  assert str(out[0]) == ("Client 1 has 3 local devices but client 0 has 2; DTensor "
                         "meshes need the same number of devices on every client.")
  assert str(out[1]) == ("Client 1: start-up refused by client 0: Client 1 has 3 "
                         "local devices, which differs from client 0's; DTensor "
                         "meshes need the same number on every client.")


@pytest.mark.parametrize("data,reason", [
    (b"[]\n", "it sent a frame that is not a JSON object"),
    (b"not json\n", "it sent a frame that is not JSON"),
    (b'{"jdtensor": 2}\n', "it sent a malformed authentication"),
    (b"x" * (_wire.MAX_FRAME + 10), "it sent more than 65536 bytes without a "
     "line end"),
], ids=["list", "text", "incomplete", "oversized"])
def test_garbage_is_refused_without_stopping_client_0(data, reason, caplog):
  jobs = cluster(2)
  port = int(jobs[0].rsplit(":", 1)[1])
  out = [None]

  def serve():
    try:
      out[0] = rendezvous(hello(jobs, 0), jobs[0], ("127.0.0.1", port), Deadline(5), SECRET)
    except Exception as e:  # pylint: disable=broad-except
      out[0] = e
  t = threading.Thread(target=serve)
  t.start()
  rogue = connect_when_up(port)
  with rogue, caplog.at_level("WARNING", logger="jdtensor"):
    rogue.recv(4096)  # The challenge.
    try:
      rogue.sendall(data)
    except OSError:
      pass
    time.sleep(0.3)
    real = rendezvous(hello(jobs, 1), jobs[0], ("127.0.0.1", port), Deadline(5), SECRET)
    t.join(10)
  try:
    assert isinstance(out[0], rendezvous_mod.Meeting), out[0]
    assert any(reason in r.getMessage() for r in caplog.records), caplog.text
  finally:
    close([out[0], real])


def test_the_challenge_says_nothing_about_the_cluster():
  jobs = cluster(2)
  port = int(jobs[0].rsplit(":", 1)[1])
  t = threading.Thread(target=lambda: meet_quietly(jobs, port), daemon=True)
  t.start()
  s = connect_when_up(port)
  with s:
    challenge = json.loads(s.recv(4096))
  assert sorted(challenge) == ["auth", "jdtensor", "nonce", "run"]
  assert challenge["run"] == rendezvous_mod.run_id(SECRET) and challenge["auth"] is True
  t.join(5)


def meet_quietly(jobs, port):
  try:
    rendezvous(hello(jobs, 0), jobs[0], ("127.0.0.1", port), Deadline(1.5), SECRET)
  except StartupTimeoutError:
    pass
