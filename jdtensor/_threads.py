"""Helper threads where the interpreter may refuse to start one.

Python 3.12 refuses a new thread from the moment its finalisation begins
(``RuntimeError: can't create new thread at interpreter shutdown``): while
it waits for the non-daemon threads and while it runs the exit handlers.
That is exactly the window in which a client's heartbeat still beats
towards the run's agreed end, so on 3.12 a helper thread that cannot start
is an ordinary moment of every clean exit, not an error (3.11 and 3.13
start it). Every helper thread jdtensor starts goes through `start_daemon`,
and each caller says what it does instead when none starts.

Standard library only: the launcher's parent uses it too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["start_daemon", "call_bounded"]


def start_daemon(target: Callable[[], Any], name: str) -> threading.Thread | None:
  """Starts `target` on a daemon thread called `name`.

  Returns:
    The started thread, or None where the interpreter is shutting down and
    refuses new threads (Python 3.12).
  """
  thread = threading.Thread(target=target, name=name, daemon=True)
  try:
    thread.start()
  except RuntimeError:
    # The only RuntimeError `start` raises for a fresh thread besides this
    # one is "threads can only be started once", which cannot happen here.
    return None
  return thread


def call_bounded(fn: Callable[[], Any], timeout: float, name: str = "jdtensor-call") -> Any:
  """`fn()` on a helper thread, waited for at most `timeout` seconds.

  Returns:
    What `fn` returned; None if it raised, took longer than `timeout`, or
    no helper thread could start (the interpreter is shutting down: `fn` is
    then not called at all, since an unbounded call on the calling thread
    is what the helper is there to avoid).
  """
  out: list[Any] = []

  def call() -> None:
    try:
      out.append(fn())
    except Exception:  # pylint: disable=broad-except
      pass
  thread = start_daemon(call, name)
  if thread is None:
    return None
  thread.join(timeout)
  return out[0] if out else None
