"""Exception types raised by jdtensor.

Every exception subclasses the built-in type a DTensor user already catches
(`ValueError` for bad values, `RuntimeError` for calls in the wrong state), so
code written against TF DTensor keeps working, while new code can catch the
more specific jdtensor types.
"""

from __future__ import annotations

__all__ = [
    "PEER_FAILURE_EXIT_CODE",
    "OWN_FAILURE_EXIT_CODE",
    "LAUNCH_TIMEOUT_EXIT_CODE",
    "inherited_client_message",
    "JDTensorError",
    "ConfigError",
    "NotInitializedError",
    "AlreadyInitializedError",
    "StartupError",
    "StartupTimeoutError",
    "BarrierTimeoutError",
    "PeerFailureError",
]


# Every exit code jdtensor chooses. A client the heartbeat stopped because
# another client failed: EX_TEMPFAIL (restarting the job may help), a
# consequence, never a root cause (the launcher tells them apart by it).
PEER_FAILURE_EXIT_CODE = 75
# A client the heartbeat found to be the cause itself (it stalled, was
# frozen, never joined the collective the others waited in): EX_SOFTWARE.
OWN_FAILURE_EXIT_CODE = 70
# `jdtensor launch --timeout` expired (timeout(1)'s code).
LAUNCH_TIMEOUT_EXIT_CODE = 124


class JDTensorError(Exception):
  """Base class of every jdtensor-specific exception."""


class ConfigError(JDTensorError, ValueError):
  """A DTENSOR_*/JDTENSOR_* environment variable or argument is invalid.

  The message names the variable, shows its value and says how to fix it.
  """


class NotInitializedError(JDTensorError, ValueError):
  """An API that needs `initialize_accelerator_system()` was called first.

  Subclasses `ValueError` because that is what TF DTensor raises here.
  """


class AlreadyInitializedError(JDTensorError, ValueError):
  """`initialize_accelerator_system()` was called twice.

  Subclasses `ValueError` because that is what TF DTensor raises here.
  """


class StartupError(JDTensorError, OSError):
  """Multi-client start-up failed before JAX could abort the process."""


class StartupTimeoutError(StartupError, TimeoutError):
  """The coordinator did not become reachable within the start-up timeout."""


class BarrierTimeoutError(JDTensorError, TimeoutError):
  """Not every client reached a `barrier` within its time-out."""


class PeerFailureError(JDTensorError, RuntimeError):
  """The heartbeat found a dead, stuck or out-of-sync client.

  Attributes:
    client_ids: The clients that failed.
  """

  def __init__(self, message: str, client_ids: tuple[int, ...] = ()):
    super().__init__(message)
    self.client_ids = tuple(client_ids)


def inherited_client_message(pid: int, client: int, parent: int) -> str:
  """Why process `pid`, a child of client `client`'s process `parent` with
  its DTENSOR_*, cannot start: the same for a 'spawn' child (a fresh
  process) and a 'fork' child (a copy of the initialised one)."""
  return (f"this process (pid {pid}) inherited client {client}'s DTENSOR_* "
          f"variables from process {parent}, which is client {client} of this "
          "run already; a child process (a data-loader worker, a "
          "multiprocessing 'spawn' or 'fork' child) cannot join as the same "
          "client. Call initialize_accelerator_system only in the client's own "
          "process (a worker needs no multi-client runtime), or remove "
          "DTENSOR_* from the child's environment to run it on its own.")
