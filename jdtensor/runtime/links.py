"""Liveness links: the rendezvous connections, kept open after start-up.

PURE: standard library only.

`jdtensor.runtime.rendezvous` hands them over once every client has met; the
heartbeat (and, during start-up, the runtime) watches them. A process that
ends is seen at once by the others' end of its connection.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from jdtensor._report import Reason
from jdtensor._wire import Frames, encode, encode_binary
from jdtensor.runtime import link_messages as messages
from jdtensor.runtime.link_messages import SERVICE_UP

__all__ = ["Links", "LinkEvents", "LINK_FRAME", "SERVICE_UP"]

_TCP_ESTABLISHED = 1
# The largest message on a link: the peers are authenticated, and the
# largest messages are a stack or a verdict's text.
LINK_FRAME = 16 * 1024 * 1024
# What one read takes from a link.
_RECV_BYTES = 65536
# Client 0, woken for only a few links, waits this long (seconds) before it
# looks again: a beat's rows arrive from every client within milliseconds,
# and taking them a batch at a time rather than one wake-up each keeps
# client 0's beat cheap at thousands of clients. Adds at most this much to
# anything client 0 hears.
_HUB_BATCH_WAIT = 0.002
_HUB_BATCH = 32
# Seconds a send may wait for room in a peer's socket buffer.
_SEND_TIMEOUT = 5.0


def _send_all(sock: socket.socket, data: bytes, timeout: float = _SEND_TIMEOUT) -> None:
  """Sends `data` on a non-blocking socket, waiting up to `timeout` s in all
  for room; a peer that is gone or stops reading is given up on (its end of
  stream, or the heartbeat, tells)."""
  deadline = None
  while data:
    try:
      data = data[sock.send(data):]
      continue
    except BlockingIOError:
      pass
    except OSError:
      return
    if deadline is None:
      deadline = time.monotonic() + timeout
    left = deadline - time.monotonic()
    if left <= 0:
      return
    poller = select.poll()
    try:
      poller.register(sock, select.POLLOUT)
      poller.poll(left * 1000)
    except (OSError, ValueError):
      return


class _Poller:
  """Readable sockets by descriptor: epoll (poll where there is none), never
  select(), which breaks at descriptor 1024 (client 0 holds a link per
  client; a data loader may hold thousands of files). A wake-up costs what
  is ready, not N, and hands back plain descriptors (no per-socket objects
  built for each wake-up, as `selectors` does)."""

  def __init__(self) -> None:
    if hasattr(select, "epoll"):
      self._impl: Any = select.epoll()
      self._unit = 1.0  # epoll takes seconds,
    else:
      self._impl = select.poll()
      self._unit = 1000.0  # poll milliseconds.

  def register(self, fd: int) -> None:
    self._impl.register(fd, select.POLLIN)

  def unregister(self, fd: int) -> None:
    self._impl.unregister(fd)

  def poll(self, timeout: float) -> list[tuple[int, int]]:
    return self._impl.poll(timeout * self._unit)

  def close(self) -> None:
    close = getattr(self._impl, "close", None)
    if close is not None:
      close()


def _peer_open(sock: socket.socket) -> bool:
  """Whether the other end of a connection is still open (Linux TCP_INFO)."""
  try:
    state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
  except OSError:
    return False  # Closed here already.
  return state == _TCP_ESTABLISHED


class LinkEvents(Protocol):
  """What the links tell their watcher (`Links.watch`), on the links' thread.
  The start-up's watcher (`jdtensor.runtime.startup`) and the heartbeat
  (`jdtensor.heartbeat.protocol.Heartbeat`) are the two; a subclass inherits
  these defaults, which do nothing."""

  def peer_died(self, client: int, how: str) -> None:
    """A linked process ended without a goodbye."""

  def peer_reported(self, clients: list[int], reason: Reason) -> None:
    """A client (`reason.reporter`) reports `clients` failed (this client
    included, when it is the one named)."""

  def peer_left(self, client: int, code: int, why: str, failure: bool,
                raised: bool = False) -> None:
    """A client announces it is leaving, with its exit code and reason."""

  def peer_notice(self, client: int, text: str) -> None:
    """Something the others should know."""

  def service_up(self) -> None:
    """Client 0's JAX coordination service listens (said once, during
    start-up)."""


class _Unwatched(LinkEvents):
  """No watcher: every event is ignored."""


class Links:
  """The rendezvous connections, kept open to notice a dead process at once.

  A star: client 0 holds one connection per client, every other client one to
  client 0, which relays every message to the others. A process that exits
  normally says ``bye`` first; an end of stream without it means the process
  died. Failure reports (`report`), departures (`announce_departure`) and
  notices (`notice`) reach every client within milliseconds (JAX's own
  detection takes its heartbeat time-out, or aborts the survivors with a C++
  fatal log when client 0 dies).

  Events go to a `LinkEvents` (`watch`), called from a daemon thread; the
  messages are `jdtensor.runtime.link_messages`'.

  Messages with an ``hb`` key, and every binary frame (a beat's row or
  outcome, `jdtensor._wire.encode_binary`), are the heartbeat's exchange
  (`carry`): they go to its handler, on the same thread, and are never
  relayed.
  """

  def __init__(self, client_id: int, sockets: dict[int, socket.socket]):
    self.client_id = client_id
    self._sockets = dict(sockets)
    for sock in self._sockets.values():
      # Non-blocking: one system call a message where it fits the socket's
      # buffer, as a beat always does (a socket with a time-out polls before
      # every send and recv); `_send_all` bounds a send to a peer that stops
      # reading.
      sock.setblocking(False)
    self._closing = False
    self._said_bye: set[int] = set()
    self._reported: set[int] = set()  # Client 0: the clients reports named.
    # Whose processes this client knows to have ended: client 0 sees every
    # link close and tells the others of each culprit's (a client a report
    # named, or one that left with a failure), once; a survivor leaving
    # after it lets the engine that started the run see the culprit's exit
    # first (`wait_ended`).
    self._ended: set[int] = set()
    self._culprits: set[int] = set()  # Client 0: named or left failing.
    self._told_ended: set[int] = set()  # Client 0: "ended" sent for these.
    self._lock = threading.Lock()
    self._ended_changed = threading.Condition(self._lock)
    self._handler: LinkEvents = _Unwatched()
    self._thread: threading.Thread | None = None
    # One sender at a time on every connection: a message is never split by
    # another thread's.
    self._send_lock = threading.Lock()
    self._carrier: Callable[[int, dict[str, object] | bytes], None] | None = None
    self._carried: list[tuple[int, dict[str, object] | bytes]] = []  # Before `carry`.
    # A child forked from this process (a data loader's worker) must not keep
    # the links open: a link that outlives this process's death hides it
    # from every other client. The child closes its copies at once; this
    # process's stay open (the connection ends when the last copy closes).
    close = weakref.WeakMethod(self._close_in_forked_child)
    os.register_at_fork(after_in_child=lambda: (close() or (lambda: None))())

  def _close_in_forked_child(self) -> None:
    """In a forked child: closes its copies of the links' sockets (never a
    goodbye: the links are still the parent's)."""
    for sock in list(self._sockets.values()):
      try:
        os.close(sock.detach())
      except OSError:
        pass
    self._sockets.clear()
    self._closing = True

  def descriptors(self) -> list[int]:
    """The file descriptors of the links' sockets (jdtensor's own traffic)."""
    return [sock.fileno() for sock in list(self._sockets.values())]

  def carry(self, handler: Callable[[int, dict[str, object] | bytes], None]) -> None:
    """Hands every exchange message (an ``hb`` key) to `handler(client,
    message)` on the watching thread, those already received first."""
    with self._lock:
      early, self._carried = self._carried, []
      self._carrier = handler
    for client, message in early:
      handler(client, message)

  def watch(self, handler: LinkEvents | None) -> None:
    """Routes events to `handler` (None ignores them); starts watching."""
    with self._lock:
      self._handler = handler if handler is not None else _Unwatched()
      if self._thread is None:
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="jdtensor-liveness")
        self._thread.start()

  def _watch(self) -> None:
    frames = {client: Frames(lenient=True, limit=LINK_FRAME, binary=True)
              for client in self._sockets}
    poller = _Poller()
    by_fd: dict[int, tuple[int, socket.socket]] = {}
    with self._lock:
      for client, sock in self._sockets.items():
        try:
          poller.register(sock.fileno())
        except (OSError, ValueError):
          continue  # Closed here already: this process is ending its links.
        by_fd[sock.fileno()] = (client, sock)
    if not by_fd:
      poller.close()
      return
    hub = len(self._sockets) > 1
    try:
      while self._sockets and not self._closing:
        try:
          ready = poller.poll(5.0)
          if hub and len(ready) < _HUB_BATCH:
            time.sleep(_HUB_BATCH_WAIT)
            ready = poller.poll(0)
        except (OSError, ValueError):
          return  # Closed under us: we are exiting.
        for fd, _ in ready:
          entry = by_fd.get(fd)
          if entry is None:
            continue
          client, sock = entry
          try:
            chunk = sock.recv(_RECV_BYTES)
          except BlockingIOError:
            continue  # Nothing after all (the socket is non-blocking).
          except OSError:
            chunk = b""
          if not chunk:
            del by_fd[fd]
            try:
              poller.unregister(fd)
            except (OSError, ValueError, KeyError):
              pass
            self._drop(client)
            self._mark_ended(client)
            if not self._closing and client not in self._said_bye:
              self._handler.peer_died(client,
                                      "its process ended without saying goodbye"
                                      if client != 0 else "the coordinator's process ended")
            continue
          carrier = self._carrier
          if (chunk[0] == 0 and len(chunk) == 2 + chunk[1] and carrier is not None
              and not self._closing and frames[client].empty):
            # The beat's common case, a whole binary frame alone: straight to
            # the exchange (client 0 takes N of them a beat).
            carrier(client, chunk[2:])
            continue
          for message in frames[client].feed(chunk):
            self._dispatch(client, message)
    finally:
      poller.close()

  def _dispatch(self, client: int, frame: dict[str, object] | bytes) -> None:
    if isinstance(frame, bytes) or "hb" in frame:
      if self._closing:
        return
      with self._lock:
        carrier = self._carrier
        if carrier is None:
          self._carried.append((client, frame))
      if carrier is not None:
        carrier(client, frame)
      return
    try:
      message = messages.read(frame, client)
    except (KeyError, TypeError, ValueError):
      return  # A malformed message from a peer is dropped.
    if isinstance(message, messages.Bye):  # Its end of stream is now a normal exit.
      self._said_bye.add(client)
      return
    if self._closing:
      return
    handler = self._handler
    if isinstance(message, messages.ServiceUp):  # Client 0's own word; never relayed.
      if client == 0:
        handler.service_up()
      return
    if isinstance(message, messages.Ended):  # Client 0's own word; never relayed.
      if client == 0:
        self._mark_ended(message.client)
      return
    # The hub relays to everyone else, as it came; not a normal departure,
    # which only client 0 needs, nor a report naming only clients already
    # reported (when one client fails, N clients may each report it:
    # relaying every report would cost client 0 N^2 messages).
    if self.client_id == 0 and self._relayed(message):
      self._send(frame, skip={client})
    if isinstance(message, messages.Failed):
      handler.peer_reported(list(message.clients), message.reason)
    elif isinstance(message, messages.Left):
      handler.peer_left(message.client, message.code, message.why, message.failure,
                        message.raised)
    elif isinstance(message, messages.Notice):
      handler.peer_notice(message.by, message.text)

  def _relayed(self, message: messages.LinkMessage | None) -> bool:
    """Client 0: whether `message` goes on to every other client."""
    if isinstance(message, messages.Left):
      if message.failure:
        self._mark_culprits([message.client])
      return message.failure
    if isinstance(message, messages.Failed):
      named = set(message.clients)
      with self._lock:
        new = not named <= self._reported
        self._reported |= named
      self._mark_culprits(named)
      return new
    return True

  def _mark_ended(self, client: int) -> None:
    """`client`'s process has ended (its link closed here, or client 0 says
    so); client 0 tells the others if it is a culprit."""
    with self._lock:
      self._ended.add(client)
      self._ended_changed.notify_all()
    if self.client_id == 0:
      self._tell_ended()

  def _mark_culprits(self, clients: Collection[int]) -> None:
    """Client 0: `clients` were named (or left failing)."""
    if self.client_id != 0:
      return
    with self._lock:
      self._culprits.update(clients)
    self._tell_ended()

  def _tell_ended(self) -> None:
    """Client 0: tells every other client, once each, of each culprit whose
    process has ended (only culprits: every survivor's end, told to every
    client, would cost N^2 messages)."""
    with self._lock:
      news = sorted((self._culprits & self._ended) - self._told_ended)
      self._told_ended.update(news)
    for client in news:
      self._send(messages.Ended(client).to_frame())

  def wait_ended(self, clients: Collection[int], timeout: float) -> bool:
    """Waits up to `timeout` s until the processes of `clients` have ended,
    as client 0 sees their links close; whether they all have. Client 0
    tells only of culprits' ends (a client a report named, or one that left
    with a failure)."""
    deadline = time.monotonic() + timeout
    with self._lock:
      while not set(clients) <= self._ended:
        left = deadline - time.monotonic()
        if left <= 0:
          return False
        self._ended_changed.wait(left)
      return True

  def _drop(self, client: int) -> None:
    with self._lock:
      sock = self._sockets.pop(client, None)
    if sock is not None:
      sock.close()

  def _send(self, message: dict[str, object] | bytes,
            skip: Collection[int] = frozenset(), only: int | None = None) -> None:
    with self._lock:
      if only is not None:
        sock = self._sockets.get(only)
        targets = [sock] if sock is not None and only not in skip else []
      else:
        targets = [s for c, s in self._sockets.items() if c not in skip]
    line = encode_binary(message) if isinstance(message, bytes) else encode(message)
    with self._send_lock:
      for sock in targets:
        _send_all(sock, line)

  def send(self, message: dict[str, object] | bytes, to: int | None = None,
           skip: Collection[int] = ()) -> None:
    """Sends `message` (a JSON object, or a binary frame's payload) to client
    `to` (None: every linked client but `skip`); a client that is gone is
    skipped (its end of stream tells)."""
    self._send(message, skip=skip, only=to)

  def report(self, clients: Sequence[int], reason: Reason) -> None:
    """Tells every other client which clients failed and why (this client
    is the reporter).

    Sent before this process's connections close, so every client learns the
    culprit rather than blaming this process's exit; the culprits hear it
    too, so that a client that was frozen names itself when it wakes.
    """
    if self.client_id == 0:
      with self._lock:
        self._reported.update(int(c) for c in clients)
      self._mark_culprits([int(c) for c in clients])
    self._send(messages.Failed(tuple(int(c) for c in clients), reason.detail,
                               tuple(int(c) for c in reason.subject),
                               self.client_id).to_frame())

  def announce_departure(self, code: int, why: str, failure: bool,
                         raised: bool = False) -> None:
    """Tells every other client that this one is leaving with a `failure`
    (`raised`: an exception), and why; a normal departure reaches client 0
    only."""
    self._send(messages.Left(self.client_id, int(code), why, bool(failure),
                             bool(raised)).to_frame())

  def notice(self, text: str) -> None:
    """Tells every other client something worth logging."""
    self._send(messages.Notice(text, self.client_id).to_frame())

  def wait_peers_gone(self, timeout: float, ignore: Sequence[int] = ()) -> None:
    """Waits up to `timeout` s until every linked process (but `ignore`) ended.

    Safe from any thread, the watching one included: it reads each
    connection's TCP state (the peer's end closes when its process ends),
    not its stream, so no message is consumed or needed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      with self._lock:
        sockets = [s for c, s in self._sockets.items() if c not in ignore]
      if not any(_peer_open(sock) for sock in sockets):
        return
      time.sleep(0.02)

  def goodbye(self) -> None:
    """Tells the others this process is exiting normally.

    The connections stay open until the process ends, so that client 0,
    which hosts the coordination services, can wait for every other
    process to be really gone before it exits.
    """
    self._closing = True
    self._send(messages.Bye().to_frame())
