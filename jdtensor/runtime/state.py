"""The runtime's state and every operation on it: `Runtime`.

JAX's ``distributed.State`` is the model: `jdtensor.runtime`'s functions act
on one default instance; tests build their own. Multi-client start-up itself
is `jdtensor.runtime.startup`'s.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jdtensor import _env
from jdtensor import _logging as logging
from jdtensor.device_spec import DEVICE_TYPES
from jdtensor.errors import AlreadyInitializedError, NotInitializedError
from jdtensor.runtime import startup
from jdtensor.runtime.startup import StartupPlan, backend_initialized
from jdtensor.runtime.links import Links

if TYPE_CHECKING:  # The TPU modules load only on a TPU (or simulated TPU) run.
  from jdtensor.tpu.topology import SimulatedTopology, Topology

__all__ = ["Runtime", "RuntimeState", "StartupPlan", "PLATFORMS",
           "backend_initialized", "process_index"]

# DTensor device type -> JAX platform name.
PLATFORMS = {t: t.lower() for t in DEVICE_TYPES}


class RuntimeState:
  """What `initialize` set up. Read it with `state()`; never assign to it.

  Attributes:
    device_type: The initialised accelerator type, or None.
    env: The cluster variables as read at initialisation.
    multi_client: Whether jax.distributed was initialised.
    timeouts: The time-outs in force.
    simulated_tpu: The simulated TPU slice, if TPU cores are simulated on CPU.
    tpu_topology: The merged TPU topology (TPU runs).
    tpu_meshes: Devices of each mesh `create_tpu_mesh` registered, by name.
    peer_failure: The failure the heartbeat recorded under policy "raise".
    links: The rendezvous connections, kept as liveness links.
    gloo_host: The DTENSOR_JOBS host of this client when it is an address of
      this machine (gloo listens there), else None.
    init_seconds: Wall time `initialize` took.
  """

  device_type: str | None = None
  env: _env.ClusterEnv | None = None
  multi_client: bool = False
  timeouts: _env.Timeouts = _env.Timeouts()
  init_seconds: float = 0.0
  simulated_tpu: SimulatedTopology | None = None
  tpu_topology: Topology | None = None
  tpu_meshes: dict[str, list[Any]]
  auto_mesh_names: int = 0
  peer_failure: Exception | None = None
  links: Links | None = None
  gloo_host: str | None = None
  _device_table: dict[tuple[str, int], list[Any]]

  # A plain class, not a dataclass: a dataclass costs a client about 1 ms
  # to create at import, on every client's start-up.
  def __init__(self) -> None:
    self.tpu_meshes = {}
    self._device_table = {}




def process_index() -> int:
  """This process's JAX process index (starts the backend)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index()


def _group(devices: list[Any], device_type: str) -> dict[tuple[str, int], list[Any]]:
  table: dict[tuple[str, int], list[Any]] = {}
  for d in sorted(devices, key=lambda d: (d.process_index, d.id)):
    table.setdefault((device_type, d.process_index), []).append(d)
  return table


class Runtime:
  """The runtime's state and every operation on it (JAX's
  ``distributed.State`` is the model): this module's functions act on the
  default instance; tests build their own.

  Attributes:
    state: What `initialize` set up (read it; never assign to it).
  """

  def __init__(self) -> None:
    self.state = RuntimeState()
    self._lock = threading.RLock()

  def cluster(self) -> _env.ClusterEnv | None:
    """Who this process is in the cluster: the record taken at
    initialisation (the one answer to "who am I"); None before."""
    return self.state.env if self.is_initialized() else None

  def is_initialized(self) -> bool:
    """Whether `initialize_accelerator_system` has run (and not been shut down)."""
    return self.state.device_type is not None

  def cpu_device_count(self, explicit_only: bool = False) -> int | None:
    """How many CPU devices the JAX CPU backend has or will have (the one
    reader of that number). Never starts a backend.

    After start-up: the real devices. Before: ``jax_num_cpu_devices`` (if jax
    is imported), then the environment (``JAX_NUM_CPU_DEVICES``, XLA's forced
    host device count), else JAX's default of 1.

    Args:
      explicit_only: Only what the user configured: None instead of the
        default, and the configuration rather than a running backend's count.
    """
    if not explicit_only and backend_initialized():
      return len(self.client_devices("CPU", process_index()))
    if "jax" in sys.modules:
      import jax  # pylint: disable=g-import-not-at-top
      configured = jax.config.jax_num_cpu_devices
      if configured and configured > 0:
        return int(configured)
    from_env = _env.read_cpu_device_count()
    if from_env is not None:
      return from_env
    return None if explicit_only else 1

  def jax_platforms(self) -> tuple[str, ...] | None:
    """The platforms JAX is limited to, in priority order, as JAX reads them
    (``jax.config.jax_platforms`` once jax is imported, which a
    ``jax.config.update`` may have set; else ``JAX_PLATFORMS``); None when
    every platform. Never starts a backend."""
    if "jax" in sys.modules:
      import jax  # pylint: disable=g-import-not-at-top
      return _env.read_jax_platforms(value=jax.config.jax_platforms or "")
    return _env.read_jax_platforms()

  def simulated_tpu(self) -> SimulatedTopology | None:
    """The simulated TPU slice in force (as initialised, else from the env)."""
    if self.is_initialized():
      return self.state.simulated_tpu
    from jdtensor.tpu.topology import read_simulated_topology  # pylint: disable=g-import-not-at-top
    return read_simulated_topology()

  def platform_of(self, device_type: str) -> str | None:
    """The JAX platform whose devices are DTensor's `device_type` here."""
    if device_type == "TPU" and self.simulated_tpu() is not None:
      return "cpu"  # Simulated TPU cores are this client's CPU devices.
    return PLATFORMS.get(device_type)

  def client_devices(self, device_type: str, client: int) -> list[Any]:
    """The visible `device_type` devices of one client, in DTensor index order.

    Starts the backend. A type the backend does not have gives ``[]``.
    """
    key = (device_type.upper(), int(client))
    with self._lock:
      cached = self.state._device_table.get(key)  # pylint: disable=protected-access
      if cached is None:
        import jax  # pylint: disable=g-import-not-at-top
        platform = self.platform_of(key[0])
        try:
          devices = jax.devices(platform) if platform else []
        except RuntimeError:  # No backend for this platform.
          devices = []
        for (dtype, task), table in _group(devices, key[0]).items():
          self.state._device_table[(dtype, task)] = table  # pylint: disable=protected-access
        cached = self.state._device_table.setdefault(key, [])  # pylint: disable=protected-access
      return list(cached)

  def device_string(self, device: Any) -> str:
    """The DTensor device string of a ``jax.Device``."""
    device_type = {v: k for k, v in PLATFORMS.items()}.get(device.platform,
                                                           device.platform.upper())
    if device_type == "CPU" and self.state.device_type == "TPU" and self.state.simulated_tpu:
      device_type = "TPU"
    devices = self.client_devices(device_type, device.process_index)
    if device not in devices:
      raise ValueError(f"JAX device {device} is not a device jdtensor can use.")
    cluster = self.cluster()
    job = cluster.job_name if cluster is not None else _env.job_name()
    return (f"/job:{job}/replica:0/task:{device.process_index}/device:"
            f"{device_type}:{devices.index(device)}")

  def initialize(self, plan: StartupPlan,
                 tpu_setup: Callable[[], Topology] | None = None) -> str:
    """Starts the runtime `plan` describes and records it.

    Args:
      plan: What to start.
      tpu_setup: For TPU: DTensor's TPU system set-up (`jdtensor.tpu.system`),
        run once the runtime is up and before it counts as initialised.

    Returns:
      The device type.

    Raises:
      AlreadyInitializedError: DTensor's message.
      StartupError, StartupTimeoutError: Multi-client start-up failed.
      ValueError: This process has no device of the type.
      RuntimeError: A running backend prevents the set-up.
    """
    start = time.monotonic()
    with self._lock:
      if self.is_initialized():
        # DTensor-compatible message.
        raise AlreadyInitializedError(
            "Accelerator system has already been initialized. Call "
            "tf.experimental.dtensor.shutdown_accelerator_system() first.")
      env, device_type = plan.cluster, plan.device_type
      multi_client = env.num_clients > 1
      if multi_client:
        started = startup.start_distributed(
            plan, platform=self.platform_of(device_type),
            before_jax=lambda: self.apply_cpu_device_count(plan.cpu_devices, False))
        self.state.links, self.state.gloo_host = started.links, started.gloo_host
      else:
        self.apply_cpu_device_count(plan.cpu_devices, plan.reset_requested)
      if not self.client_devices(device_type, process_index()):
        raise ValueError(
            f"initialize_accelerator_system({device_type!r}): this process has no "
            f"{device_type} devices. Use device_type='CPU', or run where "
            f"{device_type}s are attached (or simulate a TPU slice with "
            f"{_env.JDTENSOR_SIMULATED_TPU_TOPOLOGY}).")
      if device_type == "TPU" and tpu_setup is not None:
        self.state.tpu_topology = tpu_setup()
        self.state.simulated_tpu = plan.simulated_tpu
      if self.state.links is not None:
        self.state.links.watch(None)  # The heartbeat, if on, takes the links over.
      self.state.device_type = device_type
      self.state.env = env
      self.state.multi_client = multi_client
      self.state.timeouts = plan.timeouts
      self.state.init_seconds = time.monotonic() - start
      logging.info("jdtensor initialised %s in %.3f s (client %d of %d)",
                   device_type, self.state.init_seconds, env.client_id, env.num_clients)
      return device_type

  def apply_cpu_device_count(self, count: int | None, reset_requested: bool) -> None:
    """Applies `count` CPU devices; it must happen before the backend starts."""
    import jax  # pylint: disable=g-import-not-at-top
    if not backend_initialized():
      if count is not None:
        jax.config.update("jax_num_cpu_devices", count)
      return
    if reset_requested:
      logging.warning(
          "experimental_reset_context is True. Resetting TensorFlow context. "
          "Existing TensorFlow objects (e.g. Tensors and resources) are "
          "invalidated. (jdtensor: a JAX backend cannot be reset; the running "
          "one is kept.)")
    actual = self.cpu_device_count()
    if count is not None and count != actual:
      raise RuntimeError(
          f"num_logical_cpu_devices={count} cannot take effect: the JAX backend "
          f"has already started with {actual} CPU device(s). Call "
          "initialize_accelerator_system() before any JAX call that starts the "
          "backend (jax.devices(), creating arrays, jit), or run it in a fresh "
          "process.")

  def shutdown(self) -> None:
    """Tears the runtime down; see `jdtensor.shutdown_accelerator_system`."""
    with self._lock:
      if not self.is_initialized():
        # DTensor-compatible message.
        raise NotInitializedError(
            "Accelerator system is not initialized. Call "
            "tf.experimental.dtensor.initialize_accelerator_system first.")
      if self.state.multi_client:
        # DTensor-compatible: the system stays initialised.
        raise ValueError("Shutting down accelerator system under multi-client "
                         "mode is not supported.")
      if self.state.device_type == "TPU":
        self.state.tpu_topology = None
        self.state.tpu_meshes.clear()
        logging.info("TPU system shut down.")
      self.state.device_type = None
      self.state.env = None

  def forget_devices(self) -> None:
    """Drops the cached device table (`client_devices` reads JAX again)."""
    with self._lock:
      self.state._device_table.clear()  # pylint: disable=protected-access

  def register_tpu_mesh(self, name: str, devices: list[Any]) -> None:
    """Records the devices of a TPU mesh by name (DTensor's ``set_tpu_core_ids``).

    Raises:
      ValueError: DTensor's message if the name is already registered.
    """
    with self._lock:
      if name in self.state.tpu_meshes:
        # DTensor-compatible message.
        raise ValueError(f"Mesh name already in use: {name}")
      self.state.tpu_meshes[name] = list(devices)

  def registered_tpu_mesh_devices(self, name: str) -> list[Any] | None:
    """The devices `register_tpu_mesh` recorded for `name`, if any."""
    return self.state.tpu_meshes.get(name)

  def next_auto_mesh_name(self) -> str:
    """A default TPU mesh name that is the same on every client.

    DTensor uses ``"mesh_%f" % time.time()``, which differs between clients.
    """
    with self._lock:
      name = f"mesh_{self.state.auto_mesh_names}"
      self.state.auto_mesh_names += 1
      return name

  def test_checkpoint(self) -> tuple[dict[str, Any], dict[str, list[Any]], int]:
    """What a test body on a warm cluster (`jdtensor.testing`) may change
    here and in ``jax.config``, for `restore_test_checkpoint`."""
    import jax  # pylint: disable=g-import-not-at-top
    with self._lock:
      return (dict(jax.config.values), dict(self.state.tpu_meshes),
              self.state.auto_mesh_names)

  def restore_test_checkpoint(
      self, checkpoint: tuple[dict[str, Any], dict[str, list[Any]], int]) -> list[str]:
    """Puts back `test_checkpoint`'s values: the next test sees what a fresh
    client would (mesh names from ``mesh_0`` again). Returns the
    ``jax.config`` values that cannot be set back (why the cluster must go)."""
    import jax  # pylint: disable=g-import-not-at-top
    config, meshes, names = checkpoint
    failed = []
    with self._lock:
      self.state.tpu_meshes = dict(meshes)
      self.state.auto_mesh_names = names
      now = jax.config.values
      for name, value in config.items():
        if name in now and now[name] != value:
          try:
            jax.config.update(name, value)
          except Exception as e:  # pylint: disable=broad-except
            failed.append(f"jax.config {name} could not be set back to {value!r}: {e}")
    return failed

  def record_peer_failure(self, error: Exception) -> None:
    """Keeps a heartbeat failure to raise at the next jdtensor call."""
    with self._lock:
      if self.state.peer_failure is None:
        self.state.peer_failure = error

  def check_health(self) -> None:
    """Raises the recorded heartbeat failure (policy "raise"), if any."""
    if self.state.peer_failure is not None:
      raise self.state.peer_failure
