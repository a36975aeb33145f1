"""Every private JAX and jaxlib API jdtensor uses, in one module.

JAX's public API has no way to (a) read the coordination-service client that
``jax.distributed.initialize`` created, (b) make gloo listen on a given host,
(c) tell whether a backend has started without starting one, or (d) run a
collective on a runtime that JAX's backend registry never sees. jdtensor needs
all four, so they live here, behind small functions, and nowhere else.

Tested range: jax and jaxlib ``>=0.10.2,<0.11`` (``pyproject.toml``). On a
JAX upgrade, run the multi-process tests (README, "Testing a new JAX").

Importing this module imports jax; only runtime code imports it, lazily.
Each symbol is looked up once, here, at import. What is missing is listed in
`MISSING`; the functions that need it raise `PrivateApiUnavailable`, and the
heartbeat then runs on the liveness links alone (see `jdtensor.heartbeat`).

The private heartbeat runtime (`PrivateRuntime`): a second coordination
service (hosted by client 0 on a port it reserved during the start-up
handshake), a second distributed client, a second CPU PjRt client with one
device per process and gloo collectives, and a hand-written StableHLO
``all_reduce`` compiled on it. JAX's backend registry never sees any of it,
so ``jax.devices()`` and everything built on it are exactly what raw
``jax.distributed`` shows. It must be separate: the CPU client writes fixed
key-value keys (``cpu:local_topology/...``) and gloo keys its communicators
by device ids, so sharing the user's service or backend would collide.
"""

from __future__ import annotations

import socket
import sys
import threading
from typing import Any

import jax
import numpy as np

from jdtensor._rendezvous import format_host_port

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
    "make_gloo_tcp_collectives": "jax._src.lib:_jax.make_gloo_tcp_collectives",
    "get_tfrt_cpu_client": "jax._src.lib:_jax.get_tfrt_cpu_client",
    "CompileOptions": "jax._src.lib:_jax.CompileOptions",
    "DeviceAssignment": "jax._src.lib:_jax.DeviceAssignment",
    "DeviceList": "jax._src.lib:_jax.DeviceList",
    "compile_and_load": "jax._src.lib:_jax.Client.compile_and_load",
    "execute_sharded": "jax._src.lib:_jax.LoadedExecutable.execute_sharded",
    "batched_device_put": "jax._src.lib:_jax.batched_device_put",
    "ShapedArray": "jax._src.core:ShapedArray",
}

_FOUND = {name: _resolve(path)
          for name, path in {**_USER_RUNTIME, **_HEARTBEAT_RUNTIME}.items()}
# The private symbols this jaxlib lacks, as "module:attribute" paths.
MISSING: tuple[str, ...] = tuple(sorted(
    {path for name, path in {**_USER_RUNTIME, **_HEARTBEAT_RUNTIME}.items()
     if _FOUND[name] is None}))


class PrivateApiUnavailable(RuntimeError):
  """This jax/jaxlib lacks a private symbol jdtensor needs for a feature."""


def _need(names: dict[str, str], what: str) -> None:
  gone = [path for name, path in names.items() if _FOUND[name] is None]
  if gone:
    raise PrivateApiUnavailable(
        f"{what} needs {', '.join(gone)}, which jax {jax.__version__} / jaxlib "
        f"{JAXLIB_VERSION} does not have (jdtensor is tested with jax and "
        "jaxlib >=0.10.2,<0.11).")


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


def _all_reduce_module(num_processes: int, width: int) -> str:
  """StableHLO: an int32[width] sum across `num_processes` replicas."""
  group = ", ".join(str(i) for i in range(num_processes))
  return f"""
module @jdtensor_heartbeat attributes {{mhlo.num_replicas = {num_processes} : i32, mhlo.num_partitions = 1 : i32}} {{
  func.func public @main(%arg0: tensor<{width}xi32>) -> tensor<{width}xi32> {{
    %0 = "stablehlo.all_reduce"(%arg0) <{{replica_groups = dense<[[{group}]]> : tensor<1x{num_processes}xi64>}}> ({{
    ^bb0(%a: tensor<i32>, %b: tensor<i32>):
      %s = stablehlo.add %a, %b : tensor<i32>
      stablehlo.return %s : tensor<i32>
    }}) : (tensor<{width}xi32>) -> tensor<{width}xi32>
    return %0 : tensor<{width}xi32>
  }}
}}
"""


class PrivateRuntime:
  """A runtime JAX never sees: its own service, client, CPU device and all-reduce.

  Every client builds one, collectively (the distributed client's connect and
  the CPU client's topology exchange wait for every process).

  Args:
    client_id: This process's id.
    num_clients: Number of processes.
    service_host: Host of client 0, where the service runs.
    service_port: The service's port (client 0 reserved it during the
      start-up handshake and told every client; see
      `jdtensor._rendezvous.reserve_port`).
    gloo_host: Host gloo listens on (None: JAX's default, the hostname).
    width: Length of the int32 vector each exchange sums.
    connect_timeout: Seconds to wait for every process to connect. When it
      expires, jaxlib aborts the process: pass a bound only the caller's own
      watchdog can never reach first.
    service_socket: Client 0 only: the reserved socket, closed once the
      service has bound the port.
    shutdown_timeout: Seconds the teardown's shutdown barrier may wait.
  """

  def __init__(self, client_id: int, num_clients: int, service_host: str,
               service_port: int, gloo_host: str | None, width: int,
               connect_timeout: float,
               service_socket: socket.socket | None = None,
               shutdown_timeout: float = 60.0):
    _need(_HEARTBEAT_RUNTIME, "The heartbeat's private runtime")
    f = _FOUND
    self.client_id, self.num_clients, self.width = client_id, num_clients, width
    self._lock = threading.Lock()
    self._closed = False
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
    self.client = f["get_distributed_runtime_client"](
        format_host_port(service_host, service_port), client_id,
        init_timeout=max(1, int(connect_timeout)), heartbeat_timeout=never,
        shutdown_timeout=shutdown, shutdown_on_destruction=False)
    self.client.connect()
    self._collectives = (f["make_gloo_tcp_collectives"](
        distributed_client=self.client, hostname=gloo_host)
        if gloo_host else f["make_gloo_tcp_collectives"](
            distributed_client=self.client))
    self._cpu = f["get_tfrt_cpu_client"](
        asynchronous=True, distributed_client=self.client, node_id=client_id,
        num_nodes=num_clients, collectives=self._collectives, num_devices=1)
    devices = sorted(self._cpu.devices(), key=lambda d: (d.process_index, d.id))
    if [d.process_index for d in devices] != list(range(num_clients)):
      raise RuntimeError(
          "The heartbeat's private runtime has an unexpected device set: "
          f"{devices}; expected one CPU device per client.")
    options = f["CompileOptions"]()
    options.num_replicas = num_clients
    options.num_partitions = 1
    options.device_assignment = f["DeviceAssignment"].create(
        np.array([[d.id] for d in devices], dtype=np.int32))
    self._executable = f["compile_and_load"](
        self._cpu, _all_reduce_module(num_clients, width),
        f["DeviceList"](tuple(devices)), options)
    self._device = self._cpu.local_devices()[0]
    self._aval = f["ShapedArray"]((width,), np.int32)
    self._sharding = jax.sharding.SingleDeviceSharding(self._device)

  def all_reduce(self, row: np.ndarray) -> np.ndarray:
    """Sums `row` (int32[width]) across every client; blocks until done."""
    local = _FOUND["batched_device_put"](
        self._aval, self._sharding, [np.ascontiguousarray(row, np.int32)],
        [self._device], True)
    results = _FOUND["execute_sharded"](self._executable, [local])
    return np.asarray(results.disassemble_into_single_device_arrays()[0][0])

  def close(self, barrier_timeout: float) -> bool:
    """Collective teardown after an agreed stop; True if every step ran.

    Order matters: a barrier (nobody closes gloo sockets while a peer still
    reads), drop the executable and CPU client, then the distributed client
    (itself a barrier), then the service.
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
    del self._executable, self._cpu, self._collectives, self._sharding
    del self._device
    try:
      self.client.shutdown()
      if self.service is not None:
        self.service.shutdown()
    except Exception:  # pylint: disable=broad-except
      return False
    return True
