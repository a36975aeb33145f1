"""Which GPUs each client of a node gets (``jdtensor launch --device-type GPU``).

PURE: standard library only; the launcher's parent never starts JAX.

The pool is the node's ``CUDA_VISIBLE_DEVICES`` entries when it is set
(indices or UUIDs, kept as written: a partial-node allocation from SLURM or
Kubernetes is respected), else the GPUs the node has (``/dev/nvidia<N>``),
as CUDA ordinals ``0..N-1``. Client k of the node gets the pool's entries
[kK, (k+1)K) as its own ``CUDA_VISIBLE_DEVICES``, K GPUs per client
(``--devices-per-client``), so that no two clients share a GPU (NCCL refuses
that: ``Duplicate GPU detected``) and each preallocates memory only on its
own. JAX's own cluster detection uses the local rank as a raw device
ordinal instead, which breaks on partial nodes (jax-ml/jax#23452). With
``JDTENSOR_SHARE_GPUS`` set, more clients than GPUs take the GPUs in turn
(tests of the heartbeat on a one-GPU machine); each client then gets an
equal part of JAX's memory preallocation at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from jdtensor import _device_nodes, _env
from jdtensor.errors import ConfigError

__all__ = ["GpuPool", "assign_gpus", "node_gpu_pool"]


class GpuPool(NamedTuple):
  """A node's GPUs, and where they were read, for messages.

  Attributes:
    entries: ``CUDA_VISIBLE_DEVICES`` entries, in order.
    source: E.g. ``CUDA_VISIBLE_DEVICES='2,3'`` or ``/dev/nvidia0-7``.
  """
  entries: tuple[str, ...]
  source: str


def node_gpu_pool(environ: Mapping[str, str], device_dir: str = "/dev") -> GpuPool:
  """This node's GPUs: its ``CUDA_VISIBLE_DEVICES``, else its device nodes."""
  visible = _env.read_visible_gpus(environ)
  if visible is not None:
    return GpuPool(visible, f"{_env.CUDA_VISIBLE_DEVICES}="
                            f"{environ[_env.CUDA_VISIBLE_DEVICES]!r}")
  count = _device_nodes.gpu_node_count(device_dir)
  source = (f"{device_dir}/nvidia0-{count - 1}" if count > 1 else
            f"{device_dir}/nvidia0" if count else f"no {device_dir}/nvidia<N>")
  return GpuPool(tuple(str(i) for i in range(count)), source)


def _divisors(n: int) -> str:
  return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


_SHARE_HINT = (f", or set {_env.JDTENSOR_SHARE_GPUS}=1 to run several clients on "
               "a GPU (no cross-client GPU collective then)")


def assign_gpus(pool: GpuPool, num_clients: int | None, per_client: int | None,
                share: bool = False) -> tuple[tuple[str, ...], ...]:
  """Each of the node's clients' GPUs (its ``CUDA_VISIBLE_DEVICES`` entries).

  Args:
    pool: The node's GPUs.
    num_clients: ``-n``; None: as many clients as the pool holds K GPUs.
    per_client: ``--devices-per-client`` (K); None: the pool split evenly.
    share: ``JDTENSOR_SHARE_GPUS``: more clients than the pool holds K GPUs
      take the pool's entries in turn (client k gets entries kK.. modulo
      the pool), so that every GPU is shared by as few clients as can be.

  Returns:
    One tuple of entries per client, the first client's first.

  Raises:
    ConfigError: The node has no GPU, the pool is too small for
      ``-n`` x K, or does not split evenly; the message names the pool,
      ``-n`` and K, and the fix.
  """
  have = len(pool.entries)
  if not have:
    raise ConfigError(
        f"--device-type GPU: this node has no GPU ({pool.source}). Run on a GPU "
        "node, or use --device-type CPU.")
  if share and num_clients is not None and num_clients * (per_client or 1) > have:
    per_client = per_client or 1
    if per_client > have:
      raise ConfigError(
          f"--devices-per-client {per_client} needs {per_client} GPUs a client, but "
          f"this node has {have} ({pool.source}). Give --devices-per-client at most "
          f"{have}.")
    return tuple(tuple(pool.entries[(k * per_client + j) % have] for j in range(per_client))
                 for k in range(num_clients))
  if num_clients is not None and per_client is not None:
    if num_clients * per_client > have:
      raise ConfigError(
          f"-n {num_clients} x --devices-per-client {per_client} needs "
          f"{num_clients * per_client} GPUs, but this node has {have} ({pool.source}). "
          f"Give -n x --devices-per-client at most {have}{_SHARE_HINT}.")
  elif per_client is not None:
    if have % per_client:
      raise ConfigError(
          f"--devices-per-client {per_client} does not split this node's {have} GPUs "
          f"({pool.source}) evenly. Give a divisor of {have} ({_divisors(have)}), or "
          f"-n with -n x {per_client} at most {have}.")
    num_clients = have // per_client
  elif num_clients is not None:
    if num_clients > have or have % num_clients:
      raise ConfigError(
          f"-n {num_clients} does not split this node's {have} GPUs ({pool.source}) "
          f"evenly, one client per GPU or more GPUs each. Give -n a divisor of {have} "
          f"({_divisors(have)}), or --devices-per-client K with -n x K at most {have}"
          + (_SHARE_HINT if num_clients > have else "") + ".")
    per_client = have // num_clients
  else:
    num_clients, per_client = have, 1
  return tuple(pool.entries[k * per_client:(k + 1) * per_client]
               for k in range(num_clients))
