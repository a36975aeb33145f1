"""Exception types raised by jdtensor.

Every exception subclasses the built-in type a DTensor user already catches
(`ValueError` for bad values, `RuntimeError` for calls in the wrong state), so
code written against TF DTensor keeps working, while new code can catch the
more specific jdtensor types.
"""

from __future__ import annotations

__all__ = [
    "JDTensorError",
    "ConfigError",
    "NotInitializedError",
    "AlreadyInitializedError",
    "StartupError",
    "StartupTimeoutError",
    "BarrierTimeoutError",
]


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
