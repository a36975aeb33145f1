"""The start-up handshake with threads as clients (no JAX, no processes)."""

import itertools
import json
import socket
import threading
import time

import pytest

from jdtensor import _wire
from jdtensor._device_nodes import GpuIdentity
from jdtensor.runtime import handshake, rendezvous as rendezvous_mod
from jdtensor._deadline import Deadline
from jdtensor.runtime.rendezvous import Hello, rendezvous
from jdtensor.errors import StartupError, StartupTimeoutError
from jdtensor.launcher import free_ports
from jdtensor.runtime.links import LinkEvents

SECRET = "0123456789abcdef" * 2


def cluster(n=2):
  ports = free_ports(n)
  return tuple(f"localhost:{p}" for p in ports)


# What every client runs in these tests, unless one says otherwise (so that
# no test here imports jax to find it out).
SOFTWARE = handshake.Software("0.1.0", "0.12.1", "0.12.1", False)


def hello(jobs, client, devices=2, gpus=(), software=SOFTWARE, **settings):
  return Hello(client, len(jobs), jobs, devices, True,
               tuple(sorted({"DTENSOR_JOB_NAME": "worker", **settings}.items())),
               tuple(GpuIdentity(key, f"GPU {key} of node-a") for key in gpus),
               software=software)


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
      # A copy: a peer's end of stream drops a link from the watching thread.
      for sock in list(m.links._sockets.values()):
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


class ServiceWatch(LinkEvents):
  def __init__(self):
    self.listening = threading.Event()

  def service_up(self):
    self.listening.set()


def test_client_0_alone_polls_its_service_and_tells_every_client_on_the_links():
  """The others wait on the links, polling nothing: on 2 oversubscribed
  cores their polls took CPU from client 0, whom they all waited for."""
  jobs = cluster(3)
  out = meet([hello(jobs, c) for c in range(3)], [SECRET] * 3)
  port = free_ports(1)[0]
  server = socket.socket()
  server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    watches = [ServiceWatch() for _ in out[1:]]
    for m, w in zip(out[1:], watches):
      m.links.watch(w)
    out[0].links.watch(None)
    announcer = rendezvous_mod.announce_service(f"127.0.0.1:{port}", Deadline(10.0),
                                                out[0].links)
    time.sleep(0.2)
    assert announcer.is_alive() and not any(w.listening.is_set() for w in watches)
    server.bind(("127.0.0.1", port))
    server.listen(1)
    started = time.monotonic()
    for c, w in enumerate(watches, 1):
      rendezvous_mod.wait_for_service_notice(w.listening, f"127.0.0.1:{port}",
                                             Deadline(5.0), c)
    assert time.monotonic() - started < 1.0
    announcer.join(5)
    assert not announcer.is_alive()
  finally:
    server.close()
    close(out)


def test_only_client_0_can_say_its_service_listens():
  jobs = cluster(3)
  out = meet([hello(jobs, c) for c in range(3)], [SECRET] * 3)
  try:
    watches = [ServiceWatch() for _ in out]
    for m, w in zip(out, watches):
      m.links.watch(w)
    # Client 0 neither heeds it (it is not its own) nor relays it to client 2.
    out[1].links.send({rendezvous_mod.SERVICE_UP: True})
    time.sleep(0.3)
    assert not any(w.listening.is_set() for w in watches)
  finally:
    close(out)


def test_a_service_never_said_to_listen_is_a_start_up_timeout_naming_the_address():
  with pytest.raises(StartupTimeoutError) as err:
    rendezvous_mod.wait_for_service_notice(threading.Event(), "10.0.0.1:1234",
                                           Deadline(0.05), 2)
  assert str(err.value) == (
      "Client 2: client 0 met every client, but its JAX coordination service at "
      "DTENSOR_JOBS[0]='10.0.0.1:1234' did not come up before the init timeout; "
      "check client 0's output.")


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
  # The same DTENSOR_JOBS: the secrets differ, said on both sides.
  assert str(out[1]) == (
      "Client 1: start-up refused by client 0: client 0 has a different "
      "JDTENSOR_RUN_SECRET than this client (1) (the same DTENSOR_JOBS): set the same "
      "JDTENSOR_RUN_SECRET on every client")
  assert isinstance(out[0], StartupTimeoutError)  # Still waiting for the real one.
  assert "which never connected. client 1 connected with a different " in str(out[0])


def test_a_client_of_another_run_is_refused_as_such():
  jobs = cluster(2)
  other = cluster(2)  # Another run's DTENSOR_JOBS, pointed at the same client 0.
  other = (jobs[0],) + tuple(other[1:])
  out = meet([hello(jobs, 0), hello(other, 1)], [SECRET, "x" * 32], timeout=2)
  assert isinstance(out[1], StartupError)
  assert "start-up refused by client 0: this is client 0 of another run" in str(out[1])
  assert isinstance(out[0], StartupTimeoutError)
  assert "different JDTENSOR_RUN_SECRET" not in str(out[0])


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


_SHARED_GPU_FIX = (
    " NCCL fails the first cross-client collective of clients on one GPU ('Duplicate "
    "GPU detected'). Give each client its own GPUs (`jdtensor launch --device-type "
    "GPU` does; else set CUDA_VISIBLE_DEVICES per client), or, for a run that needs "
    "no cross-client GPU collective, set JDTENSOR_SHARE_GPUS=1 on every client.")


@pytest.mark.parametrize("gpus,culprits,shown", [
    ([["0"], ["1"], ["0"]], (0, 2), "0"),
    ([["0"], ["1"], ["1"]], (1, 2), "1"),
    ([["0", "1"], ["2", "3"], ["3", "4"]], (1, 2), "3"),
], ids=["with-client-0", "two-others", "one-of-several"])
def test_two_clients_on_one_gpu_are_named_with_the_gpu_and_the_fix(gpus, culprits, shown):
  jobs = cluster(3)
  out = meet([hello(jobs, c, gpus=g, JDTENSOR_SHARE_GPUS=False)
              for c, g in enumerate(gpus)], [SECRET] * 3)
  a, b = culprits
  message = (f"Clients {a} and {b} would share one GPU: client {a} uses GPU {shown} of "
             f"node-a, client {b} uses GPU {shown} of node-a." + _SHARED_GPU_FIX)
  assert isinstance(out[0], StartupError) and str(out[0]) == message
  assert str(out[b]) == f"Client {b}: start-up refused by client 0: {message}"


def test_an_unauthenticated_client_is_not_shown_the_other_clients_gpu():
  jobs = cluster(2)
  out = meet([hello(jobs, c, gpus=["GPU-5f"], JDTENSOR_SHARE_GPUS=False)
              for c in range(2)], [None, None])
  assert str(out[1]) == ("Client 1: start-up refused by client 0: Client 1's GPU "
                         "GPU-5f of node-a is used by another client too." + _SHARED_GPU_FIX)


@pytest.mark.parametrize("gpus,sharers", [
    ([["0"], ["1"], ["2"]], [1, 1, 1]),
    ([["0"], ["0"], ["0"]], [3, 3, 3]),
    ([["0"], ["0"], ["1"]], [2, 2, 1]),
    ([["0", "1"], ["1"], ["2"]], [2, 2, 1]),  # Its most shared GPU counts.
], ids=["own", "all-on-one", "two-on-one", "one-of-two"])
def test_shared_gpus_are_allowed_by_opt_in_and_each_client_learns_its_sharers(
    gpus, sharers):
  jobs = cluster(3)
  out = meet([hello(jobs, c, gpus=g, JDTENSOR_SHARE_GPUS=True)
              for c, g in enumerate(gpus)], [SECRET] * 3)
  try:
    assert [m.gpu_sharers for m in out] == sharers, out
  finally:
    close(out)


def test_the_opt_in_must_be_the_same_on_every_client():
  jobs = cluster(2)
  out = meet([hello(jobs, 0, gpus=["0"], JDTENSOR_SHARE_GPUS=True),
              hello(jobs, 1, gpus=["0"], JDTENSOR_SHARE_GPUS=False)], [SECRET] * 2)
  assert str(out[0]) == ("Client 1 has JDTENSOR_SHARE_GPUS=False but client 0 has "
                         "True; set JDTENSOR_SHARE_GPUS the same on every client.")


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


def start_client(jobs, client, timeout, secret=SECRET):
  """One client's rendezvous on a thread; (thread, [result or error])."""
  out = [None]

  def run():
    try:
      out[0] = rendezvous(hello(jobs, client), jobs[0],
                          ("127.0.0.1", int(jobs[0].rsplit(":", 1)[1])),
                          Deadline(timeout), secret)
    except Exception as e:  # pylint: disable=broad-except
      out[0] = e
  t = threading.Thread(target=run, daemon=True)
  t.start()
  return t, out


@pytest.fixture
def short_stages(monkeypatch):
  """A client 0 silent for 0.6 s is given up; it speaks every 0.15 s."""
  from jdtensor.runtime import host  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(rendezvous_mod, "CLIENT_STAGE_SECONDS", 0.6)
  monkeypatch.setattr(host, "WAITING_SECONDS", 0.15)
  return host


def test_a_client_that_starts_long_after_the_others_still_meets_them(short_stages):
  """Found by hand: a client started more than CLIENT_STAGE_SECONDS (10 s)
  after the others (by hand, a node that boots late, 64 clients on 2 cores)
  failed every client's start-up ("client 0 ... fell silent"), and client 0
  with a bare OSError. Client 0 now says whom it waits for, and a client
  waits for a late one as long as the init timeout allows."""
  del short_stages
  jobs = cluster(3)
  early = [start_client(jobs, c, 10) for c in (0, 1)]
  time.sleep(1.5)  # 2.5 stage time-outs.
  late = start_client(jobs, 2, 10)
  out = []
  for t, result in (*early, late):
    t.join(15)
    out.append(result[0])
  try:
    assert all(isinstance(m, rendezvous_mod.Meeting) for m in out), out
  finally:
    close(out)


def test_a_client_0_that_falls_silent_before_go_is_still_given_up(short_stages,
                                                                  monkeypatch):
  monkeypatch.setattr(short_stages._Server, "_tell_waiting", lambda self: None)
  jobs = cluster(3)
  (t0, _), (t1, out1) = start_client(jobs, 0, 3), start_client(jobs, 1, 10)
  t1.join(5)
  assert isinstance(out1[0], StartupError), out1
  assert not isinstance(out1[0], StartupTimeoutError)
  assert str(out1[0]) == (
      f"Client 1: the process at DTENSOR_JOBS[0]={jobs[0]!r} closed the connection "
      "or fell silent during start-up; it is not a jdtensor client 0 of this "
      "run, or it failed. Check client 0's output.")
  t0.join(5)


def test_every_waiting_client_hears_whom_client_0_timed_out_on(short_stages):
  del short_stages
  jobs = cluster(4)
  (t0, out0), (t1, out1), (t3, out3) = (start_client(jobs, 0, 1.5),
                                        start_client(jobs, 1, 10),
                                        start_client(jobs, 3, 10))
  for t in (t0, t1, t3):
    t.join(5)
  message = (f"Client 0 waited 1.5 s (the init timeout) at the coordinator "
             f"DTENSOR_JOBS[0]={jobs[0]!r} for client(s) 2, which never "
             "connected. Start every client with the same DTENSOR_JOBS and its "
             "own DTENSOR_CLIENT_ID, or raise the init timeout "
             "(JDTENSOR_INIT_TIMEOUT).")
  assert isinstance(out0[0], StartupTimeoutError) and str(out0[0]) == message
  for client, out in ((1, out1), (3, out3)):
    assert isinstance(out[0], StartupTimeoutError), out
    assert str(out[0]) == f"Client {client}: start-up refused by client 0: {message}"


def test_a_client_whose_own_init_timeout_ends_first_says_whom_client_0_awaits(
    short_stages, monkeypatch):
  del short_stages
  monkeypatch.setattr(rendezvous_mod, "CLIENT_STAGE_SECONDS", 5.0)
  jobs = cluster(3)
  (t0, _), (t1, out1) = start_client(jobs, 0, 3), start_client(jobs, 1, 1)
  t1.join(5)
  assert isinstance(out1[0], StartupTimeoutError), out1
  assert str(out1[0]) == (
      f"Client 1 met client 0 at DTENSOR_JOBS[0]={jobs[0]!r}, but the start-up "
      "did not complete within 1 s (the init timeout): client 0 was still "
      "waiting for client(s) 2. Start every client with the same DTENSOR_JOBS "
      "and its own DTENSOR_CLIENT_ID, or raise the init timeout "
      "(JDTENSOR_INIT_TIMEOUT).")
  t0.join(5)


def test_whom_client_0_awaits_is_named_up_to_16_clients_then_counted(
    short_stages, monkeypatch):
  """Client 0 says whom it waits for to every client it has met, every
  WAITING_SECONDS: at pod scale the full list would cost O(N^2) bytes."""
  del short_stages
  monkeypatch.setattr(rendezvous_mod, "CLIENT_STAGE_SECONDS", 5.0)
  jobs = tuple(f"localhost:{p}" for p in free_ports(1)) + tuple(
      f"localhost:{20000 + i}" for i in range(1, 40))
  (t0, out0), (t1, out1) = start_client(jobs, 0, 3), start_client(jobs, 1, 1)
  t1.join(5)
  assert str(out1[0]) == (
      f"Client 1 met client 0 at DTENSOR_JOBS[0]={jobs[0]!r}, but the start-up "
      "did not complete within 1 s (the init timeout): client 0 was still "
      "waiting for client(s) 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17 "
      "and 22 more. Start every client with the same DTENSOR_JOBS "
      "and its own DTENSOR_CLIENT_ID, or raise the init timeout "
      "(JDTENSOR_INIT_TIMEOUT).")
  t0.join(5)
  assert str(out0[0]).startswith(
      f"Client 0 waited 3 s (the init timeout) at the coordinator DTENSOR_JOBS[0]="
      f"{jobs[0]!r} for client(s) 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, "
      "16 and 23 more, which never connected.")


def test_a_client_that_leaves_before_go_may_come_back(short_stages, caplog):
  """The client that gave up above left client 0 holding its closed
  connection: when the last client came, client 0 died of an OSError (bad
  file descriptor). It is now dropped, with a warning, and may connect again
  (a restarted client)."""
  del short_stages
  jobs = cluster(3)
  with caplog.at_level("WARNING", logger="jdtensor"):
    (t0, out0), (t1, out1) = start_client(jobs, 0, 10), start_client(jobs, 1, 0.5)
    t1.join(5)
    assert isinstance(out1[0], StartupTimeoutError), out1
    time.sleep(0.3)  # Client 0 sees it leave.
    again, last = start_client(jobs, 1, 10), start_client(jobs, 2, 10)
    out = []
    for t, result in ((t0, out0), again, last):
      t.join(15)
      out.append(result[0])
  try:
    assert all(isinstance(m, rendezvous_mod.Meeting) for m in out), out
    assert sorted(out[0].links._sockets) == [1, 2]
    assert ("jdtensor: client 0: client 1 left the start-up before every client "
            "arrived (its connection closed); waiting for it to connect again"
            in caplog.text), caplog.text
  finally:
    close(out)


@pytest.mark.parametrize("family", ["", "IPv4", "IPv6"])
def test_the_hello_carries_its_address_family_and_a_wrong_one_is_named(family):
  from jdtensor.runtime.handshake import PeerHello
  sent = hello(("a:1", "b:2"), 1)._replace(family=family).to_frame()
  assert PeerHello.parse(sent).family == family
  frame_without = {k: v for k, v in sent.items() if k != "family"}
  assert PeerHello.parse(frame_without).family == ""  # The field is optional.
  for bad in ("ipv4", "AF_INET", 4, None):
    with pytest.raises(ValueError) as e:
      PeerHello.parse({**sent, "family": bad})
    assert str(e.value) == "field 'family' is not IPv4, IPv6 or empty"


# -- what the clients run (issue #67, item 10) ---------------------------------

OLD_JAX = SOFTWARE._replace(jax="0.11.2", jaxlib="0.11.2")
X64 = SOFTWARE._replace(x64=True)
_WHY = ("so the programs they compile would not match (a collective that never "
        "returns, or wrong data)")
_X64_HOW = "JAX_ENABLE_X64, or jax.config.update before initialize_accelerator_system"
_SEE = "Client 0's output names what each client runs."


def groups_of(clients):
  return handshake.software_groups(enumerate(clients))


@pytest.mark.parametrize("clients,message", [
    ([SOFTWARE] * 3, ""),
    ([SOFTWARE, OLD_JAX],
     f"Clients run different software, {_WHY}: client 0: jax 0.12.1, jaxlib 0.12.1; "
     "client 1: jax 0.11.2, jaxlib 0.11.2. Install the same jax and jaxlib on every "
     "client (client 0 has jax==0.12.1 jaxlib==0.12.1)."),
    ([SOFTWARE, OLD_JAX] + [SOFTWARE] * 298,
     f"Clients run different software, {_WHY}: clients 0, 2-299: jax 0.12.1, jaxlib "
     "0.12.1; client 1: jax 0.11.2, jaxlib 0.11.2. Install the same jax and jaxlib on "
     "every client (client 0 has jax==0.12.1 jaxlib==0.12.1)."),
    ([SOFTWARE, X64] * 1500,
     f"Clients run different software, {_WHY}: clients 0, 2, 4, 6, 8, 10, 12, 14 and "
     "1492 more: jax_enable_x64=False; clients 1, 3, 5, 7, 9, 11, 13, 15 and 1492 "
     "more: jax_enable_x64=True. Set jax_enable_x64 the same on every client (client "
     f"0 has False: {_X64_HOW})."),
    ([SOFTWARE, OLD_JAX, X64, None, SOFTWARE._replace(jdtensor="0.2.0"), X64],
     f"Clients run different software, {_WHY}: client 0: jdtensor 0.1.0, jax 0.12.1, "
     "jaxlib 0.12.1, jax_enable_x64=False; client 1: jdtensor 0.1.0, jax 0.11.2, "
     "jaxlib 0.11.2, jax_enable_x64=False; clients 2, 5: jdtensor 0.1.0, jax 0.12.1, "
     "jaxlib 0.12.1, jax_enable_x64=True; 2 more clients run something else. Install "
     "the same jdtensor, jax and jaxlib on every client (client 0 has jdtensor==0.1.0 "
     "jax==0.12.1 jaxlib==0.12.1); set jax_enable_x64 the same on every client "
     f"(client 0 has False: {_X64_HOW})."),
], ids=["same", "two-jax", "one-of-300", "x64-alternating-3000", "five-kinds"])
def test_what_clients_run_is_compared_by_group_in_one_short_line(clients, message):
  """Client 0's refusal names each group of clients with what differs (ids
  as runs, at most 8 runs and 3 groups shown) and the fix, with client 0's
  versions to install."""
  assert handshake.software_mismatch(groups_of(clients)) == message
  assert len(message) < 700


def test_a_client_without_the_secret_is_told_only_its_own_versions():
  groups = groups_of([SOFTWARE, OLD_JAX, SOFTWARE, OLD_JAX])
  fix = "Install the same jax and jaxlib on every client."
  assert handshake.software_told(groups, OLD_JAX) == (
      f"Clients 1, 3 run jax 0.11.2, jaxlib 0.11.2, unlike client 0, {_WHY}. "
      f"{fix} {_SEE}")
  assert handshake.software_told(groups, SOFTWARE) == (
      f"Clients 1, 3 differ from client 0 in jax and jaxlib, {_WHY}. {fix} {_SEE}")
  groups = groups_of([SOFTWARE, X64])
  assert handshake.software_told(groups, X64) == (
      f"Client 1 runs jax_enable_x64=True, unlike client 0, {_WHY}. Set "
      f"jax_enable_x64 the same on every client ({_X64_HOW}). {_SEE}")


def test_the_hello_carries_what_the_client_runs():
  from jdtensor.runtime.handshake import PeerHello
  sent = hello(("a:1", "b:2"), 1, software=X64).to_frame()
  assert sent["software"] == {"jdtensor": "0.1.0", "jax": "0.12.1",
                              "jaxlib": "0.12.1", "jax_enable_x64": True}
  assert PeerHello.parse(sent).software == X64
  assert PeerHello.parse({k: v for k, v in sent.items() if k != "software"}
                         ).software is None
  for bad in ([], {"jax": "0.12.1"}, {**sent["software"], "jax": "0.12 .1"},
              {**sent["software"], "jax_enable_x64": 1},
              {**sent["software"], "jaxlib": "9" * 65}):
    with pytest.raises(ValueError) as e:
      PeerHello.parse({**sent, "software": bad})
    assert str(e.value) == "field 'software' is malformed"
  # What a process says is always what a peer accepts.
  odd = handshake.Software.of("0.1.0", "0.5.0 (built by hand)", "", 1)
  assert odd == ("0.1.0", "0.5.0__built_by_hand_", "unknown", True)
  assert PeerHello.parse({**sent, "software": odd.to_frame()}).software == odd


@pytest.mark.parametrize("secret", [SECRET, None], ids=["authenticated", "no-secret"])
def test_clients_that_run_different_software_are_all_refused_once_all_have_met(secret):
  """Found by hand (issue #67): client 0 on jax 0.12.1 and client 1 on 0.11.2
  met, started JAX and hung at the first jitted sum, silently. Client 0 now
  waits for every client, then refuses them all at once; client 1's
  settings differ too (another jdtensor reads others), but what it runs is
  the cause named."""
  jobs = cluster(3)
  hellos = [hello(jobs, 0), hello(jobs, 1, software=OLD_JAX,
                                  JDTENSOR_HEARTBEAT_PERIOD=9.0), hello(jobs, 2)]
  start = time.monotonic()
  out = meet(hellos, [secret] * 3)
  assert time.monotonic() - start < 3
  message = (f"Clients run different software, {_WHY}: clients 0, 2: jax 0.12.1, "
             "jaxlib 0.12.1; client 1: jax 0.11.2, jaxlib 0.11.2. Install the same "
             "jax and jaxlib on every client (client 0 has jax==0.12.1 jaxlib==0.12.1).")
  assert all(isinstance(e, StartupError) and not isinstance(e, StartupTimeoutError)
             for e in out), out
  assert str(out[0]) == message
  if secret:
    for c in (1, 2):
      assert str(out[c]) == f"Client {c}: start-up refused by client 0: {message}"
  else:
    fix = "Install the same jax and jaxlib on every client."
    assert str(out[1]) == (
        "Client 1: start-up refused by client 0: Client 1 runs jax 0.11.2, jaxlib "
        f"0.11.2, unlike client 0, {_WHY}. {fix} {_SEE}")
    assert str(out[2]) == (
        "Client 2: start-up refused by client 0: Client 1 differs from client 0 in "
        f"jax and jaxlib, {_WHY}. {fix} {_SEE}")


def test_a_hello_without_software_says_what_this_process_runs(monkeypatch):
  """`startup` builds its hello without `Hello.software`: the rendezvous
  fills in `rendezvous.software()` (stood in for here: no jax in this test)."""
  monkeypatch.setattr(rendezvous_mod, "software", lambda: X64)
  jobs = cluster(2)
  out = meet([hello(jobs, 0), hello(jobs, 1, software=None)], [SECRET] * 2)
  assert str(out[0]).startswith(
      f"Clients run different software, {_WHY}: client 0: jax_enable_x64=False; "
      "client 1: jax_enable_x64=True.")
