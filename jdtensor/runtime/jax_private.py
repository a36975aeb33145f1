"""Every private JAX and jaxlib API jdtensor uses, in one module.

JAX's public API has no way to (a) read the coordination-service client that
``jax.distributed.initialize`` created, (b) make gloo listen on a given host,
(c) tell whether a backend has started without starting one, or (d) run a
collective on a runtime that JAX's backend registry never sees. jdtensor needs
all four, so they live here, behind small functions, and nowhere else.

Tested range: jax and jaxlib `TESTED_RANGE` (``pyproject.toml`` pins the
same; CI runs the suite on the oldest and the newest). On a JAX upgrade, run
the multi-process tests (CONTRIBUTING.md, "Testing a new JAX").

Importing this module imports jax; only runtime code imports it, lazily.
Each symbol is looked up once, here, at import. What is missing is listed in
`MISSING`; the functions that need it raise `PrivateApiUnavailable`, and the
heartbeat then runs on the liveness links alone (see `jdtensor.heartbeat`).

The private heartbeat runtime (`PrivateRuntime`): a second coordination
service (hosted by client 0 on a port it reserved during the start-up
handshake) and a second distributed client, through which each beat sums one
row per client (key-value store and barrier; no XLA program, so nothing that
``jax.thread_guard`` or JAX's device checks can see). JAX's backend registry
never sees any of it, so ``jax.devices()`` and everything built on it are
exactly what raw ``jax.distributed`` shows. It must be separate from the
user's service: a beat's keys and barriers must never meet the user's.

jaxlib texts relied on are listed here too: `_jaxlib_texts.GLOO_KEY_PREFIX`.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from typing import Any

import jax
import numpy as np

from jdtensor import _jaxlib_texts
from jdtensor._jaxlib_texts import PROBES as TEXT_PROBES
from jdtensor._wire import format_host_port, socket_host

__all__ = [
    "MISSING",
    "JAXLIB_VERSION",
    "PrivateApiUnavailable",
    "unavailable_reason",
    "backends_initialized",
    "coordination_client",
    "bind_cpu_collectives",
    "detach_from_jax_shutdown",
    "keep_alive",
    "PrivateRuntime",
    "TEXTS",
    "TEXT_PROBES",
]

try:
  import jaxlib
  JAXLIB_VERSION = str(getattr(jaxlib, "__version__", "unknown"))
except ImportError:  # pragma: no cover - jax cannot run without jaxlib.
  JAXLIB_VERSION = "unknown"


def _resolve(path: str) -> Any:
  """``'jax._src.lib._jax.Client.compile_and_load'`` -> the object, or None."""
  module_name, *attrs = path.split(":")
  try:
    obj: Any = __import__(module_name, fromlist=["_"])
  except ImportError:
    return None
  for attr in attrs[0].split(".") if attrs else ():
    obj = getattr(obj, attr, None)
    if obj is None:
      return None
  return obj


# What each feature needs, as "module:attribute.path".
_USER_RUNTIME = {
    "backends_are_initialized": "jax._src.xla_bridge:backends_are_initialized",
    "distributed_state": "jax._src.distributed:global_state",
    "register_backend_factory": "jax._src.xla_bridge:register_backend_factory",
    "make_cpu_client": "jax._src.xla_bridge:make_cpu_client",
    "make_gloo_tcp_collectives": "jax._src.lib:_jax.make_gloo_tcp_collectives",
}
_HEARTBEAT_RUNTIME = {
    "get_distributed_runtime_service":
        "jax._src.lib:_jax.get_distributed_runtime_service",
    "get_distributed_runtime_client":
        "jax._src.lib:_jax.get_distributed_runtime_client",
    "key_value_set_bytes":
        "jax._src.lib:_jax.DistributedRuntimeClient.key_value_set_bytes",
    "key_value_dir_get_bytes":
        "jax._src.lib:_jax.DistributedRuntimeClient.key_value_dir_get_bytes",
    "wait_at_barrier": "jax._src.lib:_jax.DistributedRuntimeClient.wait_at_barrier",
}

_FOUND = {name: _resolve(path)
          for name, path in {**_USER_RUNTIME, **_HEARTBEAT_RUNTIME}.items()}
# The private symbols this jaxlib lacks, as "module:attribute" paths.
MISSING: tuple[str, ...] = tuple(sorted(
    {path for name, path in {**_USER_RUNTIME, **_HEARTBEAT_RUNTIME}.items()
     if _FOUND[name] is None}))


# The jaxlib texts jdtensor relies on, by name (see `jdtensor._jaxlib_texts`).
TEXTS = {name: _jaxlib_texts.text(name) for name in _jaxlib_texts.__all__
         if name != "PROBES"}

# The jax/jaxlib versions the whole suite passes on (pyproject.toml's pin).
TESTED_RANGE = ">=0.9.2,<0.11"


class PrivateApiUnavailable(RuntimeError):
  """This jax/jaxlib lacks a private symbol jdtensor needs for a feature."""


def _need(names: dict[str, str], what: str) -> None:
  gone = [path for name, path in names.items() if _FOUND[name] is None]
  if gone:
    raise PrivateApiUnavailable(
        f"{what} needs {', '.join(gone)}, which jax {jax.__version__} / jaxlib "
        f"{JAXLIB_VERSION} does not have (jdtensor is tested with jax and "
        f"jaxlib {TESTED_RANGE}).")


def unavailable_reason() -> str | None:
  """Why the private heartbeat runtime cannot run here, or None if it can."""
  try:
    _need(_HEARTBEAT_RUNTIME, "The heartbeat's private runtime")
  except PrivateApiUnavailable as e:
    return str(e)
  return None


# -- the user's JAX runtime ------------------------------------------------------------


def backends_initialized() -> bool:
  """Whether a JAX backend exists in this process. Never starts one."""
  probe = _FOUND["backends_are_initialized"]
  if probe is None:
    # Without the probe, assume the worst only once jax has been used.
    return bool(getattr(sys.modules.get("jax._src.xla_bridge"), "_backends", None))
  return bool(probe())


def coordination_client() -> Any | None:
  """The coordination-service client of ``jax.distributed``, or None."""
  _need({"distributed_state": _USER_RUNTIME["distributed_state"]},
        "Barriers and the key-value store")
  return _FOUND["distributed_state"].client


def bind_cpu_collectives(host: str) -> None:
  """Makes the user's CPU backend's gloo collectives listen on `host`.

  JAX builds them with the machine's hostname, which may resolve to an
  address other hosts cannot reach. Must run before the backend starts.
  """
  _need({k: _USER_RUNTIME[k] for k in ("distributed_state",
                                       "register_backend_factory",
                                       "make_cpu_client",
                                       "make_gloo_tcp_collectives")},
        "Binding gloo to the DTENSOR_JOBS host")
  state = _FOUND["distributed_state"]
  make_gloo = _FOUND["make_gloo_tcp_collectives"]
  make_cpu = _FOUND["make_cpu_client"]

  def make_cpu_client() -> Any:
    return make_cpu(collectives=make_gloo(distributed_client=state.client,
                                          hostname=host))
  _FOUND["register_backend_factory"]("cpu", make_cpu_client, priority=0,
                                     fail_quietly=False)


_KEPT_ALIVE: list[Any] = []


def keep_alive(*objects: Any) -> None:
  """Never destroys `objects` (their C++ destructors may wait for peers that
  are gone); the process's exit closes their connections."""
  import ctypes  # pylint: disable=g-import-not-at-top
  for obj in objects:
    if obj is not None:
      _KEPT_ALIVE.append(obj)
      ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def detach_from_jax_shutdown() -> None:
  """Keeps JAX's exit handler away from its shutdown barrier.

  At exit, JAX shuts ``jax.distributed`` down with a barrier over every
  client; when a client has failed or left, that barrier waits out the
  shutdown time-out and then aborts the process from C++ (losing its exit
  code). This hands JAX's exit handler nothing to shut down. The client and
  service objects are kept referenced for the life of the process, so their
  C++ destructors (which would run the same barrier) never run either; the
  process's exit closes their connections.
  """
  state = _FOUND["distributed_state"]
  if state is None:
    return
  for name in ("preemption_sync_manager", "client", "service"):
    keep_alive(getattr(state, name, None))
    setattr(state, name, None)


# -- the heartbeat's private runtime ---------------------------------------------------




def joined_gloo_collective(local_device_ids: set[int]) -> bool | None:
  """Whether one of `local_device_ids` has joined a gloo communicator of the
  user's CPU backend (a collective has started here); None when that cannot
  be read (no coordination client, or the keys are not there in this form)."""
  client = coordination_client()
  if client is None:
    return None
  try:
    entries = client.key_value_dir_get_bytes(_jaxlib_texts.GLOO_KEY_PREFIX)
  except Exception:  # pylint: disable=broad-except
    return None
  for key, _ in entries:
    devices, _, rank = key[len(_jaxlib_texts.GLOO_KEY_PREFIX):].rpartition("/")
    try:
      ids = [int(d) for d in devices.split(",")]
      if ids[int(rank)] in local_device_ids:
        return True
    except (ValueError, IndexError):
      continue
  return False


# How long a client waits for client 0's private service to listen before it
# connects anyway (then gRPC's own retries take over).
_LISTEN_WAIT = 60.0


def _wait_until_listening(host: str, port: int, limit: float) -> bool:
  """Waits until `host:port` accepts TCP connections (at most `limit` s).

  A gRPC client that connects before its server listens backs off a whole
  second before it tries again (gRPC's initial reconnect backoff): at start-up
  every client but 0 usually does, since client 0 starts the service on the
  heartbeat's thread at about the time they connect. Probing first costs a
  few milliseconds and saves that second. The reserved port refuses
  connections until the service listens (`rendezvous.reserve_port`).
  """
  deadline = time.monotonic() + limit
  name = socket_host(host)
  while True:
    try:
      socket.create_connection((name, port), timeout=1.0).close()
      return True
    except OSError:
      if time.monotonic() >= deadline:
        return False
      time.sleep(0.005)


class PrivateRuntime:
  """A runtime JAX never sees: its own coordination service and client.

  A beat sums one int32 row per client through that service: each client
  writes its row under the beat's key, waits at the beat's barrier, and reads
  every row back, so every client gets the same sum (an all-reduce). No XLA
  program runs: nothing a JAX check of threads or devices can see
  (``jax.thread_guard`` forbids multi-process XLA programs off its thread),
  and nothing to compile at start-up.

  Every client builds one, collectively (the client's connect waits for
  every process).

  Args:
    client_id: This process's id.
    num_clients: Number of processes.
    service_host: Host of client 0, where the service runs.
    service_port: The service's port (client 0 reserved it during the
      start-up handshake and told every client; see
      `jdtensor.runtime.rendezvous.reserve_port`).
    width: Length of the int32 vector each exchange sums.
    connect_timeout: Seconds to wait for every process to connect. When it
      expires, jaxlib aborts the process: pass a bound only the caller's own
      watchdog can never reach first.
    service_socket: Client 0 only: the reserved socket, closed once the
      service has bound the port.
    shutdown_timeout: Seconds the teardown's shutdown barrier may wait.
  """

  # A beat's barrier waits this long at most; jdtensor's watchdog names a
  # client that does not join long before (JAX would abort on expiry).
  _BEAT_WAIT_MS = 24 * 3600 * 1000

  def __init__(self, client_id: int, num_clients: int, service_host: str,
               service_port: int, width: int, connect_timeout: float,
               service_socket: socket.socket | None = None,
               shutdown_timeout: float = 60.0):
    _need(_HEARTBEAT_RUNTIME, "The heartbeat's private runtime")
    f = _FOUND
    self.client_id, self.num_clients, self.width = client_id, num_clients, width
    self._lock = threading.Lock()
    self._closed = False
    self._beat = 0
    self.service = None
    # The service's own liveness checks are switched off (a day): their
    # failure path aborts the process from C++ (a Python callback crashes in
    # jaxlib 0.10.2). jdtensor's watchdog and liveness links detect failures.
    never = 24 * 3600
    shutdown = max(1, int(shutdown_timeout))
    if client_id == 0:
      bind_host = service_socket.getsockname()[0] if service_socket else service_host
      self.service = f["get_distributed_runtime_service"](
          format_host_port(bind_host, service_port), num_clients,
          heartbeat_timeout=never, cluster_register_timeout=max(
              1, int(connect_timeout)), shutdown_timeout=shutdown)
      if service_socket is not None:
        service_socket.close()
    else:
      _wait_until_listening(service_host, service_port, _LISTEN_WAIT)
    self.client = f["get_distributed_runtime_client"](
        format_host_port(service_host, service_port), client_id,
        init_timeout=max(1, int(connect_timeout)), heartbeat_timeout=never,
        shutdown_timeout=shutdown, shutdown_on_destruction=False)
    self.client.connect()

  def all_reduce(self, row: np.ndarray) -> np.ndarray:
    """Sums `row` (int32[width]) across every client; blocks until done."""
    # Two slots, used in turn: every client has read slot b's rows before it
    # arrives at beat b + 1's barrier, so beat b + 2 may overwrite them, and
    # the service holds two barriers and 2 x clients keys, however long the run.
    beat = self._beat
    self._beat += 1
    slot = f"jdtensor/beat/{beat % 2}"
    values = np.ascontiguousarray(row, np.int32)
    self.client.key_value_set_bytes(f"{slot}/{self.client_id}", values.tobytes(),
                                    allow_overwrite=True)
    self.client.wait_at_barrier(slot, self._BEAT_WAIT_MS)
    entries = self.client.key_value_dir_get_bytes(f"{slot}/")
    if len(entries) != self.num_clients:
      raise RuntimeError(f"beat {beat}: {len(entries)} rows for "
                         f"{self.num_clients} clients")
    total = np.zeros(self.width, np.int64)
    for _, value in entries:
      total += np.frombuffer(value, np.int32)
    return total.astype(np.int32)

  def close(self, barrier_timeout: float) -> bool:
    """Collective teardown after an agreed stop; True if every step ran.

    A barrier first (nobody disconnects while a peer still reads), then the
    client's shutdown (itself a barrier), then the service.
    """
    with self._lock:
      if self._closed:
        return True
      self._closed = True
    try:
      self.client.wait_at_barrier("jdtensor_heartbeat_final",
                                  max(1, int(barrier_timeout * 1000)))
    except Exception:  # pylint: disable=broad-except
      return False  # A peer is gone: leave the rest to process exit.
    try:
      self.client.shutdown()
      if self.service is not None:
        self.service.shutdown()
    except Exception:  # pylint: disable=broad-except
      return False
    return True
