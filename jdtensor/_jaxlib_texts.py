"""Every text of JAX's and jaxlib's that jdtensor reads, in one module.

PURE: standard library only (the launcher's parent reads gloo's notice too).
These are not API: a jaxlib that rewords one makes the code that matches it
silently stop matching. So each is named here, with what reads it and the
test that produces the real text on the installed JAX (`PROBES`); the
private-JAX module (`jdtensor.runtime.jax_private`) lists them beside its
symbol table, and CONTRIBUTING.md's "Testing a new JAX" runs those tests.
"""

from __future__ import annotations

import re

__all__ = ["GLOO_NOTICE_MARKERS", "GLOO_NOTICE_FRAGMENTS", "GLOO_NOTICE_LEFTOVER",
           "GLOO_NOTICE_LABELS", "GLOO_NOTICE_PIECES", "GLOO_PEER_LOST",
           "GLOO_NEVER_JOINED", "GLOO_KEY_PREFIX", "SERVICE_WAIT_CALLS",
           "BARRIER_DEADLINE_EXCEEDED", "PROBES"]

# The patterns are compiled on first use (`__getattr__`): a client on its
# happy path never matches one, and compiling them all costs about 1 ms of
# every client's start-up.
_PATTERNS: dict[str, tuple[str, int]] = {
    # Gloo prints "[Gloo] Rank r is connected to k peer ranks. Expected number
    # of connected peer ranks is : k" whenever a device group first
    # communicates (jax-ml/jax#32673); the threads of several devices
    # interleave its fragments. The launcher drops it from the clients' output.
    "GLOO_NOTICE_MARKERS": (r"\[Gloo\]|peer ranks|is connected to", 0),
    "GLOO_NOTICE_FRAGMENTS": (r"\[Gloo\] Rank|is connected to|Expected number of "
                              r"connected peer ranks is :|peer ranks\.?|\d+|\s+", 0),
    # What may be left of a notice on a line of its own (a lone number, nothing).
    "GLOO_NOTICE_LEFTOVER": (r"\s*\d*\s*", 0),
    # The notice is eight writes ("[Gloo] Rank ", r, " is connected to ", k,
    # " peer ranks. ", "Expected number ... is : ", k, "\n"), so a line of the
    # program's own can hold some of them (its text is one write, its newline
    # another). Only these two labels are the notice's alone.
    "GLOO_NOTICE_LABELS": (r"\[Gloo\] Rank |Expected number of connected peer ranks is :", 0),
    # Its labels, split out of a line (the group keeps them in `re.split`).
    "GLOO_NOTICE_PIECES": (r"(\[Gloo\] Rank | ?is connected to | ?peer ranks\. ?|"
                           r"Expected number of connected peer ranks is : ?)", 0),
    # gloo's errors when the other end of one of its connections went away (a
    # client's collective failed because another client's process ended).
    "GLOO_PEER_LOST": (r"Connection (?:reset|closed) by peer|Broken pipe|"
                       r"Socket closed|\b(?:Read|Write) error\b", 0),
    # XLA's error when a gloo communicator's set-up (a device group's first
    # collective) gave up waiting for a client that never arrived; jaxlib
    # 0.10.2 waits 30 s and has no setting for it.
    "GLOO_NEVER_JOINED": (r"Gloo context initialization failed: DEADLINE_EXCEEDED"
                          r"(?:.*?duration: ([\d.]+)s)?", re.S),
}
# Declared for readers and type checkers; the values come from `__getattr__`.
GLOO_NOTICE_MARKERS: re.Pattern[str]
GLOO_NOTICE_FRAGMENTS: re.Pattern[str]
GLOO_NOTICE_LEFTOVER: re.Pattern[str]
GLOO_NOTICE_LABELS: re.Pattern[str]
GLOO_NOTICE_PIECES: re.Pattern[str]
GLOO_PEER_LOST: re.Pattern[str]
GLOO_NEVER_JOINED: re.Pattern[str]

# The user's CPU backend keys each gloo communicator it sets up in the user's
# coordination service as "cpu:gloo/<global device ids>/<rank>" (XLA's gloo
# collectives under the CPU client's "cpu:" prefix). jdtensor reads it to
# tell whether a client has joined a collective yet.
GLOO_KEY_PREFIX = "cpu:gloo/"

# The qualified names of the coordination-service client's methods that wait
# for other clients (a barrier, a key another client sets), separated by
# spaces: a client that comes out of one has met the others
# (`jdtensor.heartbeat.meetings`).
SERVICE_WAIT_CALLS = ("DistributedRuntimeClient.wait_at_barrier "
                      "DistributedRuntimeClient.blocking_key_value_get "
                      "DistributedRuntimeClient.blocking_key_value_get_bytes")

# The status of a coordination-service barrier that timed out (the error's
# text; the exception type, JaxRuntimeError, has no stable import path).
BARRIER_DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"

# Which test produces each text on the installed JAX and fails if jdtensor no
# longer recognises it ("path::test", run by "Testing a new JAX").
PROBES = {
    "GLOO_NOTICE_MARKERS": "tests/multiprocess/test_jaxlib_texts.py::"
                           "test_gloo_s_connection_notice_is_still_printed_and_recognised",
    "GLOO_NOTICE_FRAGMENTS": "tests/multiprocess/test_jaxlib_texts.py::"
                             "test_gloo_s_connection_notice_is_still_printed_and_recognised",
    "GLOO_NOTICE_LEFTOVER": "tests/unit/test_launcher_output.py::"
                            "test_gloo_notices_and_their_fragments_are_dropped",
    "GLOO_NOTICE_LABELS": "tests/multiprocess/test_jaxlib_texts.py::"
                          "test_gloo_s_connection_notice_is_still_printed_and_recognised",
    "GLOO_NOTICE_PIECES": "tests/multiprocess/test_jaxlib_texts.py::"
                          "test_gloo_s_connection_notice_is_still_printed_and_recognised",
    "GLOO_PEER_LOST": "tests/multiprocess/test_failure_modes.py::"
                      "test_a_sigkill_mid_collective_is_the_root_cause_not_the_peers_gloo_error",
    "GLOO_NEVER_JOINED": "tests/multiprocess/test_waiting.py::"
                         "test_a_slow_first_collective_is_not_killed_and_the_late_client_is_named",
    "GLOO_KEY_PREFIX": "tests/multiprocess/test_waiting.py::"
                       "test_a_slow_first_collective_is_not_killed_and_the_late_client_is_named",
    "SERVICE_WAIT_CALLS": "tests/multiprocess/test_hang_triage.py::"
                          "test_a_stall_between_service_barriers_is_named",
    "BARRIER_DEADLINE_EXCEEDED": "tests/multiprocess/test_multi_client.py::"
                                 "test_barrier_timeout_raises_instead_of_hanging",
}


def __getattr__(name: str) -> re.Pattern[str]:
  """Compiles a pattern of `_PATTERNS` on first use and keeps it."""
  try:
    source, flags = _PATTERNS[name]
  except KeyError:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
  pattern = globals()[name] = re.compile(source, flags)
  return pattern


def text(name: str) -> str:
  """The text `name` matches on: a pattern's source, or the literal text.
  Compiles nothing."""
  if name in _PATTERNS:
    return _PATTERNS[name][0]
  value = globals()[name]
  if not isinstance(value, str):
    raise KeyError(f"{name!r} is not one of jdtensor's jaxlib texts.")
  return value
