"""The heartbeat's production exchange: sums of rows on the private runtime.

A beat runs no XLA program: it sums one row per client through a private
coordination service that JAX's backend registry never sees
(`jdtensor.runtime.jax_private.PrivateRuntime`, on a port client 0 reserved at
start-up), so the user's JAX sees exactly what raw ``jax.distributed`` shows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from jdtensor.errors import NotInitializedError
from jdtensor.heartbeat.interfaces import Exchange
from jdtensor.heartbeat.protocol import BeatLayout

__all__ = ["PrivateExchange", "bounded"]

_KV_PREFIX = "jdtensor/heartbeat/"


class PrivateExchange(Exchange):
  """The production exchange: a sum of rows on the private runtime.

  `open` (on the heartbeat thread) starts the runtime. A beat costs one
  all-reduce and nothing else; only an overdue beat holds a roll call in the
  runtime's key-value store. A client's start marker goes to the user's
  coordination service (the private one connects only once every client has
  started), so that a client that never starts the heartbeat can be named.

  Args:
    client_id, num_clients: This client and the cluster size.
    service: (host, port, reserved socket) from `runtime.heartbeat_service`.
    shutdown_timeout: Seconds the collective teardown may wait.
  """

  def __init__(self, client_id: int, num_clients: int,
               service: tuple[str, int, Any], shutdown_timeout: float):
    self.client_id, self.num_clients = client_id, num_clients
    self.width = BeatLayout(num_clients).width
    self._service = service
    self.close_timeout = shutdown_timeout
    self.runtime: Any = None

  def open(self) -> None:
    """Starts (client 0) or joins the private coordination service."""
    from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
    host, port, reserved = self._service
    # No time-out of its own: jdtensor's watchdog bounds the first exchange,
    # and the private runtime's time-outs abort the process from C++.
    self.runtime = jax_private.PrivateRuntime(
        self.client_id, self.num_clients, host, port, self.width,
        connect_timeout=24 * 3600, service_socket=reserved,
        shutdown_timeout=self.close_timeout)

  def all_reduce(self, row: np.ndarray) -> np.ndarray:
    """The sum of every client's row: one beat."""
    return self.runtime.all_reduce(row)

  def _store(self, private: bool) -> Any:
    if private:
      return self.runtime.client
    from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
    client = jax_private.coordination_client()
    if client is None:
      raise NotInitializedError("No multi-client runtime: call "
                                "initialize_accelerator_system() first.")
    return client

  def roll_call(self, beat: int, grace: float) -> set[int] | None:
    """Says "this client is in `beat`"; who else said so within `grace` s.

    Beat 0 (the start) goes to the user's coordination service: the private
    one is not connected until every client has started.
    """
    private = beat > 0 and self.runtime is not None
    store = self._store(private)
    prefix = f"{_KV_PREFIX}{'beat/' + str(beat) if private else 'started'}/"
    # Each call on a helper thread: a dead coordinator cannot block us.
    if bounded(lambda: store.key_value_set(f"{prefix}{self.client_id}", "1",
                                            allow_overwrite=True) or True,
                timeout=1.0) is None:
      return None
    deadline = time.monotonic() + grace
    while True:
      entries = bounded(lambda: dict(store.key_value_dir_get(prefix)),
                         timeout=1.0)
      if entries is None:
        return None
      present = {int(key.rsplit("/", 1)[-1]) for key in entries}
      if len(present) >= self.num_clients or time.monotonic() >= deadline:
        return present
      time.sleep(0.05)

  def share(self, key: str, value: str) -> None:
    """Publishes `value` under `key` for every client (private store)."""
    if self.runtime is not None:
      bounded(lambda: self.runtime.client.key_value_set(
          f"{_KV_PREFIX}{key}", value, allow_overwrite=True) or True, timeout=1.0)

  def fetch(self, key: str, timeout: float) -> str | None:
    """What some client published under `key`, waiting up to `timeout` s."""
    if self.runtime is None:
      return None
    return bounded(lambda: self.runtime.client.blocking_key_value_get(
        f"{_KV_PREFIX}{key}", max(1, int(timeout * 1000))), timeout=timeout + 1)

  def joined_collective(self) -> bool:
    """Whether this client has joined a collective of the user's yet (its
    set-up is over). On CPU, read from the gloo communicators the user's
    backend has set up; elsewhere (or unreadable), assumed."""
    import jax  # pylint: disable=g-import-not-at-top
    from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
    devices = jax.local_devices()
    if not devices or devices[0].platform != "cpu":
      return True
    # On a helper thread: a stopped client 0 cannot block the beat thread.
    joined = bounded(lambda: jax_private.joined_gloo_collective(
        {d.id for d in devices}), timeout=1.0)
    return True if joined is None else joined

  def close(self, timeout: float) -> bool:
    """Tears the private runtime down; False if it did not end in time."""
    return self.runtime.close(timeout) if self.runtime is not None else True


def bounded(fn: Callable[[], Any], timeout: float) -> Any:
  """`fn()` on a helper thread; None if it fails or takes over `timeout` s."""
  out: list[Any] = []

  def call() -> None:
    try:
      out.append(fn())
    except Exception:  # pylint: disable=broad-except
      pass
  thread = threading.Thread(target=call, daemon=True, name="jdtensor-kv")
  thread.start()
  thread.join(timeout)
  return out[0] if out else None
