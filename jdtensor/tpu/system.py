"""DTensor's TPU system set-up: local core ids, their merge, the topology.

Runs once, inside `initialize_accelerator_system("TPU")`, after the runtime
has started (and joined the cluster): every client finds its local TPU core
ids (from JAX's TPU devices, or from a simulated slice), the clients merge
them with one all-reduce over every TPU device, and the merged table must
agree with what each client expected. The runtime keeps the result.
"""

from __future__ import annotations

from jdtensor import _env
from jdtensor.runtime import interop
from jdtensor import _logging as logging
from jdtensor import runtime
from jdtensor.tpu import topology
from jdtensor.tpu.topology import SimulatedTopology, Topology

__all__ = ["initialize", "merge_core_ids"]


def merge_core_ids(local_core_ids: list[int], client_id: int,
                   num_clients: int) -> list[int]:
  """DTensor's core-id merge: one all-reduce (psum) over every TPU device.

  Each client writes its local core ids into its slot of a zero vector of
  the global core count; that vector is its first local device's row, zeros
  are the others'; a sum over every device merges them, so every client ends
  with the same table, ordered by (task, local ordinal).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  devices = [d for task in range(num_clients)
             for d in runtime.client_devices("TPU", task)]
  per_task = len(devices) // num_clients
  mine = np.zeros([len(devices)], np.int32)
  start = client_id * per_task
  mine[start:start + len(local_core_ids)] = local_core_ids
  rows = [mine] + [np.zeros_like(mine)] * (per_task - 1)
  return interop.sum_over_devices(devices, rows).astype(int).tolist()


def initialize(cluster: _env.ClusterEnv, simulated: SimulatedTopology | None,
               megacore: bool) -> Topology:
  """DTensor's TPU system init on this client; returns the merged topology.

  Raises:
    ValueError: Megacore on a slice with more than one core per chip.
    RuntimeError: If the merged core ids disagree with a client's own view
      (clients on different slices).
  """
  n, cid = cluster.num_clients, cluster.client_id
  if simulated is not None:
    bounds = list(simulated.shape)
    expected = [i for host in range(n) for i in simulated.host_core_ids(host)]
    source = f"{_env.JDTENSOR_SIMULATED_TPU_TOPOLOGY}={simulated.text!r}"
  else:
    import jax  # pylint: disable=g-import-not-at-top
    bounds, expected = topology.device_core_ids(jax.devices("tpu"))
    source = "JAX's global TPU device view"
  per_task = len(expected) // n
  local = expected[cid * per_task:(cid + 1) * per_task]
  if megacore:
    if bounds[3] != 1:
      raise ValueError(
          "experimental_enable_megcore needs one device per TPU chip, but "
          f"{source} has {bounds[3]} cores per chip.")
    logging.info("Using TPU megacore")
    local, expected = [2 * i for i in local], [2 * i for i in expected]
    bounds = bounds[:3] + [2]  # Core ids count physical cores: 2 per chip.
  logging.info("TPU core IDs: %s", local)
  merged = merge_core_ids(local, cid, n)
  logging.info("All TPU core IDs: %s", merged)
  bad = [t for t in range(n) if merged[t * per_task:(t + 1) * per_task] !=
         expected[t * per_task:(t + 1) * per_task]]
  if bad:
    raise RuntimeError(
        "The TPU core ids merged across clients disagree with "
        f"{source} for client(s) {', '.join(map(str, bad))}: merged {merged}, "
        f"expected {expected}. Every client must run on the slice it reports "
        "(same topology on every client).")
  topo = topology.build_topology(merged, bounds, n)
  logging.info("All TPU core locations: %s", topology.core_ids_to_locations(
      merged, bounds))
  logging.vlog(1, "TPU Topology: %s, %s", topo.mesh_shape, topo.device_coordinates)
  return topo
