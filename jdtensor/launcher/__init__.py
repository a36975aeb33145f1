"""`jdtensor launch`: DTensor clients, supervised like torchrun/mpirun.

PURE of JAX: the parent only spawns and watches processes. One node's clients
run under `jdtensor.launcher.supervisor`; several nodes (``--nnodes``), and
restarts (``--max-restarts``), are driven by `jdtensor.launcher.nodes` on top
of it. The public names are this module's `__all__`.

Each client gets ``DTENSOR_CLIENT_ID``, ``DTENSOR_NUM_CLIENTS``,
``DTENSOR_JOB_NAME=worker`` and ``DTENSOR_JOBS`` (``localhost:<port>`` per
client, ascending free ports), and for CPU runs ``JAX_PLATFORMS=cpu`` and
``JAX_NUM_CPU_DEVICES`` (the simulated device count). Every output line is
prefixed with its client (``[client 2] ...``); gloo's harmless
``[Gloo] Rank r is connected to ...`` lines are dropped.

When a client exits non-zero or is killed, the others get SIGTERM, then
SIGKILL after a grace period, and the launcher exits non-zero with one summary
line naming the root cause: the first client that failed by itself (by exit
time), never a client the heartbeat stopped because of another (exit code
75); when only such consequences failed, the client they name (each writes
whom it blames into ``JDTENSOR_REPORT_DIR``), e.g. a stuck or stalled client,
or one that ended its script while the others still waited for it.
SIGINT/SIGTERM to the launcher stop every client the same way; SIGUSR1 makes
every client print its threads' stacks. Clients run in their own process
groups and die with the launcher (``PR_SET_PDEATHSIG``), so no process is
left behind; what a client orphans (a worker, a daemon that left its session
with ``setsid()``) becomes the launcher's child (it is a child subreaper, or
a container's pid 1, when it runs on the main thread), reaped as it ends and
stopped with the run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import IO

from jdtensor import _limits, _status
from jdtensor.errors import ConfigError
from jdtensor.launcher import nodes
from jdtensor.launcher.output import say
from jdtensor.launcher.spec import Attempt, Interrupt, LaunchResult, LaunchSpec, free_ports
from jdtensor.launcher.supervisor import Signals, run_attempt
from jdtensor.launcher.trace import RunTrace, check_writable

# The contract (and the API reference); the parts (`spec`, `supervisor`,
# `processes`, `output`, `nodes`) are imported by their own names.
__all__ = ["launch", "LaunchSpec", "LaunchResult", "free_ports"]


def launch(spec: LaunchSpec, out: IO[str] | None = None,
           err: IO[str] | None = None,
           env: Mapping[str, str] | None = None) -> LaunchResult:
  """Runs `spec` to completion; see the module docstring.

  SIGINT and SIGTERM (when called from the main thread) stop every client.
  Several nodes, or restarts: see `jdtensor.launcher.nodes`.

  Args:
    spec: What to launch.
    out, err: Where the clients' tagged output goes (default: this
      process's stdout and stderr).
    env: The clients' base environment (default ``os.environ``); the
      launcher adds the DTENSOR_* variables to it.

  Returns:
    How the clients ended; the summary line is also written to `err`.

  Raises:
    ConfigError: If `spec.devices_per_client` conflicts with the CPU device
      count `env` gives JAX (see `LaunchSpec.resolved`), or this machine
      cannot start the clients (open files, processes, ports: see
      `jdtensor._limits`); nothing was started.
  """
  out = out or sys.stdout
  err = err or sys.stderr
  base = os.environ if env is None else env
  spec = startable(spec, base)
  run_trace = RunTrace(spec.trace, spec.node_rank) if spec.trace else None
  # The trace's parts: removed by a later launch if this one is SIGKILLed.
  parts = None if run_trace is None else _status.track_folder(run_trace.dir)
  if run_trace is not None:
    err, base = run_trace.watching(err), {**base, **run_trace.env}
  try:
    with Signals(Interrupt()) as signals:
      if spec.nnodes == 1 and spec.max_restarts == 0:
        result = run_attempt(spec, Attempt.local(spec), out, err, base, signals)
        if run_trace is not None:
          run_trace.attempt(result)
        return result
      return nodes.run(spec, out, err, base, signals, run_trace)
  finally:
    if run_trace is not None:
      say(err, run_trace.close())
      _status.forget_folder(parts)


def startable(spec: LaunchSpec, env: Mapping[str, str]) -> LaunchSpec:
  """`spec` made concrete for this node (`LaunchSpec.resolved`), once this
  machine is known to be able to start its clients.

  Raises:
    ConfigError: As `launch`; nothing was started.
  """
  spec = spec.resolved(env)
  assert spec.num_clients is not None  # `resolved` counts a GPU node's clients.
  if spec.trace is not None:
    why = check_writable(spec.trace)
    if why is not None:
      raise ConfigError(f"--trace {spec.trace}: cannot write the trace there: {why}.")
  _limits.ensure_launch_capacity(spec.num_clients, spec.num_clients * spec.nnodes,
                                 runs_client_0=spec.node_rank == 0,
                                 picks_ports=spec.port is None)
  return spec
