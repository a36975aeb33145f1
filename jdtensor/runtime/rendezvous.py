"""Start-up rendezvous on the coordinator port, before JAX is touched.

PURE: standard library only, no jax (but `software`, which reads what this
process runs when a client starts).

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
   ``DTENSOR_JOBS``, job name, device count, heartbeat on or off, the
   settings every client must share, what it runs (`Software`: jdtensor's,
   JAX's and jaxlib's versions, ``jax_enable_x64``) and, for a GPU run, its
   GPUs (two clients on one GPU are refused unless ``JDTENSOR_SHARE_GPUS``
   allows it).
4. Client 0 checks that all hellos agree (what the clients run once all have
   met: every client's is named, grouped), answers ``go``, or the error, to
   everyone, and closes the listener; JAX's coordination service then binds
   the same port. Until then it tells every client that has said hello whom
   it is still waiting for, every `WAITING_SECONDS`: a client waits for a
   late one as long as the init timeout allows (it may start minutes after
   the others), for a client 0 that fell silent only `CLIENT_STAGE_SECONDS`.
   A client that leaves before ``go`` is dropped, and may connect again.

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

import hmac
import os
import select
import socket
import threading
import time
from typing import Any

from jdtensor import _logging as logging
from jdtensor._deadline import Deadline
from jdtensor._wire import MAX_FRAME, Frames, handshake_proof, socket_host, split_host_port
from jdtensor.errors import StartupError, StartupTimeoutError
from jdtensor.runtime.handshake import (CLIENT_STAGE_SECONDS, NONCE_RE, POLL_SECONDS,
                                        PROTOCOL, STAGE_SECONDS, START_EVERY_CLIENT,
                                        Hello, Meeting, Software, clients_text,
                                        bind_address, jobs_digest, retry_delays,
                                        run_id, send)
from jdtensor.runtime.link_messages import SERVICE_UP, ServiceUp
from jdtensor.runtime.links import Links

__all__ = ["Hello", "Meeting", "Software", "software", "bind_address", "rendezvous",
           "wait_for_service", "announce_service", "wait_for_service_notice",
           "SERVICE_UP", "run_id", "jobs_digest", "STAGE_SECONDS"]


class _Refused(Exception):
  """Client 0 asked this client to try again (it was too slow)."""


def _read_frame(sock: socket.socket, frames: Frames, pending: list[dict[str, Any]],
                deadline: float) -> dict[str, Any] | None:
  """The next frame from client 0, or None on end of stream or deadline."""
  while not pending:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      return None
    # poll(), not select(): this client may already hold more than 1024
    # descriptors (a data loader's open files), which select() cannot watch.
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(min(remaining, 1.0) * 1000):
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
               sock: socket.socket, timeout: float, deadline: float) -> int:
  """This client's side on one connection; once client 0 says go, how many
  clients share this client's most shared GPU (`Meeting.gpu_sharers`), or
  raises."""
  mine = run_id(secret)
  frames, pending = Frames(), []
  where = f"DTENSOR_JOBS[0]={coordinator!r}"
  waiting: list[str] = []  # Whom client 0 last said it waits for, as text.

  def frame() -> dict[str, Any]:
    got = _read_frame(sock, frames, pending,
                      min(deadline, time.monotonic() + CLIENT_STAGE_SECONDS))
    if got is None:
      if time.monotonic() >= deadline:
        raise StartupTimeoutError(
            f"Client {me.client_id} met client 0 at {where}, but the start-up "
            f"did not complete within {timeout:g} s (the init timeout)"
            + (f": client 0 was still waiting for client(s) "
               f"{waiting[0]}" if waiting else "")
            + ". " + START_EVERY_CLIENT)
      raise StartupError(
          f"Client {me.client_id}: the process at {where} closed the connection "
          "or fell silent during start-up; it is not a jdtensor client 0 of "
          "this run, or it failed. Check client 0's output.")
    if "error" in got:
      if got["error"] == "too slow; try again":
        raise _Refused()
      error = StartupTimeoutError if got.get("timeout") is True else StartupError
      raise error(f"Client {me.client_id}: start-up refused by client 0: "
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
  if (challenge.get("jdtensor") != PROTOCOL or not isinstance(nonce, str)
      or not NONCE_RE.fullmatch(nonce) or not isinstance(run, str)
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
  # Which client of which DTENSOR_JOBS this is (a digest): a client 0 of
  # the same jobs with another run id then knows the secrets differ.
  send(sock, {"jdtensor": PROTOCOL, "run": mine, "nonce": my_nonce,
               "proof": handshake_proof(secret, "client", nonce, my_nonce, mine),
               "jobs": jobs_digest(me.jobs), "client": me.client_id})
  reply = frame()
  if not hmac.compare_digest(str(reply.get("proof", "")),
                             handshake_proof(secret, "server", my_nonce, nonce)):
    raise StartupError(
        f"Client {me.client_id}: the process at {where} did not prove it knows "
        "JDTENSOR_RUN_SECRET; it is not this run's client 0.")
  send(sock, me.to_frame())
  reply = frame()
  while isinstance(reply.get("waiting"), list):  # Others are still to come.
    more = reply.get("more", 0)
    said = clients_text([c for c in reply["waiting"] if isinstance(c, int)],
                        more if isinstance(more, int) and more > 0 else 0)
    if waiting != ([said] if said else []):
      waiting[:] = [said] if said else []
      if said:
        logging.info("jdtensor client %d: client 0 is waiting for client(s) %s",
                     me.client_id, said)
    reply = frame()
  sharing = reply.get("sharing", 1)
  if reply.get("go") is not True or type(sharing) is not int or sharing < 1:  # pylint: disable=unidiomatic-typecheck
    raise StartupError(f"Client {me.client_id}: client 0 answered the start-up "
                       "handshake with something unexpected.")
  return sharing


def _join(me: Hello, secret: str | None, coordinator: str, timeout: float,
          deadline: float) -> Meeting:
  host, port = split_host_port(coordinator)
  name = socket_host(host)
  delays = retry_delays()
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
      socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
      if e.errno == socket.EAI_AGAIN:  # Name service busy: try again.
        time.sleep(POLL_SECONDS)
        continue
      raise StartupError(
          f"Client {me.client_id}: the host of DTENSOR_JOBS[0]={coordinator!r} "
          f"({host!r}) does not resolve ({e}). Fix DTENSOR_JOBS.") from None
    try:
      sock = socket.create_connection((name, port), timeout=min(remaining, 2.0))
    except OSError:  # Not listening yet: try again soon, then less often.
      time.sleep(min(next(delays), max(remaining, 0)))
      continue
    try:
      sharers = _handshake(me, secret, coordinator, sock, timeout, deadline)
    except _Refused:
      sock.close()
      continue
    except BaseException:
      sock.close()
      raise
    sock.setblocking(True)
    sock.settimeout(None)
    return Meeting(Links(me.client_id, {0: sock}), sharers)


# JAX's service usually listens a few ms after the rendezvous (client 0 is
# inside jax.distributed.initialize): client 0 polls its own service every
# 1 ms for the first half second, then every 5 ms, and tells the others.
SERVICE_FAST_POLL_SECONDS = 0.001
SERVICE_FAST_POLL_WINDOW = 0.5
SERVICE_POLL_SECONDS = 0.005


def wait_for_service(coordinator: str, deadline: Deadline, client_id: int) -> None:
  """Waits until client 0's JAX coordination service accepts connections.

  Connecting before it listens sends JAX's gRPC client into its reconnect
  back-off (about a second). After the rendezvous, client 0's own listener is
  closed, so the first accepted connection is the service's.

  Raises:
    StartupTimeoutError: If it does not come up by `deadline`.
  """
  host, port = split_host_port(coordinator)
  name = socket_host(host)
  started = time.monotonic()
  while not deadline.expired():
    try:
      socket.create_connection((name, port),
                               timeout=min(1.0, max(deadline.remaining(), 0.01))).close()
      return
    except OSError:  # A refused connect costs microseconds: poll fast at first.
      fast = time.monotonic() - started < SERVICE_FAST_POLL_WINDOW
      time.sleep(SERVICE_FAST_POLL_SECONDS if fast else SERVICE_POLL_SECONDS)
  raise _service_timeout(coordinator, client_id)


def _service_timeout(coordinator: str, client_id: int) -> StartupTimeoutError:
  return StartupTimeoutError(
      f"Client {client_id}: client 0 met every client, but its JAX coordination "
      f"service at DTENSOR_JOBS[0]={coordinator!r} did not come up before the "
      "init timeout; check client 0's output.")


def announce_service(coordinator: str, deadline: Deadline, links: Links) -> threading.Thread:
  """Client 0: tells every client on `links` once its JAX service listens.

  Runs on a thread of its own (client 0's main thread is inside
  ``jax.distributed.initialize``, which starts the service and then waits
  for every client). One process polls the service instead of every other
  client: on an oversubscribed machine the others' polls took CPU from
  client 0, the one process they all waited for. If the service
  never comes up, nothing is said: client 0's own start-up fails and its
  process's end reaches the others on the links.
  """
  def watch() -> None:
    try:
      wait_for_service(coordinator, deadline, 0)
    except StartupTimeoutError:
      return
    links.send(ServiceUp().to_frame())
  thread = threading.Thread(target=watch, name="jdtensor-service-watch", daemon=True)
  thread.start()
  return thread


def wait_for_service_notice(listening: threading.Event, coordinator: str,
                            deadline: Deadline, client_id: int) -> None:
  """A client other than 0: waits until client 0 says its JAX service
  listens (`announce_service`; `listening` is set by the links' watcher).

  Raises:
    StartupTimeoutError: If it is not said by `deadline`.
  """
  if not listening.wait(max(deadline.remaining(), 0.0)):
    raise _service_timeout(coordinator, client_id)


def software() -> Software:
  """What this process runs, as client 0 compares it (`Software`).

  Imports jax (the start-up imports it right after the rendezvous): the
  versions of the modules that run, not of whatever is installed.
  """
  import jax  # pylint: disable=g-import-not-at-top

  from jdtensor import __version__  # pylint: disable=g-import-not-at-top
  from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
  return Software.of(__version__, str(jax.__version__), jax_private.JAXLIB_VERSION,
                     bool(jax.config.jax_enable_x64))


def rendezvous(me: Hello, coordinator: str, bind: tuple[str, int],
               deadline: Deadline, secret: str | None = None) -> Meeting:
  """Meets every client at the coordinator port, or raises.

  Args:
    me: This client's view of the cluster (without `Hello.software`, what
      this process runs: `software`).
    coordinator: ``DTENSOR_JOBS[0]``.
    bind: Where client 0 listens (see `bind_address`).
    deadline: The start-up's deadline (the init timeout); this waits only
      for what is left of it.
    secret: The run's ``JDTENSOR_RUN_SECRET``; None runs unauthenticated.

  Returns:
    The liveness links (see `Meeting`).

  Raises:
    StartupError: Port taken, bind address not on this host, another run or
      a wrong secret at the address, inconsistent clusters, duplicate client
      ids, unequal device counts, two clients on one GPU, clients that run
      different software (every client is told, once all have met).
    StartupTimeoutError: A peer never connected (client 0), or the
      coordinator never came up (other clients).
  """
  timeout, at = deadline.seconds, deadline.at
  if me.software is None:
    me = me._replace(software=software())
  if me.client_id == 0:  # Only client 0 hosts: the others never load its server.
    from jdtensor.runtime.host import serve  # pylint: disable=g-import-not-at-top
    return serve(me, secret, bind[0], bind[1], coordinator, timeout, at)
  return _join(me, secret, coordinator, timeout, at)


