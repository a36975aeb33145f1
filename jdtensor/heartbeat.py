"""DTensor's heartbeat service on JAX: a periodic tiny psum on a thread.

Every client exchanges the same random token through an all-reduce every
`period` seconds; when a client dies, hangs or restarts, the others notice
within a bounded time and say who it was (TF DTensor's heartbeat logs forever
and never stops in its open-source build).

**Safe by construction.** XLA collectives on one device group are matched
across processes only by issue order, so a background psum over devices that
user code also reduces over corrupts results or crashes gloo. The heartbeat
therefore runs on a device group that is never used by anything else: one
extra, hidden CPU device per client (`jdtensor.runtime.heartbeat_devices`),
which no jdtensor mesh, device list or API ever contains. The one rule for
users: do not build meshes from raw ``jax.devices()`` in a multi-client run
(that list includes the hidden devices); use jdtensor's meshes or
``jdtensor.local_devices()``.

**Protocol** (DTensor's, plus an agreed stop). Client 0 draws a 16-bit token;
the first exchange spreads it. Every beat, each client puts the token in its
own slot and a stop flag in the last slot; the merged vector must hold the
token in every slot. A stop request (setting the returned Event, or exit)
travels inside the next beat, so every client stops after the same beat and
no psum is left unmatched at exit.

**Failure.** A beat that does not complete within ``max(3 s, 2 * period)``
is a failure; so is a slot that does not hold the token (a restarted or
out-of-sync client); so is a client whose process ends without saying goodbye
on its liveness link (`jdtensor._rendezvous.Links`), which is seen within
milliseconds, before JAX's own detection aborts the survivors. Each client records its last beat in the coordination
service's key-value store, which names the clients that did not contribute:
``heartbeat: client 2 missed beat 17 (last seen 3.1 s ago); stopping this
client``. Policies: ``terminate`` (default: exit with `EXIT_CODE`),
``raise`` (`PeerFailureError` at the next jdtensor call), ``log`` (DTensor's
open-source behaviour: log and carry on).

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
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from jdtensor import _logging as logging

from jdtensor import _env, runtime
from jdtensor.errors import PEER_FAILURE_EXIT_CODE, ConfigError, PeerFailureError

__all__ = ["start", "current", "Heartbeat", "read_period", "read_policy",
           "deadline_for", "EXIT_CODE", "DEFAULT_PERIOD", "POLICIES"]

EXIT_CODE = PEER_FAILURE_EXIT_CODE
DEFAULT_PERIOD = 2.0
POLICIES = ("terminate", "raise", "log")
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


class _PsumExchange:
  """One beat: a psum of each client's row over the reserved devices."""

  def __init__(self, devices: list[Any], client_id: int, width: int):
    import jax  # pylint: disable=g-import-not-at-top
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
    array = np.empty(len(devices), dtype=object)
    array[:] = devices
    mesh = Mesh(array, ("clients",))
    self._device = devices[client_id]
    self._shape = (len(devices), width)
    self._sharding = NamedSharding(mesh, PartitionSpec("clients"))
    self._sum = jax.jit(lambda rows: rows.sum(axis=0),
                        out_shardings=NamedSharding(mesh, PartitionSpec()))

  def __call__(self, row: np.ndarray) -> np.ndarray:
    import jax  # pylint: disable=g-import-not-at-top
    local = jax.device_put(row.astype(np.int32)[None, :], self._device)
    rows = jax.make_array_from_single_device_arrays(self._shape, self._sharding,
                                                    [local])
    return np.asarray(self._sum(rows).addressable_data(0))


class Heartbeat:
  """One client's heartbeat: a beat thread and a watchdog thread.

  Args:
    period: Seconds between beats.
    policy: terminate, raise or log.
    exchange: Sums one row per client across clients (the psum).
    client_id: This client's id.
    num_clients: Number of clients.
    record_beat: Stores ``(beat, wall time)`` for this client where every
      client can read it; default the coordination key-value store.
    read_beats: Reads every client's record (None when unreachable).
    terminate: Ends the process (policy terminate).
    announce: Tells the other clients who failed and why (the liveness
      links), so that a client stopping because of a peer is not blamed.
  """

  def __init__(self, period: float, policy: str,
               exchange: Callable[[np.ndarray], np.ndarray],
               client_id: int, num_clients: int,
               record_beat: Callable[[int, int, float], None] | None = None,
               read_beats: Callable[[], dict[int, tuple[int, float]] | None] | None = None,
               terminate: Callable[[int], Any] = os._exit,
               announce: Callable[[list[int], str], None] | None = None):
    if not (isinstance(period, (int, float)) and math.isfinite(period) and period > 0):
      raise ConfigError(f"period={period!r} must be a finite number of seconds "
                        "greater than 0.")
    self.period = float(period)
    self.deadline = deadline_for(self.period)
    self.policy = _check_policy(policy)
    self.client_id, self.num_clients = client_id, num_clients
    self._exchange = exchange
    self._record = record_beat or _kv_record
    self._read = read_beats or _kv_read
    self._terminate = terminate
    self._announce = announce or (lambda clients, why: None)
    self.event = threading.Event()  # Set by users (or at exit) to stop.
    self.stopped = threading.Event()  # Set once the beat thread has ended.
    self.ready = threading.Event()  # Set once the first exchange is done.
    self.token = 0
    self.beats = 0  # Completed beats after the first exchange.
    self.beat_seconds = 0.0  # Total wall time spent inside beats.
    self.failure: PeerFailureError | None = None
    self._beat_started: float | None = None
    self._beat_changed = threading.Condition()  # Wakes the watchdog.
    self._last_beat = time.monotonic()  # Every client was alive then.
    self._threads: list[threading.Thread] = []

  # -- protocol ---------------------------------------------------------------------

  def _row(self, signal: np.ndarray, stop: bool) -> np.ndarray:
    return np.append(signal, 1 if stop else 0).astype(np.int32)

  def _timed_exchange(self, row: np.ndarray) -> np.ndarray:
    self._record(self.client_id, self.beats + 1, time.time())
    started = time.monotonic()
    with self._beat_changed:
      self._beat_started = started
      self._beat_changed.notify_all()
    merged = self._exchange(row)
    with self._beat_changed:
      self._last_beat = time.monotonic()
      self._beat_started = None
      self._beat_changed.notify_all()
    self.beat_seconds += self._last_beat - started
    return merged

  def first_exchange(self) -> None:
    """Spreads client 0's token (DTensor's first all-reduce), with a deadline.

    Run by the heartbeat thread before its first beat (tests may call it).
    """
    n = self.num_clients
    if self.client_id == 0:
      token = int(np.random.default_rng().integers(0, 2**16 - 1))
      signal = np.full([n], token, np.int32)
    else:
      signal = np.zeros([n], np.int32)
    logging.info("Initial heartbeat signal: %s", signal)
    result: list[np.ndarray] = []
    errors: list[BaseException] = []

    def run() -> None:
      try:
        result.append(self._exchange(self._row(signal, False)))
      except BaseException as e:  # pylint: disable=broad-except
        errors.append(e)
    thread = threading.Thread(target=run, daemon=True, name="jdtensor-hb-first")
    thread.start()
    thread.join(self.deadline + 30)  # First beat also compiles the psum.
    if not result:
      detail = f": {errors[0]}" if errors else ""
      self._fail(self._missed_message(0, detail))
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
    """The heartbeat thread: the token-spreading first exchange, then beats."""
    if not self.ready.is_set() and self.failure is None:
      self.first_exchange()
    if self.failure is None:
      self._loop()
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
      try:
        merged = self._timed_exchange(self._row(signal, stop))
      except Exception as e:  # pylint: disable=broad-except
        self._fail(self._missed_message(self.beats + 1,
                                        f" (the beat failed: {_first_line(e)})"))
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
    values, counts = np.unique(slots, return_counts=True)
    best = values[counts == counts.max()]
    cluster_token = int(slots[0]) if len(best) > 1 else int(best[0])
    wrong = [c for c in range(len(slots)) if slots[c] != cluster_token]
    if self.client_id in wrong:
      self._fail(f"heartbeat: this client ({self.client_id}) is out of sync: it "
                 f"sent token {self.token}, the cluster's is {cluster_token} in "
                 f"beat {self.beats}", [self.client_id])
      return
    who = ", ".join(map(str, wrong))
    sent = ", ".join(str(int(slots[c])) for c in wrong)
    self._fail(f"heartbeat: client{'s' if len(wrong) > 1 else ''} {who} sent token "
               f"{sent} instead of {cluster_token} in beat {self.beats} "
               f"(restarted or out of sync)", wrong)

  def _watch(self) -> None:
    """Sleeps until a beat starts, then until it ends or its deadline passes."""
    with self._beat_changed:
      while not self.stopped.is_set():
        started = self._beat_started
        if started is None:
          self._beat_changed.wait(1.0)  # Woken when a beat starts.
          continue
        remaining = started + self.deadline - time.monotonic()
        if remaining > 0:
          self._beat_changed.wait(remaining)  # Woken when the beat ends.
          continue
        break  # This beat is overdue.
    if not self.stopped.is_set():
      self._fail(self._missed_message(self.beats + 1, ""))

  # -- failure --------------------------------------------------------------------------

  def _consequence(self) -> str:
    return {"terminate": "stopping this client",
            "raise": "raising PeerFailureError at the next jdtensor call",
            "log": "carrying on (policy 'log')"}[self.policy]

  def _missed_message(self, beat: int, detail: str) -> tuple[str, list[int]]:
    others = [c for c in range(self.num_clients) if c != self.client_id]
    records = self._read()
    now = time.time()
    if records is None:
      who, ids = "the coordination service (client 0) is unreachable", [0]
      text = (f"heartbeat: beat {beat} did not complete within "
              f"{self.deadline:g} s{detail}; {who}")
      return text, ids  # type: ignore[return-value]
    missing = [c for c in others if records.get(c, (0, 0.0))[0] < beat]
    if not missing:
      return (f"heartbeat: beat {beat} did not complete within {self.deadline:g} s "
              f"although every client started it{detail}",
              others)  # type: ignore[return-value]
    ages = [f"{now - records[c][1]:.1f} s ago" if c in records else "never"
            for c in missing]
    if len(missing) == 1:
      who = f"client {missing[0]} missed beat {beat} (last seen {ages[0]})"
    else:
      who = (f"clients {', '.join(map(str, missing))} missed beat {beat} "
             f"(last seen {', '.join(ages)})")
    return f"heartbeat: {who}{detail}", missing  # type: ignore[return-value]

  def _fail(self, core: str | tuple[str, list[int]], ids: list[int] | None = None
            ) -> None:
    """Records a failure (`core` says what happened) and applies the policy."""
    if isinstance(core, tuple):
      core, ids = core
    if self.failure is not None:
      return
    message = f"{core}; {self._consequence()}"
    error = PeerFailureError(message, tuple(ids or ()))
    self.failure = error
    culprits = [c for c in error.client_ids if c != self.client_id]
    if culprits:
      self._announce(culprits, core)
    if self.policy == "terminate":
      # One plain line, certain to be seen, then exit without JAX's shutdown
      # barrier (it would wait for the dead client).
      sys.stderr.write(message + "\n")
      sys.stderr.flush()
      self._terminate(EXIT_CODE)
      return
    logging.error("%s", message)
    if self.policy == "raise":
      runtime.record_peer_failure(error)
    self.stopped.set()
    with self._beat_changed:
      self._beat_changed.notify_all()

  def peer_died(self, client: int, how: str) -> None:
    """A liveness link saw `client`'s process end (no beat can succeed now)."""
    if self.stopped.is_set() and self.failure is None:
      return  # We already stopped by agreement; a late exit is not a failure.
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
    for target, name in ((self._run, "jdtensor-heartbeat"),
                         (self._watch, "jdtensor-heartbeat-watchdog")):
      thread = threading.Thread(target=target, daemon=True, name=name)
      thread.start()
      self._threads.append(thread)

  def stop(self, timeout: float | None = None) -> bool:
    """Requests the agreed stop and waits for it; True if it stopped in time."""
    logging.info("Stopping the heartbeat thread")
    self.event.set()
    return self.stopped.wait(self.period + self.deadline if timeout is None
                             else timeout)


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return text[0] if text else type(error).__name__


def _kv_record(client: int, beat: int, wall: float) -> None:
  try:
    runtime.kv_set(f"{_KV_PREFIX}{client}", f"{beat} {wall:.3f}")
  except Exception:  # pylint: disable=broad-except
    pass  # The beat itself will report an unreachable coordinator.


def _kv_read() -> dict[int, tuple[int, float]] | None:
  entries = runtime.kv_dir(_KV_PREFIX, timeout=1.0)
  if entries is None:
    return None
  out = {}
  for key, value in entries.items():
    beat, wall = value.split()
    out[int(key.rsplit("/", 1)[-1])] = (int(beat), float(wall))
  return out


def current() -> Heartbeat | None:
  """The heartbeat started in this process, if any."""
  return _current


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
  """
  global _current
  with _lock:
    if _current is not None and not _current.stopped.is_set():
      logging.warning("A heartbeat thread is already running, skipping this one.")
      return _current.event
    devices = runtime.heartbeat_devices()
    env = runtime.state().env
    if env is None:
      raise RuntimeError("jdtensor runtime state lost its cluster.")
    links = runtime.state().links
    heartbeat = Heartbeat(period, read_policy() if policy is None else policy,
                          _PsumExchange(devices, env.client_id, env.num_clients + 1),
                          env.client_id, env.num_clients,
                          announce=links.report if links is not None else None)
    # The first exchange runs on the heartbeat thread, off the caller's
    # critical path; it is still the first collective on the reserved group.
    heartbeat.start_threads()
    atexit.register(heartbeat.stop)
    if links is not None:
      links.watch(heartbeat.peer_died, heartbeat.peer_reported)
    _current = heartbeat
    return heartbeat.event
