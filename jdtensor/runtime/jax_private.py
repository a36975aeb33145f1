"""Every private JAX and jaxlib API jdtensor uses, in one module.

JAX's public API has no way to (a) read the coordination-service client that
``jax.distributed.initialize`` created, (b) make gloo listen on a given host,
or (c) tell whether a backend has started without starting one. jdtensor needs
all three, so they live here, behind small functions, and nowhere else.

Tested range: jax and jaxlib `TESTED_RANGE` (``pyproject.toml`` pins the
same; CI runs the suite on the oldest and the newest). On a JAX upgrade, run
the multi-process tests (CONTRIBUTING.md, "Testing a new JAX").

Importing this module imports jax; only runtime code imports it, lazily.
Each symbol is looked up once, here, at import. What is missing is listed in
`MISSING`; the functions that need it raise `PrivateApiUnavailable`. The
heartbeat needs none of them: it beats on the start-up's liveness links
(`jdtensor.heartbeat.exchange.LinkExchange`).

jaxlib texts relied on are listed here too: `_jaxlib_texts.GLOO_KEY_PREFIX`.
"""

from __future__ import annotations

import sys
from typing import Any

import jax

from jdtensor import _jaxlib_texts
from jdtensor._jaxlib_texts import PROBES as TEXT_PROBES

__all__ = [
    "MISSING",
    "JAXLIB_VERSION",
    "PrivateApiUnavailable",
    "backends_initialized",
    "coordination_client",
    "bind_cpu_collectives",
    "detach_from_jax_shutdown",
    "keep_alive",
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
_FOUND = {name: _resolve(path) for name, path in _USER_RUNTIME.items()}
# The private symbols this jaxlib lacks, as "module:attribute" paths.
MISSING: tuple[str, ...] = tuple(sorted(
    {path for name, path in _USER_RUNTIME.items() if _FOUND[name] is None}))


# The jaxlib texts jdtensor relies on, by name (see `jdtensor._jaxlib_texts`).
TEXTS = {name: _jaxlib_texts.text(name) for name in _jaxlib_texts.__all__
         if name != "PROBES"}

# The jax/jaxlib versions the whole suite passes on (pyproject.toml's pin).
TESTED_RANGE = ">=0.9.2,<0.13"


class PrivateApiUnavailable(RuntimeError):
  """This jax/jaxlib lacks a private symbol jdtensor needs for a feature."""


def _need(names: dict[str, str], what: str) -> None:
  gone = [path for name, path in names.items() if _FOUND[name] is None]
  if gone:
    raise PrivateApiUnavailable(
        f"{what} needs {', '.join(gone)}, which jax {jax.__version__} / jaxlib "
        f"{JAXLIB_VERSION} does not have (jdtensor is tested with jax and "
        f"jaxlib {TESTED_RANGE}).")


# -- the user's JAX runtime ------------------------------------------------------------


def backends_initialized() -> bool:
  """Whether a JAX backend exists in this process. Never starts one."""
  probe = _FOUND["backends_are_initialized"]
  if probe is None:
    # Without the probe, assume the worst only once jax has been used.
    return bool(getattr(sys.modules.get("jax._src.xla_bridge"), "_backends", None))
  return bool(probe())


def distributed_initialized() -> bool:
  """Whether ``jax.distributed.initialize`` has run in this process (its
  client or service exists). Never starts anything."""
  state = _FOUND["distributed_state"]
  return state is not None and (getattr(state, "client", None) is not None
                                or getattr(state, "service", None) is not None)


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
