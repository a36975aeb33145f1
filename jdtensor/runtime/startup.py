"""Multi-client start-up: the rendezvous, then ``jax.distributed.initialize``.

Run by `Runtime.initialize` (`jdtensor.runtime.state`) for a cluster of
several clients, within the plan's one deadline.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from jdtensor import _env, _limits, _wire
from jdtensor import _logging as logging
from jdtensor._deadline import Deadline
from jdtensor._report import Reason, StartupStacks, blame_at_start, withdraw_blame
from jdtensor.errors import (PEER_FAILURE_EXIT_CODE, StartupError, StartupTimeoutError,
                             inherited_client_message)
from jdtensor.runtime import rendezvous
from jdtensor.runtime.links import LinkEvents, Links

if TYPE_CHECKING:
  from jdtensor._device_nodes import GpuIdentity
  from jdtensor.tpu.topology import SimulatedTopology

__all__ = ["StartupPlan", "Started", "start_distributed", "backend_initialized"]


class StartupPlan(NamedTuple):
  """What `initialize` starts, resolved and checked by the caller
  (`jdtensor.accelerator`) from its arguments and the environment.

  Attributes:
    device_type: CPU, GPU or TPU.
    cluster: The cluster to join (one client: local mode).
    timeouts: The time-outs in force.
    deadline: The whole start-up's deadline (``timeouts.init``), shared by
      the handshake, the coordination service and JAX's registration.
    cpu_devices: CPU devices to configure; None keeps JAX's.
    reset_requested: ``experimental_reset_context`` (single client).
    local_devices: This client's device count, compared at the handshake.
    bind: Where client 0's coordinator listens (host, port), or Nones for
      the default.
    secret: The run secret; None runs the handshake unauthenticated.
    agreed: Settings every client must share, by variable name.
    simulated_tpu: The simulated TPU slice (TPU on CPU devices), if any.
    gpus: The GPUs a GPU client will use (compared at the handshake).
  """
  device_type: str
  cluster: _env.ClusterEnv
  timeouts: _env.Timeouts
  deadline: Deadline
  cpu_devices: int | None = None
  reset_requested: bool = False
  local_devices: int = 1
  bind: tuple[str | None, int | None] = (None, None)
  secret: str | None = None
  agreed: Mapping[str, object] = MappingProxyType({})
  simulated_tpu: SimulatedTopology | None = None
  gpus: tuple[GpuIdentity, ...] = ()


class Started(NamedTuple):
  """What `start_distributed` set up, for the runtime to record.

  Attributes:
    links: The liveness links (the handshake's connections, kept open).
    gloo_host: This client's DTENSOR_JOBS host, where its CPU collectives
      listen, when it is an address of this machine; else None.
  """
  links: Links
  gloo_host: str | None


def _jax_private() -> Any:
  from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
  return jax_private


def backend_initialized() -> bool:
  """Whether a JAX backend exists in this process. Never starts one."""
  if "jax" not in sys.modules:
    return False
  return _jax_private().backends_initialized()


def _job_host_on_this_machine(env: _env.ClusterEnv) -> tuple[str, str] | None:
  """This client's own DTENSOR_JOBS host, if an address of this machine,
  with its family (``IPv4``/``IPv6``: the address gloo will listen on)."""
  entry = env.jobs[env.client_id]
  if entry.startswith("/bns/"):
    return None
  host, _ = _wire.split_host_port(entry)
  try:
    family, _, _, _, sockaddr = socket.getaddrinfo(_wire.socket_host(host), 0,
                                                   type=socket.SOCK_STREAM)[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
      probe.bind(sockaddr[:2] if family == socket.AF_INET else sockaddr)
  except OSError:
    return None
  return host, "IPv6" if family == socket.AF_INET6 else "IPv4"


def _collectives_family(job_host: tuple[str, str] | None, platform: str | None) -> str:
  """`Hello.family`: the family gloo will listen on, '' where the run's
  collectives are not gloo's (its one failure on mixed families comes at the
  first collective; NCCL and TPUs do not mind)."""
  if job_host is None or platform != "cpu":
    return ""
  import jax  # pylint: disable=g-import-not-at-top
  return job_host[1] if jax.config.jax_cpu_collectives_implementation == "gloo" else ""


def _bind_collectives_to_job_address(host: str | None, client_id: int) -> None:
  """Makes gloo listen on this client's DTENSOR_JOBS host.

  JAX builds its CPU collectives with the machine's hostname, which may
  resolve to an address other hosts cannot reach (a loopback alias, another
  interface). DTENSOR_JOBS[i] names client i's address, so that is where its
  collectives listen. Left to JAX when that host is not an address of this
  machine (e.g. Open MPI placeholders), or when gloo is not in use.
  """
  import jax  # pylint: disable=g-import-not-at-top

  from jdtensor.runtime import jax_private  # pylint: disable=g-import-not-at-top
  if host is None or jax.config.jax_cpu_collectives_implementation != "gloo":
    return
  jax_private.bind_cpu_collectives(host)
  logging.info("jdtensor: CPU collectives listen on %s (DTENSOR_JOBS[%d])", host,
               client_id)


class _StartupWatch(LinkEvents):
  """Liveness-link events during start-up: a peer's death stops this client;
  client 0's word that its JAX service listens sets `service_listening`."""

  def __init__(self) -> None:
    self.service_listening = threading.Event()

  @staticmethod
  def peer_died(client: int, how: str) -> None:
    _died_during_startup(client, how)

  def service_up(self) -> None:
    self.service_listening.set()


def _died_during_startup(client: int, how: str) -> None:
  sys.stderr.write(
      f"StartupError: client {client}'s process ended during start-up ({how}) "
      "after meeting the coordinator; this client cannot join the cluster and "
      f"stops (exit {PEER_FAILURE_EXIT_CODE}).\n")
  sys.stderr.flush()
  os._exit(PEER_FAILURE_EXIT_CODE)  # The main thread is inside JAX's connect.


def _refuse_a_second_runtime(env: _env.ClusterEnv) -> None:
  """At once, before any wait: a process where ``jax.distributed`` is up
  already, or a child that inherited an initialised client's DTENSOR_*,
  would otherwise fail after the start-up time-out with a port "in use"."""
  inherited = _env.read_inherited_client()
  if inherited is not None and inherited[1:] == (env.client_id, env.coordinator_address or ""):
    raise StartupError(inherited_client_message(os.getpid(), env.client_id,
                                                inherited[0]))
  if "jax" in sys.modules and _jax_private().distributed_initialized():
    raise StartupError(
        "jax.distributed is already initialized in this process "
        "(jax.distributed.initialize ran before initialize_accelerator_system), "
        "so jdtensor cannot start the multi-client runtime DTENSOR_* describes. "
        "Call only one of them: initialize_accelerator_system() (it calls "
        "jax.distributed.initialize with DTENSOR_*'s values; jax.process_index() "
        "and multihost_utils work as before), or jax.distributed.initialize "
        "without DTENSOR_* set.")


def _users_sigterm_handler() -> str | None:
  """The program's own SIGTERM handler, by name, if it installed one."""
  handler = signal.getsignal(signal.SIGTERM)
  if not callable(handler) or handler is signal.default_int_handler:
    return None
  module = getattr(handler, "__module__", None) or "?"
  return f"{module}.{getattr(handler, '__qualname__', repr(handler))}"


def sigterm_handler_dropped(handler: str) -> str:
  """The warning for a SIGTERM handler JAX's preemption notifier replaces."""
  return (f"jdtensor: this program's SIGTERM handler ({handler}) will not run: "
          "jax.distributed.initialize (which initialize_accelerator_system calls) starts "
          "JAX's preemption notifier, which takes SIGTERM in C++ from then on, as in "
          "any jax.distributed run (signal.getsignal still returns the handler). A "
          "stop (jdtensor launch's, SLURM's, Kubernetes') is a preemption notice "
          "instead: check multihost_utils.reached_preemption_sync_point(step), or "
          "orbax's CheckpointManager.reached_preemption(step), in the loop and save "
          "there (docs/guides/preemption.md); or set jax_enable_preemption_service "
          "to False to keep the handler")


@contextlib.contextmanager
def _answering_the_launcher(client_id: int) -> Iterator[str | None]:
  """Under `jdtensor launch`, while this client starts: SIGUSR1 writes
  every thread's stack where the launcher reads it (`StartupStacks`; the
  heartbeat answers for itself once it runs), so that a client silent at
  start-up (client 0 whose JAX service never comes up) still shows where it
  is. Left alone where the program handles SIGUSR1 itself. Yields the
  launcher's report folder, or None outside it."""
  directory = _env.read_report_dir()
  if directory is None:
    yield None
    return
  withdraw_blame(directory, client_id)  # An earlier try's.
  stacks = None
  if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, signal.SIG_IGN):
    stacks = StartupStacks.begin(directory, client_id, os.getpid(), threading.get_ident())
  if stacks is not None:
    try:
      faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    except (ValueError, OSError, RuntimeError):
      StartupStacks.end(directory, client_id, stacks)
      stacks = None
  try:
    yield directory
  finally:
    if stacks is not None:
      faulthandler.unregister(signal.SIGUSR1)
      StartupStacks.end(directory, client_id, stacks)


def _service_never_came_up(directory: str | None, client_id: int, coordinator: str,
                           timeouts: _env.Timeouts) -> None:
  """Tells the launcher that this client's start-up failed waiting for
  client 0's JAX coordination service: the run failed because of client 0."""
  if directory is not None:
    blame_at_start(directory, client_id, Reason(
        f"client 0's JAX coordination service at DTENSOR_JOBS[0]={coordinator!r} "
        f"did not come up within the init timeout ({timeouts.init:g} s, "
        f"{_env.JDTENSOR_INIT_TIMEOUT}) though client 0 met every client", (0,)))


def start_distributed(plan: StartupPlan, *, before_jax: Callable[[], None],
                      platform: str | None) -> Started:
  """Rendezvous, then ``jax.distributed.initialize``, then cross-checks, all
  within the plan's one deadline.

  Args:
    plan: What to start.
    before_jax: Run once the clients have met, before JAX's initialisation
      (the runtime applies the CPU device count there).
    platform: The JAX platform of `plan.device_type`, whose device counts
      every client must share (None: not checked).

  Returns:
    What it set up, for the runtime (the one owner of its state) to record.
  """
  _refuse_a_second_runtime(plan.cluster)
  with _answering_the_launcher(plan.cluster.client_id) as report_dir:
    return _start(plan, before_jax, platform, report_dir)


def _start(plan: StartupPlan, before_jax: Callable[[], None], platform: str | None,
           report_dir: str | None) -> Started:
  env, timeouts, deadline = plan.cluster, plan.timeouts, plan.deadline
  if backend_initialized():
    raise RuntimeError(
        "The JAX backend has already been started in this process, so it cannot "
        "join a multi-client cluster. Call initialize_accelerator_system() "
        "before any JAX call that starts the backend (jax.devices(), creating "
        "arrays, jit).")
  coordinator = env.coordinator_address
  bind = rendezvous.bind_address(coordinator, *plan.bind)
  if plan.secret is None:
    logging.warning(
        "jdtensor: the start-up handshake is not authenticated: %s is not set, "
        "so any process that can reach DTENSOR_JOBS[0] can join or disturb it. "
        "%s.", _env.JDTENSOR_RUN_SECRET, _env.run_secret_hint())
  files = _limits.ensure_open_files(env.num_clients, env.client_id)
  if files is not None and files.raised_from is not None:
    logging.info("jdtensor client %d: open-file limit (soft RLIMIT_NOFILE) raised "
                 "from %d to %d for %d clients", env.client_id, files.raised_from,
                 files.soft, env.num_clients)
  logging.info("jdtensor client %d of %d: meeting the coordinator at %s",
               env.client_id, env.num_clients, coordinator)
  settings = {**plan.agreed, _env.JDTENSOR_INIT_TIMEOUT: timeouts.init,
              _env.JDTENSOR_COORDINATION_TIMEOUT: timeouts.coordination,
              _env.JDTENSOR_SHUTDOWN_TIMEOUT: timeouts.shutdown,
              _env.DTENSOR_JOB_NAME: env.job_name}
  job_host = _job_host_on_this_machine(env)
  meeting = rendezvous.rendezvous(
      rendezvous.Hello(env.client_id, env.num_clients, env.jobs,
                        plan.local_devices, env.heartbeat_enabled,
                        tuple(sorted(settings.items())), plan.gpus,
                        _collectives_family(job_host, platform)),
      coordinator, bind, deadline, plan.secret)
  links = meeting.links
  shared = _env.fit_shared_gpu_memory(meeting.gpu_sharers)
  if shared:
    logging.info("jdtensor client %d: %s", env.client_id, shared)
  atexit.register(links.goodbye)
  # Until initialisation ends, a client that dies leaves the others in JAX's
  # C++ connect (which aborts at its time-out) or in the TPU core-id merge:
  # stop cleanly. `initialize` hands the links on when it is done.
  watch = _StartupWatch()
  links.watch(watch)
  before_jax()
  import jax  # pylint: disable=g-import-not-at-top
  if env.client_id == 0:
    rendezvous.announce_service(coordinator, deadline, links)
  else:
    try:
      rendezvous.wait_for_service_notice(watch.service_listening, coordinator,
                                         deadline, env.client_id)
    except StartupTimeoutError:
      _service_never_came_up(report_dir, env.client_id, coordinator or "", timeouts)
      raise
  if deadline.expired():
    raise StartupTimeoutError(
        f"Client {env.client_id}: start-up used up the init timeout "
        f"({timeouts.init:g} s, {_env.JDTENSOR_INIT_TIMEOUT}) before JAX's "
        "registration; raise it on every client.")
  host, port = bind
  users_handler = _users_sigterm_handler()
  jax.distributed.initialize(
      coordinator_address=coordinator,
      num_processes=env.num_clients,
      process_id=env.client_id,
      cluster_detection_method="deactivate",  # DTENSOR_* is the source of truth.
      initialization_timeout=deadline.whole_seconds_left(),
      heartbeat_timeout_seconds=math.ceil(timeouts.coordination),
      shutdown_timeout_seconds=math.ceil(timeouts.shutdown),
      coordinator_bind_address=_wire.format_host_port(host, port))
  if users_handler is not None and getattr(jax.config, "jax_enable_preemption_service",
                                           True):
    logging.warning("%s", sigterm_handler_dropped(users_handler))
  gloo_host = None if job_host is None else job_host[0]
  _bind_collectives_to_job_address(gloo_host, env.client_id)
  if jax.process_index() != env.client_id or jax.process_count() != env.num_clients:
    raise RuntimeError(
        f"JAX disagrees with DTENSOR_*: it says process {jax.process_index()} "
        f"of {jax.process_count()}, DTensor says client {env.client_id} of "
        f"{env.num_clients}.")
  _env.mark_client_process(os.getpid(), env.client_id, env.coordinator_address or "",
                           cast(MutableMapping[str, str], _env.process_environ()))
  try:
    devices = jax.devices(platform) if platform else []
  except RuntimeError:
    devices = []
  counts = {c: 0 for c in range(env.num_clients)}
  for d in devices:
    counts[d.process_index] = counts.get(d.process_index, 0) + 1
  if len(set(counts.values())) > 1:
    raise RuntimeError(
        f"Clients have different numbers of {plan.device_type} devices: "
        + ", ".join(f"client {c}: {n}" for c, n in sorted(counts.items()))
        + ". DTensor meshes need the same number on every client.")
  return Started(links, gloo_host)
