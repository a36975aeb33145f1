"""DTensor-style data movement on ``jax.Array`` (pack, unpack, relayout, ...).

A DTensor "DTensor" is a ``jax.Array`` whose sharding is the
``NamedSharding`` of a `Layout`. Every function works across clients: each
client passes or receives only its own components.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jdtensor import _interop, runtime
from jdtensor.layout import Layout

__all__ = ["pack", "unpack", "fetch_layout", "relayout", "call_with_layout"]


def pack(local_components: Sequence[Any], layout: Layout) -> Any:
  """Builds a global ``jax.Array`` from this client's components.

  Args:
    local_components: One array per local device of ``layout.mesh``, in
      local-device-id order, each of the local (per-device) shape.
    layout: The layout of the result.

  Returns:
    A ``jax.Array`` with sharding ``layout.to_jax_sharding()`` and global shape
    ``layout.global_shape_from_local_shape(component shape)``.

  Raises:
    ValueError: Wrong number of components, or components whose shapes or
      dtypes differ.
  """
  runtime.check_health()
  import jax  # pylint: disable=g-import-not-at-top
  mesh = layout.mesh
  local_devices = mesh.local_devices()
  if len(local_components) != len(local_devices):
    raise ValueError(
        f"pack: got {len(local_components)} components, but layout's mesh has "
        f"{len(local_devices)} local devices on this client; pass one component "
        "per local device, in local-device-id order.")
  arrays = [np.asarray(c) for c in local_components]
  shapes = {a.shape for a in arrays}
  dtypes = {a.dtype for a in arrays}
  if len(shapes) > 1 or len(dtypes) > 1:
    raise ValueError(f"pack: components must share one shape and dtype, got "
                     f"shapes {sorted(shapes)} and dtypes {sorted(map(str, dtypes))}.")
  global_shape = layout.global_shape_from_local_shape(arrays[0].shape)
  buffers = [jax.device_put(a, _interop.resolve_device(d))
             for a, d in zip(arrays, local_devices)]
  return jax.make_array_from_single_device_arrays(
      global_shape, layout.to_jax_sharding(), buffers)


def fetch_layout(array: Any) -> Layout:
  """The `Layout` of a ``jax.Array`` with a ``NamedSharding``.

  The mesh is the jdtensor mesh the sharding was made from (name included)
  when it came from `Layout.to_jax_sharding`, else one built from the JAX mesh.
  """
  runtime.check_health()
  return Layout.from_jax_sharding(array.sharding, rank=array.ndim)


def unpack(array: Any) -> list[Any]:
  """This client's components of `array`, in local-device-id order.

  Returns:
    One ``jax.Array`` per local device of the array's mesh, each on its device.
  """
  runtime.check_health()
  layout = fetch_layout(array)
  by_device = {shard.device: shard.data for shard in array.addressable_shards}
  return [by_device[_interop.resolve_device(d)]
          for d in layout.mesh.local_devices()]


def relayout(array: Any, layout: Layout) -> Any:
  """`array` resharded to `layout` (a collective when shards move)."""
  runtime.check_health()
  import jax  # pylint: disable=g-import-not-at-top
  return jax.jit(lambda x: x, out_shardings=layout.to_jax_sharding())(array)


def call_with_layout(fn: Callable[..., Any], layout: Layout, *args: Any,
                     **kwargs: Any) -> Any:
  """Calls `fn` under ``jax.jit`` with its output laid out as `layout`.

  Array arguments are traced; everything else (shapes, dtypes, Python values)
  is passed as a constant, so ``call_with_layout(jnp.ones, layout, (8, 4))``
  creates the array directly in its shards.
  """
  runtime.check_health()
  import jax  # pylint: disable=g-import-not-at-top
  is_array = lambda v: isinstance(v, (jax.Array, np.ndarray))  # noqa: E731
  array_args = [a for a in args if is_array(a)]
  array_kwargs = {k: v for k, v in kwargs.items() if is_array(v)}

  def traced(dynamic_args: list[Any], dynamic_kwargs: dict[str, Any]) -> Any:
    it = iter(dynamic_args)
    full_args = [next(it) if is_array(a) else a for a in args]
    return fn(*full_args, **{**kwargs, **dynamic_kwargs})

  return jax.jit(traced,
                 out_shardings=layout.to_jax_sharding())(array_args, array_kwargs)
