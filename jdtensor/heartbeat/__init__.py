"""DTensor's heartbeat service on JAX, and how a client leaves a run.

Every client exchanges DTensor's random token with every other client every
`period` seconds; when a client dies, hangs, stalls, leaves early or
restarts, every other names it and the reason within a bounded time (TF
DTensor's heartbeat logs forever in its open-source build).

This module is the entry point (DTensor's `start`, `current`, `dump_stacks`)
and wires the parts, top to bottom: `protocol.Heartbeat` (the threads and the
policy) is given `exchange.LinkExchange` (the beats on the liveness links,
outside JAX), the liveness links, `process.ClientProcess` (the launcher's
reports) and `flight`'s recorder (what the program's thread, `watched`,
does); `verdicts` decides what a merged beat means (the list of verdicts),
`failures` what it means for this client, `wording` says it, `stragglers`
keeps who the others wait for; `wire` is what the parts send; `departure`
reads how the process is leaving, and `leaving` is its one way out.

Settings: `jdtensor._env.HeartbeatSettings`. SIGUSR1 prints every stack.
"""

from __future__ import annotations

import threading
from typing import IO, Any

from jdtensor import _env, _logging as logging, runtime
from jdtensor.errors import NotInitializedError
from jdtensor.heartbeat import watched
from jdtensor.heartbeat.exchange import LinkExchange, ack_every_for
from jdtensor.heartbeat.flight import ProgramThreadRecorder, format_stacks
from jdtensor.heartbeat.meetings import ServiceWaitWatch
from jdtensor.heartbeat.process import ClientProcess
from jdtensor.heartbeat.progress import ByteMeter
from jdtensor.heartbeat.protocol import POLICIES, Heartbeat

# The contract (and the API reference). What jdtensor itself calls here
# (`start_with`) is not: its user is `jdtensor.accelerator`, which installs
# the exit guard too (`process.install_exit_guard`).
__all__ = ["start", "current", "dump_stacks", "POLICIES"]

_lock = threading.Lock()
_current: Heartbeat | None = None


def current() -> Heartbeat | None:
  """The heartbeat started in this process, if any."""
  return _current


def _live_arrays() -> Any:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.live_arrays()


def _running_event() -> threading.Event | None:
  """The running heartbeat's stop event (with DTensor's warning), if any."""
  if _current is not None and not _current.stopped.is_set():
    logging.warning("A heartbeat thread is already running, skipping this one.")
    return _current.event
  return None


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
  with _lock:
    running = _running_event()
  if running is not None:  # Before reading the arguments, as DTensor does.
    return running
  state = runtime.state()
  return start_with(_env.read_heartbeat_settings(
      period=period, policy=policy,
      coordination=state.timeouts.coordination if state.timeouts else None))


def start_with(settings: _env.HeartbeatSettings) -> threading.Event:
  """`start` with its settings already read and checked
  (`initialize_accelerator_system` reads them before the cluster forms, so
  that a bad value fails first); see `start`."""
  with _lock:
    running = _running_event()
    if running is not None:
      return running
    if _current is not None:
      raise RuntimeError(
          "The heartbeat already ran in this process and has stopped; it "
          "cannot be started again (its last beat was agreed with every "
          "client). Start it once per run.")
    return _start(settings)


def _start(settings: _env.HeartbeatSettings) -> threading.Event:
  """Starts this client's heartbeat (under `_lock`)."""
  global _current
  state = runtime.state()
  env = runtime.cluster()
  if not state.multi_client or state.links is None or env is None:
    raise NotInitializedError("The heartbeat needs an initialised multi-client "
                              "run (DTENSOR_JOBS with several clients).")
  program = watched.program_thread()  # The caller's, unless the program named one.
  meetings = ServiceWaitWatch(program)
  meetings.start()  # Before the loop's first barrier: see `meetings`.
  exchange = LinkExchange(env.client_id, env.num_clients, state.links,
                          ack_every=ack_every_for(settings.period, settings.stuck_timeout),
                          meetings=meetings)
  coordinator = env.coordinator_address or ""
  port = coordinator.rpartition(":")[2]
  meter = ByteMeter(state.links.descriptors, [int(port)] if port.isdecimal() else [])
  heartbeat = Heartbeat(settings, env.client_id, env.num_clients, exchange=exchange,
                        peers=state.links, process=ClientProcess(env.client_id, meter),
                        recorder=ProgramThreadRecorder(env.num_clients, _live_arrays,
                                                       program=program))
  heartbeat.start_threads()  # The first exchange too: off the caller's path.
  state.links.watch(heartbeat)
  _current = heartbeat
  return heartbeat.event


def dump_stacks(file: IO[str] | None = None) -> str:
  """This client's threads' Python stacks, the program's thread first (the
  main thread, or the one `jdtensor.watch_thread` names).

  Args:
    file: Where to write them too (e.g. ``sys.stderr``); None writes nothing.

  Returns:
    The text.
  """
  text = format_stacks(first=watched.program_ident())
  if file is not None:
    file.write(text + "\n")
    file.flush()
  return text
