"""One long XLA call, for clients that must be busy (slow, never stalled)."""

import time


def one_long_call(a, seconds: float, iters: int = 10) -> float:
  """Runs ``tanh(a @ a)`` in one XLA call on `a`'s device until one call has
  lasted at least `seconds`, whatever the machine's speed or load: the trip
  count is an argument (one compile), grown from a short call until a call
  lasts long enough. Returns the longest call's seconds."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  spin = jax.jit(lambda v, n: jax.lax.fori_loop(0, n, lambda i, w: jnp.tanh(w @ w), v))
  longest = 0.0
  jax.block_until_ready(spin(a, 1))
  while longest < seconds:
    t = time.perf_counter()
    jax.block_until_ready(spin(a, iters))
    took = time.perf_counter() - t
    longest = max(longest, took)
    iters = int(iters * min(max(1.3 * seconds / max(took, 1e-3), 1.5), 1000))
  return longest
