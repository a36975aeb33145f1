"""jdtensor on a GPU machine, in one command: does each promise hold there?

    python benchmarks/gpu_check.py [--out gpu_check.md] [--platform gpu|cpu]
    python -m benchmarks.gpu_check ...        (the same, from the checkout's root)

Runs from a plain copy of the repository with the machine's own Python and
JAX (jdtensor is imported from the checkout; nothing is downloaded or
installed), in well under 5 minutes, and writes its table to `--out` (and
prints it). This process never starts JAX (it would take the GPUs' memory);
every check runs in fresh client processes under `jdtensor launch`:

1. the single-client API on GPU 0 (mesh, layouts, pack/unpack, relayout, a
   jitted matmul);
2. the launcher's GPU assignment (each client's ``CUDA_VISIBLE_DEVICES``);
3. a multi-client start-up and a real cross-client psum: on the GPUs where
   there are 2 or more (NCCL), else 2 clients share the one GPU
   (``JDTENSOR_SHARE_GPUS=1``) and the psum runs on the CPU;
4. detection: a SIGKILLed client, an exception, a stall (stall time-out 5 s)
   while the others wait in that psum, each named by the launcher, with the
   seconds from the misbehaviour to the run's end;
5. a long kernel (12 s) on one client while the others wait: slow, never a
   stall (the run ends 0);
6. a restart after a SIGKILL loads the step from the JAX compilation cache
   the attempts share (``--max-restarts 1``), on every client: one client
   per GPU where there are 2 or more, else one client (on CPU, JAX keys a
   program by its process, so only a one-client run shares a cache).

``--platform cpu`` runs the same checks on CPU devices (2 clients), so that
the script itself is tested where there is no GPU
(tests/multiprocess/test_gpu_check.py). Exit status: 0 when every check
passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

try:
  from benchmarks._paths import ROOT, with_checkout
except ModuleNotFoundError:  # Run by path, as `python benchmarks/gpu_check.py`:
  # run again as the checkout's module, which imports `benchmarks` and
  # `jdtensor` from the checkout (a device machine has jdtensor uninstalled).
  _checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  os.execve(sys.executable, [sys.executable, "-m", "benchmarks.gpu_check", *sys.argv[1:]],
            {**os.environ, "PYTHONPATH": os.pathsep.join(
                [_checkout, *filter(None, [os.environ.get("PYTHONPATH")])])})
from jdtensor import _device_nodes, _env, launcher  # Never starts JAX.


CLIENT = os.path.join(ROOT, "benchmarks", "_gpu_check_client.py")
RECOVERY_CLIENT = os.path.join(ROOT, "benchmarks", "_recovery_client.py")
STALL_TIMEOUT = 5.0
BUSY_SECONDS = 12.0
LAUNCH_TIMEOUT = 120.0
# The whole check's budget: a check that would start after it is skipped.
BUDGET_SECONDS = 270.0


class Row:
  """One line of the table."""

  def __init__(self, check: str, clients: str, ok: bool, seconds: float | None,
               detail: str):
    self.check, self.clients, self.ok, self.seconds, self.detail = (
        check, clients, ok, seconds, detail)

  def markdown(self) -> str:
    seconds = "" if self.seconds is None else f"{self.seconds:.2f}"
    detail = self.detail.replace("|", "\\|").replace("\n", " ")[:300]
    return (f"| {self.check} | {self.clients} | {'ok' if self.ok else 'FAILED'} | "
            f"{seconds} | {detail} |")


class Plan:
  """What this machine runs: the device type, the clients, where they wait."""

  def __init__(self, platform_name: str):
    self.device = "GPU" if platform_name == "gpu" else "CPU"
    self.gpus = len(_device_nodes.gpu_identities(
        _env.process_environ(), _env.read_visible_gpus())) if self.device == "GPU" else 0
    self.shared = self.device == "GPU" and self.gpus == 1
    # At most 4 clients, one or more GPUs each (a divisor of the GPUs).
    self.clients = 2 if self.device == "CPU" or self.gpus <= 1 else max(
        d for d in range(1, min(self.gpus, 4) + 1) if self.gpus % d == 0)
    self.wait_on = "CPU" if self.device == "CPU" or self.shared else "GPU"

  def env(self, **extra: str) -> dict[str, str]:
    env = with_checkout({k: v for k, v in os.environ.items()
                         if not k.startswith(("DTENSOR_", "JDTENSOR_"))})
    env["JDTENSOR_HEARTBEAT_PERIOD"] = "0.5"
    if self.shared:
      env[_env.JDTENSOR_SHARE_GPUS] = "1"
    if self.device == "CPU":
      env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra)
    return env

  def spec(self, command: tuple[str, ...]) -> launcher.LaunchSpec:
    return launcher.LaunchSpec(command=command, num_clients=self.clients,
                               device_type=self.device, timeout=LAUNCH_TIMEOUT,
                               grace=5.0)

  def describe(self) -> str:
    if self.device == "CPU":
      return f"{self.clients} clients on CPU (--platform cpu: the script's own test)"
    if self.shared:
      return ("2 clients share the one GPU (JDTENSOR_SHARE_GPUS=1); they wait in a "
              "psum on the CPU (NCCL cannot run across clients on one GPU)")
    return (f"{self.clients} clients on {self.gpus} GPUs "
            f"({self.gpus // self.clients} each); they wait in a psum on the GPUs")


def launch(plan: Plan, scen: str, **extra: str
           ) -> tuple[launcher.LaunchResult, str, float]:
  """Runs the client with SCENARIO=`scen` on every client: the launcher's result,
  the clients' tagged output and stderr, and when the run ended (time.time())."""
  out, err = io.StringIO(), io.StringIO()
  env = plan.env(SCENARIO=scen, DEVICE=plan.device, WAIT_ON=plan.wait_on, **extra)
  result = launcher.launch(plan.spec((sys.executable, CLIENT)), out=out, err=err, env=env)
  return result, out.getvalue() + err.getvalue(), time.time()


def detection(plan: Plan, check: str, scen: str, named: str, **extra: str) -> Row:
  """A misbehaving client 1: named by the launcher, and how fast."""
  result, text, ended = launch(plan, scen, **extra)
  stamp = re.search(r"^\[client 1\] MISBEHAVING ([\d.]+)$", text, re.M)
  seconds = ended - float(stamp.group(1)) if stamp else None
  summary = next((line for line in reversed(text.splitlines())
                  if line.startswith("jdtensor launch:")), "")
  ok = (stamp is not None and result.exit_code != 0 and result.first_failure == 1
        and re.search(named, text) is not None)
  return Row(check, str(plan.clients), ok, seconds,
             summary if ok else f"exit {result.exit_code}, named "
             f"{result.first_failure}: {text[-1500:]}")


def single_client(plan: Plan) -> Row:
  env = plan.env(SCENARIO="api", DEVICE=plan.device)
  if plan.device == "GPU":
    env["CUDA_VISIBLE_DEVICES"] = (_env.read_visible_gpus() or ("0",))[0]
  start = time.perf_counter()
  try:
    res = subprocess.run([sys.executable, CLIENT], env=env, capture_output=True,
                         text=True, timeout=LAUNCH_TIMEOUT)
  except subprocess.TimeoutExpired:
    return Row("single-client API", "1", False, None, "timed out")
  line = next((x for x in res.stdout.splitlines() if x.startswith("API ok")), "")
  return Row("single-client API (init s)", "1", res.returncode == 0 and bool(line),
             float(line.split()[2]) if line else time.perf_counter() - start,
             line[len("API ok "):].split(" ", 1)[-1] if line else res.stderr[-1500:])


def assignment(plan: Plan) -> Row:
  if plan.device == "CPU":
    return Row("launcher GPU assignment", "-", True, None, "n/a on CPU")
  out, err = io.StringIO(), io.StringIO()
  result = launcher.launch(
      plan.spec(("sh", "-c", 'echo "GPUS=$CUDA_VISIBLE_DEVICES"')), out=out, err=err,
      env=plan.env())
  seen = sorted(re.findall(r"^\[client (\d+)\] GPUS=(.*)$", out.getvalue(), re.M))
  entries = [e for _, v in seen for e in v.split(",")]
  ok = (result.exit_code == 0 and len(seen) == plan.clients
        and (plan.shared or len(entries) == len(set(entries))))
  return Row("launcher GPU assignment", str(plan.clients), ok, None,
             "; ".join(f"client {c}: {v}" for c, v in seen) or err.getvalue()[-1500:])


def startup(plan: Plan) -> Row:
  start = time.perf_counter()
  result, text, _ = launch(plan, "none")
  inits = [float(s) for s in re.findall(r"^\[client \d+\] INIT ([\d.]+)", text, re.M)]
  psum = re.search(r"^\[client 0\] (PSUM .*)$", text, re.M)
  ok = result.exit_code == 0 and len(inits) == plan.clients and psum is not None
  return Row("start-up and cross-client psum (slowest init s)", str(plan.clients), ok,
             max(inits) if inits else time.perf_counter() - start,
             psum.group(1) if ok and psum else text[-1500:])


def busy(plan: Plan, seconds: float) -> Row:
  result, text, _ = launch(plan, "busy", BUSY_SECONDS=str(seconds),
                           JDTENSOR_STALL_TIMEOUT=str(STALL_TIMEOUT))
  took = re.search(r"^\[client 1\] BUSY ([\d.]+)$", text, re.M)
  ok = (result.exit_code == 0 and took is not None and float(took.group(1)) >= seconds
        and "stalled" not in text)
  return Row(f"a {seconds:g} s kernel on client 1, stall time-out "
             f"{STALL_TIMEOUT:g} s: not a stall (kernel s)", str(plan.clients), ok,
             float(took.group(1)) if took else None,
             "exit 0, nobody named" if ok else f"exit {result.exit_code}: {text[-1500:]}")


def cache_restart(plan: Plan) -> Row:
  """The last client SIGKILLed after step 2, restarted once: every client of
  the next attempt loads the step from the compilation cache the attempts
  share (JAX's own cache-hit line, `_recovery_client.py`), after restoring
  its checkpoint."""
  clients = 1 if plan.device == "CPU" or plan.shared else plan.clients
  spec = dataclasses.replace(plan.spec((sys.executable, RECOVERY_CLIENT)),
                             num_clients=clients, max_restarts=1)
  ckpt = tempfile.mkdtemp(prefix="jdtensor-gpu-check-")
  env = plan.env(DEVICE=plan.device, LAYERS="60", STEPS="4", EVERY="2", KILL_AT="2",
                 KILL=str(clients - 1), CKPT=ckpt)
  env.pop(_env.JDTENSOR_SHARE_GPUS, None)  # One client a GPU.
  out, err = io.StringIO(), io.StringIO()
  try:
    result = launcher.launch(spec, out=out, err=err, env=env)
  finally:
    shutil.rmtree(ckpt, ignore_errors=True)
  text = out.getvalue() + err.getvalue()
  got = {int(c): json.loads(r) for c, r in
         re.findall(r"^\[client (\d+)\] RESULT attempt=(.*)$", text, re.M)}
  ttr = re.search(r"time to recovery: restart 1 after client \d+'s failure: "
                  r"(\d+\.\d) s", text)
  ok = (result.exit_code == 0 and sorted(got) == list(range(clients)) and ttr is not None
        and all(r["attempt"] == 1 and "jit_step" in r["hits"] for r in got.values()))
  return Row("a restart loads the step from the compilation cache (s to recovery)",
             str(clients), ok, float(ttr.group(1)) if ttr else None,
             "every client's resumed step came from the cache" if ok
             else f"exit {result.exit_code}: {text[-1500:]}")


def machine(plan: Plan) -> str:
  def version(name: str) -> str:
    try:
      return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      return "absent"
  gpus = ""
  if plan.device == "GPU":
    try:
      gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                            timeout=20).stdout.strip().replace("\n", "; ")
    except (OSError, subprocess.TimeoutExpired):
      gpus = "nvidia-smi not available"
  return (f"{datetime.date.today().isoformat()}, {platform.node()}: Python "
          f"{platform.python_version()}, jax {version('jax')}, jaxlib "
          f"{version('jaxlib')}; {plan.describe()}" + (f"; {gpus}" if gpus else ""))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="gpu_check.md",
                      help="where the table is written (default: ./gpu_check.md)")
  parser.add_argument("--platform", choices=("gpu", "cpu"), default="gpu")
  parser.add_argument("--busy-seconds", type=float, default=BUSY_SECONDS,
                      help="the long kernel's length (more than the stall "
                      f"time-out, {STALL_TIMEOUT:g} s)")
  args = parser.parse_args(argv)
  plan = Plan(args.platform)
  if plan.device == "GPU" and not plan.gpus:
    print("gpu_check: this machine shows no GPU (no /dev/nvidia<N>, or "
          "CUDA_VISIBLE_DEVICES is empty). Run it on a GPU machine, or with "
          "--platform cpu to test the script itself.", file=sys.stderr)
    return 2
  started = time.monotonic()
  checks = [
      lambda: single_client(plan),
      lambda: assignment(plan),
      lambda: startup(plan),
      lambda: detection(plan, "a SIGKILLed client (s to the run's end)", "kill",
                        r"jdtensor launch: client 1 was killed by SIGKILL"),
      lambda: detection(plan, "an exception on a client (s to the run's end)", "raise",
                        r"RuntimeError: gpu_check: client 1 raises"),
      lambda: detection(plan, f"a stalled client, stall time-out {STALL_TIMEOUT:g} s "
                        "(s to the run's end)", "stall", r"client 1 stalled",
                        JDTENSOR_STALL_TIMEOUT=str(STALL_TIMEOUT)),
      lambda: busy(plan, args.busy_seconds),
      lambda: cache_restart(plan),
  ]
  rows = []
  for check in checks:
    if time.monotonic() - started > BUDGET_SECONDS:
      rows.append(Row("(skipped: over the 5-minute budget)", "-", False, None, ""))
      break
    rows.append(check())
    print(rows[-1].markdown(), flush=True)
  text = "\n".join([
      f"jdtensor gpu_check: {machine(plan)}; {time.monotonic() - started:.0f} s in all",
      "", "| check | clients | result | seconds | detail |", "|---|---:|---|---:|---|",
      *(r.markdown() for r in rows), ""])
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(text)
  print(text)
  failed = [r.check for r in rows if not r.ok]
  print(f"gpu_check: {len(rows) - len(failed)} of {len(rows)} checks passed; "
        f"table in {args.out}", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
