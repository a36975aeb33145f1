"""DTensor's accelerator-system entry points over the JAX runtime.

Environment variables read at initialisation (all parsed strictly):

* ``DTENSOR_JOBS``: comma-separated ``host:port`` per client, in client order.
  Unset or empty: local (single-client) mode. The first entry is the JAX
  coordinator's address.
* ``DTENSOR_CLIENT_ID``: this client's index in ``DTENSOR_JOBS`` (default 0).
* ``DTENSOR_JOB_NAME``: job name in device strings (default ``localhost`` for
  one client, ``worker`` otherwise).
* ``DTENSOR_NUM_CLIENTS`` (legacy): if set, must equal ``len(DTENSOR_JOBS)``.
* ``DTENSOR_ENABLE_HEARTBEAT``: start the heartbeat in multi-client runs
  (default true).
"""

from __future__ import annotations

from jdtensor import runtime

__all__ = [
    "initialize_accelerator_system",
    "initialize_multi_client",
    "initialize_tpu_system",
    "shutdown_accelerator_system",
    "shutdown_tpu_system",
    "is_initialized",
]


def initialize_accelerator_system(
    device_type: str | None = None,
    enable_coordination_service: bool | None = True,
    num_logical_cpu_devices: int | None = None,
    experimental_reset_context: bool | None = False,
    experimental_enable_megcore: bool | None = False,
) -> str:
  """Initialises the accelerator system (DTensor semantics, JAX underneath).

  Must run before any JAX call that starts the backend, since the simulated
  CPU device count can only be set before that.

  Args:
    device_type: CPU, GPU or TPU (any case); defaults to
      `jdtensor.preferred_device_type()`.
    enable_coordination_service: Kept for DTensor compatibility; JAX's
      multi-client runtime always uses its coordination service.
    num_logical_cpu_devices: Number of CPU devices for this client (JAX's
      ``jax_num_cpu_devices``). For GPU/TPU it defaults to at least the
      accelerator count, as in DTensor.
    experimental_reset_context: JAX cannot reset a running backend; with
      True, a running backend is kept (with DTensor's warning) instead of
      being an error.
    experimental_enable_megcore: TPU megacore (used by the TPU system).

  Returns:
    The initialised device type, upper-case.

  Raises:
    ValueError: DTensor's errors (already initialised, unknown device type,
      too few logical CPUs) and any invalid DTENSOR_* variable.
    RuntimeError: If a running JAX backend prevents the requested set-up.
  """
  del enable_coordination_service, experimental_enable_megcore  # See above.
  return runtime.initialize(
      device_type=device_type,
      num_logical_cpu_devices=num_logical_cpu_devices,
      experimental_reset_context=bool(experimental_reset_context))


def shutdown_accelerator_system() -> None:
  """Shuts the accelerator system down (DTensor semantics).

  Raises:
    ValueError: DTensor's message if it is not initialised.
  """
  runtime.shutdown()


def is_initialized() -> bool:
  """Whether the accelerator system is initialised."""
  return runtime.is_initialized()


# DTensor's aliases.
initialize_multi_client = initialize_accelerator_system
initialize_tpu_system = initialize_accelerator_system
shutdown_tpu_system = shutdown_accelerator_system
