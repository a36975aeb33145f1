"""DTensor's heartbeat service on JAX: a periodic tiny all-reduce on a thread.

Every client exchanges the same random token through an all-reduce every
`period` seconds; when a client dies, hangs or restarts, the others notice
within a bounded time and say who it was (TF DTensor's heartbeat logs forever
and never stops in its open-source build).

**Invisible to JAX.** XLA collectives on one device group are matched across
processes only by issue order, so a background all-reduce on devices that
user code also uses corrupts results or crashes gloo. The heartbeat therefore
runs on a private runtime that JAX's backend registry never sees
(`jdtensor._jax_private.PrivateRuntime`): its own coordination service on a
port client 0 reserved at start-up, its own CPU client with one device per
process, gloo collectives and a hand-written StableHLO all-reduce. The user's
``jax.devices()``, ``jax.make_mesh``, ``multihost_utils``, ``pmap`` and orbax
see exactly what raw ``jax.distributed`` shows. The private runtime starts on
the heartbeat thread, off the caller's critical path.

**Protocol** (DTensor's, plus an agreed stop). Client 0 draws a 16-bit token;
the first exchange spreads it. Every beat, each client puts the token in its
own slot and a stop flag in the last slot; the merged vector must hold the
token in every slot. A stop request (setting the returned Event, or exit)
travels inside the next beat, so every client stops after the same beat, and
then they tear the private runtime down together.

**Failure.** A beat that does not complete within ``max(3 s, 2 * period)``
is a failure; so is a slot that does not hold the token (a restarted or
out-of-sync client); so is a client whose process ends without saying goodbye
on its liveness link (`jdtensor._rendezvous.Links`), which is seen within
milliseconds, before JAX's own detection aborts the survivors. An overdue
beat holds a roll call in the private service's key-value store: the healthy
clients, blocked in the same beat, answer at once; those that do not are
named: ``heartbeat: client 2 missed beat 17
(last seen 3.1 s ago); stopping this client``. An exception in the
heartbeat's own code is this client's failure, reported with its traceback,
never blamed on a peer. Policies: ``terminate`` (default: exit with
`EXIT_CODE`), ``raise`` (`PeerFailureError` at the next jdtensor call),
``log`` (DTensor's open-source behaviour: log and carry on).

Where the private runtime cannot run (a jaxlib without the private symbols it
needs), `start` logs one warning naming the missing symbol and the jaxlib
version; the liveness links still catch dead clients.

Configuration: ``DTENSOR_ENABLE_HEARTBEAT`` (default true) starts it from
``initialize_accelerator_system`` in multi-client runs; ``JDTENSOR_HEARTBEAT_PERIOD``
(seconds, default 2) and ``JDTENSOR_HEARTBEAT_POLICY``.
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from jdtensor import _logging as logging

from jdtensor import _env, runtime
from jdtensor.errors import PEER_FAILURE_EXIT_CODE, ConfigError, PeerFailureError

__all__ = ["start", "current", "Heartbeat", "PrivateExchange", "read_period",
           "read_policy", "deadline_for", "EXIT_CODE", "OWN_FAILURE_EXIT_CODE",
           "DEFAULT_PERIOD", "POLICIES"]

EXIT_CODE = PEER_FAILURE_EXIT_CODE
# Exit code of a client whose own heartbeat failed (EX_SOFTWARE): a root
# cause, unlike EXIT_CODE.
OWN_FAILURE_EXIT_CODE = 70
DEFAULT_PERIOD = 2.0
POLICIES = ("terminate", "raise", "log")
# Seconds the first exchange may take beyond a beat's deadline: it also
# starts the private runtime (every client must connect) and compiles.
FIRST_EXCHANGE_ALLOWANCE = 30.0
# Seconds an overdue beat's roll call waits for the healthy clients to answer
# (they are blocked in the same beat, and their deadlines expire together).
ROLL_CALL_GRACE = 1.0
_KV_PREFIX = "jdtensor/heartbeat/"

_lock = threading.Lock()
_current: Heartbeat | None = None


def read_period(environ: Mapping[str, str] | None = None) -> float:
  """``JDTENSOR_HEARTBEAT_PERIOD`` in seconds (default 2)."""
  env = os.environ if environ is None else environ
  raw = env.get(_env.JDTENSOR_HEARTBEAT_PERIOD)
  return (DEFAULT_PERIOD if raw is None else
          _env.parse_positive_float(_env.JDTENSOR_HEARTBEAT_PERIOD, raw))


def read_policy(environ: Mapping[str, str] | None = None) -> str:
  """``JDTENSOR_HEARTBEAT_POLICY``: terminate (default), raise or log."""
  env = os.environ if environ is None else environ
  raw = env.get(_env.JDTENSOR_HEARTBEAT_POLICY, "terminate")
  return _check_policy(raw.strip().lower(), _env.JDTENSOR_HEARTBEAT_POLICY)


def _check_policy(policy: str, name: str = "policy") -> str:
  if policy not in POLICIES:
    raise ConfigError(f"{name}={policy!r} is not one of {', '.join(POLICIES)}.")
  return policy


def deadline_for(period: float) -> float:
  """Seconds a beat may take before it counts as missed."""
  return max(3.0, 2.0 * period)


class Heartbeat:
  """One client's heartbeat: a beat thread and a watchdog thread.

  Everything that touches the outside is injected, so the protocol runs with
  threads as clients in tests.

  Args:
    period: Seconds between beats.
    policy: terminate, raise or log.
    exchange: Sums one row per client across clients (the all-reduce); None
      runs on the liveness links alone (no beats).
    client_id: This client's id.
    num_clients: Number of clients.
    roll_call: ``roll_call(beat, grace)`` says "this client is in `beat`"
      where every client can see it, waits up to `grace` seconds for the
      others to say so too, and returns who did (None when unreachable).
      Called only when a beat is overdue, so a beat costs no extra I/O.
    terminate: Ends the process (policy terminate).
    announce: Tells the other clients who failed and why (the liveness
      links), so that a client stopping because of a peer is not blamed.
    on_failure: Receives the failure under policy raise (raised at the
      next jdtensor call).
    open_exchange: Run on the heartbeat thread before the first exchange
      (starts the private runtime), within the first exchange's deadline.
    close_exchange: Run on the heartbeat thread after an agreed stop, with a
      time-out in seconds (the collective teardown).
  """

  def __init__(self, period: float, policy: str,
               exchange: Callable[[np.ndarray], np.ndarray] | None,
               client_id: int, num_clients: int,
               roll_call: Callable[[int, float], set[int] | None] | None = None,
               terminate: Callable[[int], Any] = os._exit,
               announce: Callable[[list[int], str], None] | None = None,
               on_failure: Callable[[PeerFailureError], None] | None = None,
               open_exchange: Callable[[], None] | None = None,
               close_exchange: Callable[[float], bool] | None = None,
               close_timeout: float = 60.0):
    if not (isinstance(period, (int, float)) and math.isfinite(period) and period > 0):
      raise ConfigError(f"period={period!r} must be a finite number of seconds "
                        "greater than 0.")
    self.period = float(period)
    self.deadline = deadline_for(self.period)
    self.policy = _check_policy(policy)
    self.client_id, self.num_clients = client_id, num_clients
    self._exchange = exchange
    self._roll_call = roll_call or (lambda beat, grace: None)
    self._terminate = terminate
    self._announce = announce or (lambda clients, why: None)
    self._on_failure = on_failure or (lambda error: None)
    self._open = open_exchange
    self._close = close_exchange
    self._close_timeout = close_timeout
    self.event = threading.Event()  # Set by users (or at exit) to stop.
    self.stopped = threading.Event()  # Set once the beat thread has ended.
    self.ready = threading.Event()  # Set once the first exchange is done.
    self.token = 0
    self.beats = 0  # Completed beats after the first exchange.
    self.beat_seconds = 0.0  # Total wall time spent inside beats.
    self.failure: PeerFailureError | None = None
    self.closed_cleanly: bool | None = None  # Result of the teardown.
    self._beat_started: float | None = None
    self._beat_changed = threading.Condition()  # Wakes the watchdog.
    self._last_beat = time.monotonic()  # Every client was alive then.
    self._threads: list[threading.Thread] = []

  # -- protocol ---------------------------------------------------------------------

  def _row(self, signal: np.ndarray, stop: bool) -> np.ndarray:
    return np.append(signal, 1 if stop else 0).astype(np.int32)

  def _timed_exchange(self, row: np.ndarray) -> np.ndarray | None:
    """One beat; None (and the failure recorded) if the all-reduce failed.

    Only an error of the all-reduce itself is a missed beat; an error in the
    rest of this code is this client's own (see `_run`).
    """
    started = time.monotonic()
    with self._beat_changed:
      self._beat_started = started
      self._beat_changed.notify_all()
    try:
      merged = self._exchange(row)
    except Exception as e:  # pylint: disable=broad-except
      self._fail(*self._missed(self.beats + 1, self.deadline,
                               f" (the beat failed: {_first_line(e)})"))
      return None
    with self._beat_changed:
      self._last_beat = time.monotonic()
      self._beat_started = None
      self._beat_changed.notify_all()
    self.beat_seconds += self._last_beat - started
    return merged

  def first_exchange(self) -> None:
    """Starts the exchange and spreads client 0's token (DTensor's first
    all-reduce), with a deadline.

    Run by the heartbeat thread before its first beat (tests may call it).
    """
    n = self.num_clients
    if self.client_id == 0:
      token = int(np.random.default_rng().integers(0, 2**16 - 1))
      signal = np.full([n], token, np.int32)
    else:
      signal = np.zeros([n], np.int32)
    self._roll_call(0, 0.0)  # The start marker: "this client started".
    logging.info("Initial heartbeat signal: %s", signal)
    result: list[np.ndarray] = []
    errors: list[BaseException] = []
    open_errors: list[BaseException] = []

    def run() -> None:
      if self._open is not None:
        try:
          self._open()
        except BaseException as e:  # pylint: disable=broad-except
          open_errors.append(e)
          return
      try:
        result.append(self._exchange(self._row(signal, False)))
      except BaseException as e:  # pylint: disable=broad-except
        errors.append(e)
    thread = threading.Thread(target=run, daemon=True, name="jdtensor-hb-first")
    thread.start()
    thread.join(self.deadline + FIRST_EXCHANGE_ALLOWANCE)
    if open_errors:  # Starting our own end of the exchange failed.
      self._own_failure(open_errors[0])
      return
    if not result:
      detail = f" (it failed: {_first_line(errors[0])})" if errors else ""
      self._fail(*self._missed(0, self.deadline + FIRST_EXCHANGE_ALLOWANCE,
                               detail))
      return
    merged = result[0][:n]
    logging.info("Merged heartbeat signal %s", merged)
    if self.client_id == 0 and not np.all(merged == token):
      bad = [c for c in range(n) if merged[c] != token]
      self._fail(f"heartbeat: Merged heartbeat signal has value != {token} "
                 f"(clients {', '.join(map(str, bad))})", bad)
    elif len(set(merged.tolist())) != 1:
      self._fail("heartbeat: Merged heartbeat signal has unequal elements "
                 f"{merged.tolist()}", list(range(n)))
    self.token = int(merged[0])
    self.ready.set()

  def _run(self) -> None:
    """The heartbeat thread: the first exchange, beats, then the teardown."""
    try:
      if self._exchange is None:
        self.ready.set()
        self.event.wait()  # Links only: nothing to beat; wait for the stop.
        return
      if not self.ready.is_set() and self.failure is None:
        self.first_exchange()
      if self.failure is None:
        self._loop()
      if self.failure is None and self._close is not None:
        self.closed_cleanly = self._close(self._close_timeout)
    except BaseException as e:  # pylint: disable=broad-except
      self._own_failure(e)
    finally:
      self.stopped.set()
      with self._beat_changed:
        self._beat_changed.notify_all()

  def _loop(self) -> None:
    logging.info("Starting a heartbeat thread")
    n = self.num_clients
    while self.failure is None:
      stop = self.event.wait(self.period)
      signal = np.zeros([n], np.int32)
      signal[self.client_id] = self.token
      merged = self._timed_exchange(self._row(signal, stop))
      if merged is None:
        break
      self.beats += 1
      logging.vlog(2, "Received heartbeat signal %s", merged)
      if np.any(merged[:n] != self.token):
        self._token_mismatch(merged[:n])
        break
      if merged[n] > 0:
        logging.info("Exiting the heartbeat thread normally")
        break

  def _token_mismatch(self, slots: np.ndarray) -> None:
    """Names the out-of-sync clients: those not holding the cluster's token.

    The cluster's token is the one most slots hold (client 0's on a tie), so
    a restarted client blames itself rather than everyone else.
    """
    me = self.client_id
    if int(slots[me]) != self.token:
      # Only this client writes its slot: the exchange itself is broken.
      self._fail(f"heartbeat: beat {self.beats} returned a wrong sum: this "
                 f"client ({me}) sent token {self.token} but its slot holds "
                 f"{int(slots[me])} (all slots: {slots.tolist()})", [me])
      return
    values, counts = np.unique(slots, return_counts=True)
    best = values[counts == counts.max()]
    cluster_token = int(slots[0]) if len(best) > 1 else int(best[0])
    wrong = [c for c in range(len(slots)) if slots[c] != cluster_token]
    if me in wrong:
      self._fail(f"heartbeat: this client ({me}) is out of sync: it sent token "
                 f"{self.token}, the cluster's is {cluster_token} in beat "
                 f"{self.beats}", [me])
      return
    who = ", ".join(map(str, wrong))
    sent = ", ".join(str(int(slots[c])) for c in wrong)
    self._fail(f"heartbeat: client{'s' if len(wrong) > 1 else ''} {who} sent token "
               f"{sent} instead of {cluster_token} in beat {self.beats} "
               f"(restarted or out of sync)", wrong)

  def _watch(self) -> None:
    """Sleeps until a beat starts, then until it ends or its deadline passes."""
    try:
      with self._beat_changed:
        while not self.stopped.is_set():
          started = self._beat_started
          if started is None:
            self._beat_changed.wait()  # Woken when a beat starts (or stops).
            continue
          remaining = started + self.deadline - time.monotonic()
          if remaining > 0:
            self._beat_changed.wait(remaining)  # Woken when the beat ends.
            continue
          break  # This beat is overdue.
      if not self.stopped.is_set():
        self._fail(*self._missed(self.beats + 1, self.deadline, ""))
    except BaseException as e:  # pylint: disable=broad-except
      self._own_failure(e)

  # -- failure --------------------------------------------------------------------------

  def _consequence(self) -> str:
    return {"terminate": "stopping this client",
            "raise": "raising PeerFailureError at the next jdtensor call",
            "log": "carrying on (policy 'log')"}[self.policy]

  def _missed(self, beat: int, waited: float, detail: str
              ) -> tuple[str, list[int]]:
    """What to say about a beat that did not complete, and whom to name.

    A roll call: every healthy client blocked in the same beat answers it
    within a moment; the ones that do not are the culprits.
    """
    others = [c for c in range(self.num_clients) if c != self.client_id]
    present = self._roll_call(beat, ROLL_CALL_GRACE)
    if present is None:
      return (f"heartbeat: beat {beat} did not complete within {waited:g} s"
              f"{detail}; the heartbeat's coordination service (client 0) is "
              "unreachable", [0])
    missing = [c for c in others if c not in present]
    if not missing:
      return (f"heartbeat: beat {beat} did not complete within {waited:g} s "
              f"although every client started it{detail}", others)
    s = "s" if len(missing) > 1 else ""
    who = ", ".join(map(str, missing))
    if beat == 0:
      text = f"client{s} {who} did not start the heartbeat within {waited:g} s"
    else:
      age = time.monotonic() - self._last_beat
      text = f"client{s} {who} missed beat {beat} (last seen {age:.1f} s ago)"
    return f"heartbeat: {text}{detail}", missing

  def _fail(self, core: str, ids: list[int], exit_code: int = EXIT_CODE) -> None:
    """Records a failure (`core` says what happened) and applies the policy."""
    if self.failure is not None:
      return
    message = f"{core}; {self._consequence()}"
    error = PeerFailureError(message, tuple(ids))
    self.failure = error
    culprits = [c for c in error.client_ids if c != self.client_id]
    if culprits:
      self._announce(culprits, core)
    elif exit_code != EXIT_CODE:  # Our own failure: say it was ours.
      self._announce([self.client_id], core)
    if self.policy == "terminate":
      # One plain line, certain to be seen, then exit without JAX's shutdown
      # barrier (it would wait for the dead client).
      sys.stderr.write(message + "\n")
      sys.stderr.flush()
      self._terminate(exit_code)
      return
    logging.error("%s", message)
    if self.policy == "raise":
      self._on_failure(error)
    self.stopped.set()
    with self._beat_changed:
      self._beat_changed.notify_all()

  def _own_failure(self, error: BaseException) -> None:
    """An exception in the heartbeat's own code: this client's failure."""
    trace = "".join(traceback.format_exception(error)).rstrip()
    self._fail(f"heartbeat: this client's ({self.client_id}) heartbeat failed "
               f"in its own code: {type(error).__name__}: {error}\n{trace}\n",
               [self.client_id], exit_code=OWN_FAILURE_EXIT_CODE)

  def peer_died(self, client: int, how: str) -> None:
    """A liveness link saw `client`'s process end (no beat can succeed now)."""
    if self.stopped.is_set() and self.failure is None:
      return  # We already stopped by agreement; a late exit is not a failure.
    if self._exchange is None:  # Links only: there are no beats to speak of.
      self._fail(f"heartbeat: client {client} is gone ({how})", [client])
      return
    age = time.monotonic() - self._last_beat
    self._fail(f"heartbeat: client {client} missed beat {self.beats + 1} (last "
               f"seen {age:.1f} s ago; {how})", [client])

  def peer_reported(self, clients: list[int], why: str, reporter: int) -> None:
    """Another client found `clients` failed (relayed by the liveness links)."""
    if self.stopped.is_set() and self.failure is None:
      return
    self._fail(f"{why} (reported by client {reporter})", clients)

  # -- lifecycle ---------------------------------------------------------------------------

  def start_threads(self) -> None:
    targets = [(self._run, "jdtensor-heartbeat")]
    if self._exchange is not None:
      targets.append((self._watch, "jdtensor-heartbeat-watchdog"))
    for target, name in targets:
      thread = threading.Thread(target=target, daemon=True, name=name)
      thread.start()
      self._threads.append(thread)

  def stop(self, timeout: float | None = None) -> bool:
    """Requests the agreed stop and waits for it (and the teardown).

    Returns:
      True if the heartbeat stopped in time.
    """
    logging.info("Stopping the heartbeat thread")
    self.event.set()
    if timeout is None:
      timeout = self.period + self.deadline + self._close_timeout
    return self.stopped.wait(timeout)


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return text[0] if text else type(error).__name__


class PrivateExchange:
  """The production exchange: an all-reduce on the private runtime.

  `open` (on the heartbeat thread) starts the runtime. A beat costs one
  all-reduce and nothing else; only an overdue beat holds a roll call in the
  runtime's key-value store. A client's start marker goes to the user's
  coordination service (the private one connects only once every client has
  started), so that a client that never starts the heartbeat can be named.

  Args:
    client_id, num_clients: This client and the cluster size.
    width: Length of the summed vector.
    service: (host, port, reserved socket) from `runtime.heartbeat_service`.
    gloo_host: Host gloo listens on, or None.
    shutdown_timeout: Seconds the collective teardown may wait.
  """

  def __init__(self, client_id: int, num_clients: int, width: int,
               service: tuple[str, int, Any], gloo_host: str | None,
               shutdown_timeout: float):
    self.client_id, self.num_clients, self.width = client_id, num_clients, width
    self._service = service
    self._gloo_host = gloo_host
    self._shutdown_timeout = shutdown_timeout
    self.runtime: Any = None

  def open(self) -> None:
    from jdtensor import _jax_private  # pylint: disable=g-import-not-at-top
    host, port, reserved = self._service
    # No time-out of its own: jdtensor's watchdog bounds the first exchange,
    # and the private runtime's time-outs abort the process from C++.
    self.runtime = _jax_private.PrivateRuntime(
        self.client_id, self.num_clients, host, port, self._gloo_host,
        self.width, connect_timeout=24 * 3600, service_socket=reserved,
        shutdown_timeout=self._shutdown_timeout)

  def __call__(self, row: np.ndarray) -> np.ndarray:
    return self.runtime.all_reduce(row)

  def roll_call(self, beat: int, grace: float) -> set[int] | None:
    """Says "this client is in `beat`"; who else said so within `grace` s.

    Beat 0 (the start) goes to the user's coordination service: the private
    one is not connected until every client has started.
    """
    if beat == 0 or self.runtime is None:
      prefix = f"{_KV_PREFIX}started/"
      store = runtime.coordination_client()  # The user's service.
    else:
      prefix = f"{_KV_PREFIX}beat/{beat}/"
      store = self.runtime.client  # The private one.
    # Each call on a helper thread: a dead coordinator cannot block us.
    if _bounded(lambda: store.key_value_set(f"{prefix}{self.client_id}", "1",
                                            allow_overwrite=True) or True,
                timeout=1.0) is None:
      return None
    deadline = time.monotonic() + grace
    while True:
      entries = _bounded(lambda: dict(store.key_value_dir_get(prefix)),
                         timeout=1.0)
      if entries is None:
        return None
      present = {int(key.rsplit("/", 1)[-1]) for key in entries}
      if len(present) >= self.num_clients or time.monotonic() >= deadline:
        return present
      time.sleep(0.05)

  def close(self, timeout: float) -> bool:
    return self.runtime.close(timeout) if self.runtime is not None else True


def _bounded(fn: Callable[[], Any], timeout: float) -> Any:
  """`fn()` on a helper thread; None if it fails or takes over `timeout` s."""
  out: list[Any] = []

  def call() -> None:
    try:
      out.append(fn())
    except Exception:  # pylint: disable=broad-except
      pass
  thread = threading.Thread(target=call, daemon=True, name="jdtensor-kv")
  thread.start()
  thread.join(timeout)
  return out[0] if out else None


def current() -> Heartbeat | None:
  """The heartbeat started in this process, if any."""
  return _current


_warned_unavailable = False


def _warn_links_only(reason: str) -> None:
  global _warned_unavailable
  if not _warned_unavailable:
    _warned_unavailable = True
    logging.warning(
        "heartbeat: %s The heartbeat runs on the liveness links only: a client "
        "whose process ends is still detected at once; a stuck or out-of-sync "
        "client is not.", reason)


def start(period: float, policy: str | None = None) -> threading.Event:
  """Starts the heartbeat (DTensor's ``heartbeat.start``).

  Every client must call it (jdtensor does so in
  `initialize_accelerator_system` when ``DTENSOR_ENABLE_HEARTBEAT`` is true).

  Args:
    period: Seconds between beats.
    policy: terminate, raise or log; default ``JDTENSOR_HEARTBEAT_POLICY``.

  Returns:
    An Event: set it to stop the heartbeat (on every client, after the same
    beat). A second call logs DTensor's warning and returns the running one.

  Raises:
    NotInitializedError: Outside an initialised multi-client run.
    ConfigError: For a bad period or policy.
    RuntimeError: If a heartbeat already ran in this process and stopped.
  """
  global _current
  with _lock:
    if _current is not None and not _current.stopped.is_set():
      logging.warning("A heartbeat thread is already running, skipping this one.")
      return _current.event
    if _current is not None:
      raise RuntimeError(
          "The heartbeat already ran in this process and has stopped; it "
          "cannot be started again (its private runtime is torn down). Start "
          "it once per run.")
    service = runtime.heartbeat_service()
    state = runtime.state()
    env = state.env
    if env is None:
      raise RuntimeError("jdtensor runtime state lost its cluster.")
    policy = read_policy() if policy is None else policy
    links = state.links
    common = dict(terminate=os._exit,
                  announce=links.report if links is not None else None,
                  on_failure=runtime.record_peer_failure)
    from jdtensor import _jax_private  # pylint: disable=g-import-not-at-top
    reason = _jax_private.unavailable_reason()
    if reason is not None:
      if service[2] is not None:
        service[2].close()
      _warn_links_only(reason)
      heartbeat = Heartbeat(period, policy, None, env.client_id, env.num_clients,
                            **common)
    else:
      exchange = PrivateExchange(env.client_id, env.num_clients,
                                 env.num_clients + 1, service, state.gloo_host,
                                 state.timeouts.shutdown)
      heartbeat = Heartbeat(period, policy, exchange, env.client_id,
                            env.num_clients, roll_call=exchange.roll_call,
                            open_exchange=exchange.open,
                            close_exchange=exchange.close,
                            close_timeout=state.timeouts.shutdown, **common)
    # The private runtime starts and the first exchange runs on the heartbeat
    # thread, off the caller's critical path.
    heartbeat.start_threads()
    atexit.register(heartbeat.stop)
    if links is not None:
      links.watch(heartbeat.peer_died, heartbeat.peer_reported)
    _current = heartbeat
    return heartbeat.event
