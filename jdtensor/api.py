"""DTensor's data API on ``jax.Array``: pack, unpack, relayout and the rest.

A DTensor "DTensor" is a ``jax.Array`` whose sharding is the
``NamedSharding`` of a `Layout`. Every function works across clients: each
client passes or receives only its own components. Parameter names are TF
2.21's (``tests/unit/test_api_signatures.py`` pins them).

Layouts survive round trips: the arrays jdtensor makes, and the shardings a
`Layout` makes, remember their Layout (mesh name and PARTED/STATIC type
included), so `fetch_layout` gives back exactly what was asked for.

Repeated calls are as fast as plain JAX: `relayout` is ``jax.device_put``,
and `call_with_layout` keeps one jitted function per (function, layout,
constant arguments).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from jdtensor import config, runtime
from jdtensor.runtime import interop
from jdtensor.layout import Layout, Mesh

__all__ = ["pack", "unpack", "fetch_layout", "check_layout", "relayout",
           "relayout_like", "copy_to_mesh", "is_dtensor", "call_with_layout",
           "default_mesh", "run_on", "get_default_mesh", "device_name"]


def _is_array(value: Any) -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  return isinstance(value, jax.Array)


def _is_tracer(value: Any) -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  return isinstance(value, jax.core.Tracer)


def pack(tensors: Sequence[Any], layout: Layout) -> Any:
  """Builds a global ``jax.Array`` from this client's components.

  Args:
    tensors: One array per local device of ``layout.mesh``, in
      local-device-id order, each of the local (per-device) shape.
    layout: The layout of the result.

  Returns:
    A ``jax.Array`` with sharding ``layout.to_jax_sharding()`` and global shape
    ``layout.global_shape_from_local_shape(component shape)``.

  Raises:
    ValueError: Wrong number of components, components whose shapes or
      dtypes differ, or whose rank is not the layout's (TF's message).
  """
  runtime.check_health()
  import jax  # pylint: disable=g-import-not-at-top
  devices = interop.local_jax_devices(layout)
  if len(tensors) != len(devices):
    raise ValueError(
        f"pack: got {len(tensors)} components, but layout's mesh has "
        f"{len(devices)} local devices on this client; pass one component "
        "per local device, in local-device-id order.")
  if not tensors:
    raise ValueError("pack: this client has no device in the layout's mesh, so "
                     "it has no component to pack; pack on the clients that do.")
  # jax.Arrays stay where they are (no round trip through the host).
  arrays = [c if isinstance(c, jax.Array) else np.asarray(c) for c in tensors]
  shape, dtype = arrays[0].shape, arrays[0].dtype
  if any(a.shape != shape or a.dtype != dtype for a in arrays):
    shapes = sorted({tuple(a.shape) for a in arrays})
    dtypes = sorted({str(a.dtype) for a in arrays})
    raise ValueError(f"pack: components must share one shape and dtype, got "
                     f"shapes {shapes} and dtypes {dtypes}.")
  if len(shape) != layout.rank:
    # DTensor-compatible message, then what to do.
    raise ValueError(
        "Packed layout should have the same rank as the rank for each "
        f"component. The rank of each component is: {len(shape)}, while "
        f"layout has rank: {layout.rank} (component shape {tuple(shape)}; "
        "pass per-device components of the layout's rank).")
  global_shape = layout.global_shape_from_local_shape(arrays[0].shape)
  buffers = [a if isinstance(a, jax.Array) and a.devices() == {d} else
             jax.device_put(a, d)
             for a, d in zip(arrays, devices)]
  return interop.remember_layout(jax.make_array_from_single_device_arrays(
      global_shape, layout.to_jax_sharding(), buffers), layout)


def fetch_layout(tensor: Any) -> Layout | None:
  """The `Layout` of a DTensor (a ``jax.Array`` with a ``NamedSharding``).

  The Layout jdtensor made the array or its sharding with (mesh name and
  layout type included), else one built from the sharding and the jdtensor
  mesh most recently used for its JAX mesh.

  Returns:
    The layout; None for an object that is not an array (as TF).

  Raises:
    ValueError: TF's message for an array on no layout (a plain
      single-device array).
    RuntimeError: Inside ``jax.jit`` (TF: only eagerly).
  """
  runtime.check_health()
  if not _is_array(tensor):
    return None
  if _is_tracer(tensor):
    raise RuntimeError("fetch_layout works on concrete arrays, not inside "
                       "jax.jit or other transformations (TF: only eagerly).")
  recorded = interop.recorded_layout(tensor)
  if recorded is not None and recorded.rank == tensor.ndim:
    return recorded
  import jax  # pylint: disable=g-import-not-at-top
  if isinstance(tensor.sharding, jax.sharding.NamedSharding):
    return Layout.from_jax_sharding(tensor.sharding, rank=tensor.ndim)
  # DTensor-compatible message.
  raise ValueError("FetchLayout expects a tensor placed on the layout device. "
                   f"(jdtensor: this array's sharding is {tensor.sharding}; make "
                   "it with pack, relayout, copy_to_mesh or a Layout's "
                   "to_jax_sharding().)")


def is_dtensor(tensor: Any) -> bool:
  """Whether `tensor` is a DTensor: an array with a jdtensor layout or a
  ``NamedSharding``."""
  if not _is_array(tensor) or _is_tracer(tensor):
    return False
  try:
    return fetch_layout(tensor) is not None
  except ValueError:
    return False


def check_layout(tensor: Any, layout: Layout) -> None:
  """Asserts that the layout of the DTensor is `layout`.

  Raises:
    ValueError: TF's message if it is not.
  """
  actual = fetch_layout(tensor)
  if actual != layout:
    # DTensor-compatible message.
    raise ValueError(f"Layout of tensor: {actual}, did not match expected "
                     f"layout: {layout}")


def unpack(tensor: Any) -> list[Any]:
  """This client's components of `tensor`, in local-device-id order.

  Returns:
    One ``jax.Array`` per local device of the array's mesh, each on its device.

  Raises:
    TypeError: TF's message for something that is not an array.
    ValueError: For an array on no layout.
  """
  runtime.check_health()
  if not _is_array(tensor):
    # DTensor-compatible message.
    raise TypeError(f"Expecting a Tensor, got {type(tensor)}")
  layout = fetch_layout(tensor)
  by_device = {shard.device: shard.data for shard in tensor.addressable_shards}
  return [by_device[d] for d in interop.local_jax_devices(layout)]  # type: ignore[arg-type]


def relayout(tensor: Any, layout: Layout, name: str | None = None) -> Any:
  """`tensor` resharded to `layout` (a collective when shards move).

  ``jax.device_put`` underneath (one cached program, like plain JAX); inside
  ``jax.jit`` a sharding constraint. Under ``jax.grad`` the cotangent goes
  back to the input's layout, as DTensor's ``Relayout`` gradient does.

  Args:
    tensor: A DTensor (or any array).
    layout: The layout of the result.
    name: TF's op name; not used.
  """
  del name  # TF's op name: JAX has no named ops here.
  runtime.check_health()
  import jax  # pylint: disable=g-import-not-at-top
  sharding = layout.to_jax_sharding()
  if _is_tracer(tensor):
    return _differentiable_move(tensor, sharding)
  return interop.remember_layout(jax.device_put(tensor, sharding), layout)


def _place(value: Any, sharding: Any) -> Any:
  import jax  # pylint: disable=g-import-not-at-top
  if _is_tracer(value):
    return jax.lax.with_sharding_constraint(value, sharding)
  return jax.device_put(value, sharding)


def _differentiable_move(tensor: Any, sharding: Any) -> Any:
  """`tensor` on `sharding`; its cotangent goes back to `tensor`'s sharding.

  DTensor's Relayout and RelayoutLike gradients relayout the cotangent like
  the forward input; JAX's own transpose would leave it on the new layout.
  Where the input's sharding is not known (inside jax.jit), JAX decides.
  """
  import jax  # pylint: disable=g-import-not-at-top
  source: dict[str, Any] = {}

  @jax.custom_vjp
  def move(value: Any) -> Any:
    return _place(value, sharding)

  def forward(value: Any) -> tuple[Any, None]:
    source["sharding"] = None if _is_tracer(value) else value.sharding
    return _place(value, sharding), None

  def backward(_: None, cotangent: Any) -> tuple[Any]:
    back = source.get("sharding")
    return (cotangent if back is None else _place(cotangent, back),)

  move.defvjp(forward, backward)
  return move(tensor)


def relayout_like(tensor: Any, layout_tensor: Any, name: str | None = None) -> Any:
  """`tensor` with the layout of `layout_tensor` (DTensor's ``relayout_like``).

  The shape and type of `layout_tensor` are irrelevant. Under ``jax.grad``,
  the cotangent of `tensor` goes back to `tensor`'s own layout (DTensor's
  ``RelayoutLike`` gradient); `layout_tensor` gets none.

  Raises:
    ValueError: If `layout_tensor` is not a DTensor.
  """
  layout = fetch_layout(layout_tensor)
  if layout is None:
    raise ValueError(f"relayout_like: layout_tensor must be a DTensor, got "
                     f"{type(layout_tensor).__name__}.")
  return relayout(tensor, layout, name)


def copy_to_mesh(tensor: Any, layout: Layout,
                 source_layout: Layout | None = None) -> Any:
  """Copies a value (host data, or an array) onto `layout`'s mesh.

  Every client passes the same full value; each keeps its own shards.

  Args:
    tensor: A NumPy array, Python scalar or ``jax.Array``.
    layout: The layout (and mesh) of the result.
    source_layout: Deprecated in TF and ignored there; here, if given, it
      must be `tensor`'s layout.

  Raises:
    ValueError: If `source_layout` is not `tensor`'s layout.
  """
  runtime.check_health()
  import jax  # pylint: disable=g-import-not-at-top
  if source_layout is not None and is_dtensor(tensor):
    check_layout(tensor, source_layout)
  sharding = layout.to_jax_sharding()
  if _is_array(tensor) and not _is_tracer(tensor) and not tensor.is_fully_addressable:
    return relayout(tensor, layout)
  if _is_tracer(tensor):
    return _differentiable_move(tensor, sharding)
  value = np.asarray(tensor)
  return interop.remember_layout(jax.make_array_from_callback(
      value.shape, sharding, lambda index: value[index]), layout)


# call_with_layout keeps one jitted function per (fn, layout, constants), so
# repeated calls cost what a cached jax.jit call does.
_CALLS: collections.OrderedDict[Any, Callable[..., Any]] = collections.OrderedDict()
_CALLS_LIMIT = 512
_calls_lock = threading.Lock()


def forget_compiled_calls() -> None:
  """Drops the jitted functions `call_with_layout` keeps (their shardings
  hold JAX's devices); later calls compile again."""
  with _calls_lock:
    _CALLS.clear()


def _constant_key(value: Any) -> Any:
  """A hashable stand-in for a constant argument, or raises TypeError."""
  if isinstance(value, (list, tuple)):
    return (type(value).__name__, tuple(_constant_key(v) for v in value))
  if isinstance(value, dict):
    return ("dict", tuple(sorted((k, _constant_key(v)) for k, v in value.items())))
  hash(value)
  return (type(value), value)


def call_with_layout(fn: Callable[..., Any], layout: Layout | None, *args: Any,
                     **kwargs: Any) -> Any:
  """Calls `fn` under ``jax.jit`` with its output laid out as `layout`.

  Array arguments are traced; everything else (shapes, dtypes, Python values)
  is passed as a constant, so ``call_with_layout(jnp.ones, layout, (8, 4))``
  creates the array directly in its shards. With `layout` None, `fn` is
  simply called (as TF). The jitted function is kept per (`fn`, `layout`,
  constants) and reused.
  """
  runtime.check_health()
  if layout is None:
    return fn(*args, **kwargs)
  import jax  # pylint: disable=g-import-not-at-top
  is_array = lambda v: isinstance(v, (jax.Array, np.ndarray))  # noqa: E731
  positions = tuple(i for i, a in enumerate(args) if is_array(a))
  names = tuple(sorted(k for k, v in kwargs.items() if is_array(v)))
  try:
    key = (fn, layout, positions, names,
           tuple(_constant_key(a) for i, a in enumerate(args) if i not in positions),
           tuple(sorted((k, _constant_key(v)) for k, v in kwargs.items()
                        if k not in names)))
  except TypeError:  # An unhashable constant: no reuse for this call.
    key = None
  jitted = _CALLS.get(key) if key is not None else None
  if jitted is None:
    constants = [None if i in positions else a for i, a in enumerate(args)]
    constant_kwargs = {k: v for k, v in kwargs.items() if k not in names}

    def traced(dynamic_args: list[Any], dynamic_kwargs: dict[str, Any]) -> Any:
      it = iter(dynamic_args)
      full = [next(it) if i in positions else c for i, c in enumerate(constants)]
      return fn(*full, **constant_kwargs, **dynamic_kwargs)
    jitted = jax.jit(traced, out_shardings=layout.to_jax_sharding())
    if key is not None:
      with _calls_lock:
        _CALLS[key] = jitted
        while len(_CALLS) > _CALLS_LIMIT:
          _CALLS.popitem(last=False)
  out = jitted([args[i] for i in positions], {k: kwargs[k] for k in names})
  return interop.remember_layout(out, layout) if _is_array(out) else out


# -- the default mesh -------------------------------------------------------------

_defaults = threading.local()


@contextlib.contextmanager
def default_mesh(mesh: Mesh) -> Iterator[None]:
  """Sets the default mesh for the enclosed code (DTensor's ``default_mesh``).

  Enters ``jax.set_mesh(mesh.jax_mesh)``, so JAX's own mesh context (e.g.
  ``jax.jit`` with ``PartitionSpec`` shardings, ``jax.sharding.get_mesh``)
  uses it; `get_default_mesh` returns it.

  Raises:
    ValueError: TF's message if `mesh` is not a Mesh.
  """
  if not isinstance(mesh, Mesh):
    # DTensor-compatible message.
    raise ValueError(f"Expect `mesh` to be `Mesh`, got {type(mesh)}")
  import jax  # pylint: disable=g-import-not-at-top
  stack = getattr(_defaults, "stack", None)
  if stack is None:
    stack = _defaults.stack = []
  stack.append(mesh)
  try:
    with jax.set_mesh(mesh.jax_mesh):
      yield
  finally:
    stack.pop()


@contextlib.contextmanager
def run_on(mesh: Mesh) -> Iterator[None]:
  """Deprecated in TF in favour of `default_mesh`, which it enters."""
  with default_mesh(mesh):
    yield


def get_default_mesh() -> Mesh | None:
  """The mesh of the innermost `default_mesh` scope of this thread, or None."""
  stack = getattr(_defaults, "stack", None)
  return stack[-1] if stack else None


def device_name() -> str:
  """The name TF gives its DTensor device, for code that passes it around:
  ``/job:{job_name()}/replica:0/task:{client_id()}/device:CUSTOM:0``.

  jdtensor has no such device (arrays are placed by their sharding).
  """
  return f"/job:{config.job_name()}/replica:0/task:{config.client_id()}/device:CUSTOM:0"
