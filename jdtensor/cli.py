"""The ``jdtensor`` command line (also ``python -m jdtensor``).

Commands:

* ``jdtensor launch [-n N] [--devices-per-client M] [--device-type CPU]
  [--port P] [--timeout S] [--grace S] [--max-restarts K [--no-compile-cache]]
  [--trace FILE] [--nnodes NN --node-rank R --coordinator HOST:PORT
  [--node-address HOST]] [--] cmd args...``: run N clients on this node (see
  `jdtensor.launcher`).
* ``jdtensor demo [--steps K] [--checkpoint DIR] [--max-restarts K]
  [--straggler CLIENT] [--trace FILE]``: 4
  clients x 2 simulated CPU devices train a data + model parallel MLP on a
  (batch=4, model=2) distributed mesh.
* ``jdtensor env [--detect auto|tpu|slurm|k8s|ompi]``: print the DTENSOR_*
  exports derived from a TPU pod, SLURM, Kubernetes or Open MPI environment.
* ``jdtensor status [--watch [SECONDS]] [--pid PID]``: one row per client of
  each `jdtensor launch` this user runs on this machine (see `jdtensor._status`).
* ``jdtensor trace PATH... [-o FILE]``: one trace of the files the clients
  wrote into ``JDTENSOR_TRACE_DIR=DIR`` (under an engine) and of the traces
  each node's ``jdtensor launch --trace`` wrote (see `jdtensor._trace`).
"""

from __future__ import annotations

import argparse
import os
import math
import sys

from jdtensor.device_spec import DEVICE_TYPES

__all__ = ["main", "get_parser"]

_DEMO_CLIENTS, _DEMO_DEVICES = 4, 2


def _ascii_int(text: str, what: str) -> int:
  """An integer written in ASCII digits (``int`` also takes ``٢`` and ``1_0``)."""
  digits = text.strip()
  if not (digits.isascii() and digits.isdigit()):
    raise argparse.ArgumentTypeError(f"expected {what} in ASCII digits, got {text!r}")
  return int(digits)


def _positive_int(text: str) -> int:
  value = _ascii_int(text, "a positive integer")
  if value < 1:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
  return value


def _non_negative_int(text: str) -> int:
  return _ascii_int(text, "a non-negative integer")


def _positive_float(text: str) -> float:
  try:
    value = float(text) if text.strip().isascii() else float("nan")
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}") from None
  if not (value > 0 and math.isfinite(value)):
    raise argparse.ArgumentTypeError(
        f"expected a finite number of seconds > 0, got {text!r}")
  return value


def get_parser() -> argparse.ArgumentParser:
  """The argument parser of the ``jdtensor`` command."""
  parser = argparse.ArgumentParser(
      prog="jdtensor", description="TF DTensor's multi-client runtime on JAX.")
  commands = parser.add_subparsers(dest="command", required=True)

  launch = commands.add_parser(
      "launch", help="run N local DTensor clients of a command",
      description="Run N local clients with DTENSOR_* set; stop all when one "
      "fails. Example: jdtensor launch -n 4 --devices-per-client 2 -- python train.py")
  launch.add_argument("-n", "--num-clients", type=_positive_int, default=None,
                      help="number of clients on this node (default 2; with "
                      "--device-type GPU, one per GPU)")
  launch.add_argument("--devices-per-client", type=_positive_int, default=None,
                      help="CPU: simulated CPU devices per client (default: the "
                      "count the environment gives JAX, JAX_NUM_CPU_DEVICES or "
                      "XLA_FLAGS=--xla_force_host_platform_device_count=N, else 1; "
                      "given both ways, they must agree). GPU: GPUs per client, "
                      "from the node's CUDA_VISIBLE_DEVICES, else its GPUs "
                      "(default: split evenly); each client gets its own as "
                      "CUDA_VISIBLE_DEVICES")
  launch.add_argument("--device-type", default="CPU", type=str.upper,
                      choices=list(DEVICE_TYPES), help="default CPU")
  launch.add_argument("--port", type=_positive_int, default=None,
                      help="first port; client k uses port+k (default: free ports)")
  launch.add_argument("--timeout", type=_positive_float, default=None,
                      help="stop every client after this many seconds")
  launch.add_argument("--grace", type=_positive_float, default=30.0,
                      help="seconds between SIGTERM and SIGKILL (default 30). Every "
                      "stop (a failure, --timeout, Ctrl-C, SIGTERM) sends SIGTERM "
                      "first: JAX takes it as a preemption notice, so a client that "
                      "checks multihost_utils.reached_preemption_sync_point (orbax: "
                      "reached_preemption) can save the same step on every client "
                      "and exit; one that does not is killed after the grace")
  nodes = launch.add_argument_group(
      "several machines", "one `jdtensor launch` per node; they meet at node 0's "
      "--coordinator (authenticated with JDTENSOR_RUN_SECRET, the same on every "
      "node) and number the clients node by node")
  nodes.add_argument("--nnodes", type=_positive_int, default=1,
                     help="number of nodes (default 1)")
  nodes.add_argument("--node-rank", type=_non_negative_int, default=0,
                     help="this node's rank, 0..nnodes-1 (default 0)")
  nodes.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                     help="where node 0's launcher listens and the others connect")
  nodes.add_argument("--node-address", default=None, metavar="HOST",
                     help="the address other nodes reach this node's clients at "
                     "(default: the address this node reaches node 0 from)")
  launch.add_argument("--max-restarts", type=_non_negative_int, default=0,
                      help="after a failure, start every client again (new ports "
                      "and secret, JDTENSOR_RESTART_COUNT), up to this many "
                      "times (default 0)")
  launch.add_argument("--no-compile-cache", dest="compile_cache",
                      action="store_false",
                      help="with --max-restarts: do not share JAX's compilation "
                      "cache between the attempts (a restart then compiles every "
                      "program again; also JDTENSOR_COMPILE_CACHE=false)")
  launch.add_argument("--trace", default=None, metavar="FILE",
                      help="write the run's timeline to FILE: every client's phases "
                      "(set-up, own code, in JAX, in a collective, at exit), the "
                      "verdicts, stragglers, restarts and each client's CPU and "
                      "memory, in the trace-event format Perfetto "
                      "(https://ui.perfetto.dev) and chrome://tracing open")
  launch.add_argument("--log-dir", default=None, metavar="DIR",
                      help="also write each client's output, as it wrote it, to "
                      "DIR/client-<k>.log (created if needed; appended to, one "
                      "header line an attempt); the summary names the root "
                      "cause's file")
  launch.add_argument("--log-only", action="store_true",
                      help="with --log-dir: the clients' output to the files only "
                      "(the launcher's own lines stay on the console)")
  launch.add_argument("cmd", nargs=argparse.REMAINDER,
                      help="the command each client runs (after --)")

  demo = commands.add_parser(
      "demo", help="train a data+model parallel MLP on 4 clients x 2 CPU devices")
  demo.add_argument("--steps", type=_positive_int, default=30,
                    help="training steps (default 30)")
  demo.add_argument("--timeout", type=_positive_float, default=300.0,
                    help="stop the clients after this many seconds (default 300)")
  demo.add_argument("--checkpoint", default=None, metavar="DIR",
                    help="save each client's shards after every step, and resume "
                    "from the last step all saved (with --max-restarts)")
  demo.add_argument("--max-restarts", type=_non_negative_int, default=0,
                    help="start every client again after a failure, up to this "
                    "many times (default 0)")
  demo.add_argument("--step-delay", type=_positive_float, default=None,
                    help=argparse.SUPPRESS)  # Slows the steps (to kill one).
  demo.add_argument("--straggler", type=_non_negative_int, default=None, metavar="CLIENT",
                    help="make CLIENT a straggler: its every step first spends 0.2 s "
                    "in its own code (a slow data loader) while the others wait")
  demo.add_argument("--trace", default=None, metavar="FILE",
                    help="write the run's timeline to FILE (as `jdtensor launch "
                    "--trace`)")
  env = commands.add_parser(
      "env", help="print DTENSOR_* exports derived from a TPU pod/SLURM/k8s/MPI job",
      description="Print `export DTENSOR_...=...` lines for this process, "
      "derived from the cluster it runs in; variables already set are kept.")
  env.add_argument("--detect", default="auto",
                   choices=["auto", "tpu", "slurm", "k8s", "ompi"],
                   help="where to look (default auto)")
  status = commands.add_parser(
      "status", help="show what every client of a running `jdtensor launch` is doing",
      description="One row per client of each `jdtensor launch` you run on this "
      "machine (on several nodes: run it on node 0): phase, for how long, where "
      "its main thread is, CPU, memory, beats, restarts, and how long it and the "
      "others wait in collectives.")
  status.add_argument("--watch", nargs="?", type=_positive_float, const=2.0,
                      default=None, metavar="SECONDS",
                      help="refresh every SECONDS (default 2) until Ctrl-C")
  status.add_argument("--pid", type=_positive_int, default=None,
                      help="only the launch whose launcher has this pid")
  status.add_argument("--wait", type=_positive_float, default=5.0, metavar="SECONDS",
                      help="how long to wait for the clients' first answer "
                      "(default 5; they answer once a heartbeat period)")
  trace = commands.add_parser(
      "trace", help="merge the trace files of a run's clients or nodes into one",
      description="One trace (Perfetto's format) of a run: the files its clients "
      "wrote into JDTENSOR_TRACE_DIR=DIR (mpirun, srun, Kubernetes: set it on every "
      "client), and the traces each node's `jdtensor launch --trace FILE` wrote. "
      "Processes of different hosts or containers that had the same pid keep "
      "tracks of their own.")
  trace.add_argument("paths", nargs="+", metavar="PATH",
                     help="a JDTENSOR_TRACE_DIR (its client-*.json files), the folder "
                     "a `jdtensor launch --trace` keeps its parts in while it runs "
                     "(it says which; the launcher's file too), or a trace file (one "
                     "node's --trace, or one client's file)")
  trace.add_argument("-o", "--out", default=None, metavar="FILE",
                     help="where to write the trace (default DIR/run.json for one "
                     "DIR; needed otherwise)")
  return parser


def _trace_command(args: argparse.Namespace) -> int:
  from jdtensor import _trace  # pylint: disable=g-import-not-at-top
  from jdtensor.launcher import trace as run_trace  # pylint: disable=g-import-not-at-top

  def refuse(why: str) -> int:
    print(f"jdtensor trace: {why}", file=sys.stderr)
    return 2
  paths: list[str | tuple[str, ...]] = []
  files: list[str] = []
  for path in args.paths:
    if os.path.isdir(path):
      found = run_trace.parts(path)
      if not found:
        return refuse(f"no trace parts in {path} (client-<id>-<pid>.json, written by "
                      "clients started with JDTENSOR_TRACE_DIR set, or launcher-<node>"
                      ".json, by `jdtensor launch --trace`)")
      # A launcher's folder is one host's: its file puts each client's end on
      # the client's track, so their pids are one space.
      one_host = any(os.path.basename(f).startswith("launcher-") for f in found)
      paths += [tuple(found)] if one_host else found
      files += found
    elif os.path.isfile(path):
      paths.append(path)
      files.append(path)
    else:
      return refuse(f"{path} is neither a folder nor a file (give a JDTENSOR_TRACE_DIR, "
                    "or a trace file that `jdtensor launch --trace` wrote)")
  one_dir = len(args.paths) == 1 and os.path.isdir(args.paths[0])
  if args.out is None and not one_dir:
    return refuse(f"say where the trace of {' '.join(args.paths)} goes: -o FILE")
  out = args.out if args.out is not None else os.path.join(args.paths[0], "run.json")
  why = run_trace.check_writable(out)
  if why is not None:
    return refuse(f"cannot write the trace to {out!r}: {why}")
  try:
    count = _trace.merge(paths, out, {"jdtensor": {
        "clock": "client 0's (microseconds of time.time())",
        "residuals_s": _trace.residuals(files)}})
  except _trace.TraceError as e:
    return refuse(f"{e}; give what jdtensor wrote (a JDTENSOR_TRACE_DIR, or the trace "
                  "of `jdtensor launch --trace` or `jdtensor trace`)")
  except OSError as e:
    print(f"jdtensor trace: cannot write {out}: {e.strerror}", file=sys.stderr)
    return 1
  print(f"jdtensor trace: {out} ({count:,} events from {len(files)} file(s))")
  return 0


# The demo's client program: internal, so not a listed command.
_DEMO_CLIENT = "demo-client"


def _demo_client_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog=f"jdtensor {_DEMO_CLIENT}")
  parser.add_argument("--steps", type=_positive_int, default=30)
  parser.add_argument("--checkpoint", default=None)
  parser.add_argument("--step-delay", type=_positive_float, default=None)
  parser.add_argument("--straggler", type=_non_negative_int, default=None)
  return parser


def _launch(args: argparse.Namespace) -> int:
  from jdtensor import launcher  # pylint: disable=g-import-not-at-top
  cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
  if not cmd:
    print("jdtensor launch: give the command each client runs, e.g. "
          "`jdtensor launch -n 2 -- python train.py`", file=sys.stderr)
    return 2
  from jdtensor import _env  # pylint: disable=g-import-not-at-top
  from jdtensor.errors import ConfigError  # pylint: disable=g-import-not-at-top
  extra = {}
  if _empty_trace("launch", args.trace):
    return 2
  if args.log_only and args.log_dir is None:
    print("jdtensor launch: --log-only needs --log-dir DIR (where the clients' "
          "output goes instead of the console)", file=sys.stderr)
    return 2
  if args.log_dir is not None:
    log_dir = os.path.abspath(args.log_dir)
    try:
      os.makedirs(log_dir, exist_ok=True)
      probe = os.path.join(log_dir, f".jdtensor-probe-{os.getpid()}")
      with open(probe, "w", encoding="utf-8"):
        pass
      os.unlink(probe)
    except OSError as e:
      print(f"jdtensor launch: --log-dir {args.log_dir!r}: cannot write there "
            f"({e.strerror}); give a folder this user can create and write",
            file=sys.stderr)
      return 2
    extra.update(log_dir=log_dir, log_only=args.log_only)
  try:
    if args.nnodes > 1:  # The nodes share the secret the user set (or none).
      extra["secret"] = _env.read_run_secret()
    spec = launcher.LaunchSpec(
        command=tuple(cmd),
        num_clients=(args.num_clients if args.num_clients is not None or
                     args.device_type == "GPU" else 2),
        devices_per_client=args.devices_per_client, device_type=args.device_type,
        port=args.port, timeout=args.timeout, grace=args.grace,
        nnodes=args.nnodes, node_rank=args.node_rank,
        coordinator=args.coordinator, node_address=args.node_address,
        max_restarts=args.max_restarts, compile_cache=args.compile_cache,
        trace=args.trace, **extra).resolved(
            _env.process_environ(), "--devices-per-client")
  except (ConfigError, ValueError) as e:
    print(f"jdtensor launch: {e}", file=sys.stderr)
    return 2
  try:
    code = launcher.launch(spec).exit_code
  except ConfigError as e:  # Refused before any client started.
    print(f"jdtensor launch: {e}", file=sys.stderr)
    return 2
  try:
    sys.stdout.flush()
  except (BrokenPipeError, ValueError):
    # The reader of our output is gone: no "Exception ignored" at exit.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
  return code


def _empty_trace(command: str, path: str | None) -> bool:
  """Says so where ``--trace ''`` was given (the launcher checks the rest of
  what can be wrong with the path before any client starts)."""
  if path != "":
    return False
  print(f"jdtensor {command}: --trace '': the file name is empty; give the file the "
        "run's trace goes to, e.g. --trace run.json", file=sys.stderr)
  return True


def _demo(args: argparse.Namespace) -> int:
  from jdtensor import launcher  # pylint: disable=g-import-not-at-top
  if _empty_trace("demo", args.trace):
    return 2
  print(f"jdtensor demo: {_DEMO_CLIENTS} clients x {_DEMO_DEVICES} CPU devices, "
        "mesh batch=4 x model=2", flush=True)
  command = [sys.executable, "-m", "jdtensor", _DEMO_CLIENT, "--steps", str(args.steps)]
  if args.checkpoint:
    command += ["--checkpoint", os.path.abspath(args.checkpoint)]
  if args.step_delay:
    command += ["--step-delay", str(args.step_delay)]
  if args.straggler is not None:
    if args.straggler >= _DEMO_CLIENTS:
      print(f"jdtensor demo: --straggler {args.straggler}: the demo's clients are 0 to "
            f"{_DEMO_CLIENTS - 1}", file=sys.stderr)
      return 2
    command += ["--straggler", str(args.straggler)]
  spec = launcher.LaunchSpec(
      command=tuple(command), num_clients=_DEMO_CLIENTS,
      devices_per_client=_DEMO_DEVICES, timeout=args.timeout,
      max_restarts=args.max_restarts, trace=args.trace)
  # The demo's mesh needs its own device count, whatever the shell sets.
  from jdtensor import _env  # pylint: disable=g-import-not-at-top
  from jdtensor.errors import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    result = launcher.launch(
        spec, env=_env.without_cpu_device_count(_env.process_environ()))
  except ConfigError as e:  # Refused before any client started.
    print(f"jdtensor demo: {e}", file=sys.stderr)
    return 2
  print("OK" if result.exit_code == 0 else "FAILED", flush=True)
  return result.exit_code


def _env_command(args: argparse.Namespace) -> int:
  import shlex  # pylint: disable=g-import-not-at-top

  from jdtensor import cluster  # pylint: disable=g-import-not-at-top
  from jdtensor.errors import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    exports = cluster.resolve(method=args.detect)
  except ConfigError as e:
    print(f"jdtensor env: {e}", file=sys.stderr)
    return 2
  for name, value in exports.items():
    print(f"export {name}={shlex.quote(value)}")
  return 0


def _status_command(args: argparse.Namespace) -> int:
  import time  # pylint: disable=g-import-not-at-top

  from jdtensor import _status  # pylint: disable=g-import-not-at-top

  def screen(wait: float) -> tuple[str, bool]:
    runs = [r for r in _status.running_runs()
            if args.pid is None or r.get("pid") == args.pid]
    if not runs:
      which = f" with launcher pid {args.pid}" if args.pid else ""
      return (f"jdtensor status: no `jdtensor launch`{which} is running for this "
              "user on this machine (on several nodes, run it on node 0).", False)
    asked = {}
    for r in runs:
      try:
        asked[r["report_dir"]] = _status.request_status(r["report_dir"])
      except (OSError, KeyError, TypeError):
        pass  # That attempt just ended (its directory is gone): shown unanswered.
    deadline = time.monotonic() + wait
    while True:  # Until every local client answered since the request.
      answers = {d: _status.read_statuses(d) for d in asked}
      fresh = all(len([s for s in answers[d].values() if s.get("at", 0) >= asked[d] - 0.5])
                  >= len(r.get("client_ids", [])) for r in runs
                  for d in [r["report_dir"]] if d in answers)
      if fresh or time.monotonic() >= deadline:
        break
      time.sleep(0.1)
    return "\n\n".join(_status.format_status(r, answers.get(r["report_dir"], {}))
                       for r in runs), True

  if args.watch is None:
    text, found = screen(args.wait)
    print(text)
    return 0 if found else 1
  try:
    while True:
      text, _ = screen(min(args.wait, args.watch))
      sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")  # Like `top`.
      sys.stdout.flush()
      time.sleep(args.watch)
  except KeyboardInterrupt:
    return 0


def _demo_client(args: argparse.Namespace) -> int:
  from jdtensor import demo  # pylint: disable=g-import-not-at-top
  return 0 if demo.report(demo.run_demo_client(
      args.steps, args.checkpoint, args.step_delay or 0.0, args.straggler)) else 1


def main(argv: list[str] | None = None) -> int:
  """Runs the command; returns the exit code."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] == [_DEMO_CLIENT]:
    return _demo_client(_demo_client_parser().parse_args(argv[1:]))
  args = get_parser().parse_args(argv)
  return {"launch": _launch, "demo": _demo, "env": _env_command,
          "status": _status_command, "trace": _trace_command}[args.command](args)
