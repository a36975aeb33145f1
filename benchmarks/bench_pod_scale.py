"""Pod scale with the real code: start-up, a beat's cost, the heartbeat's CPU
and its detection, at N clients on one machine.

    python -m benchmarks.bench_pod_scale [--clients 256,1024,4096] [--processes 4]

No JAX: N clients run as threads in a few processes, each with the real
start-up handshake (`jdtensor.runtime.rendezvous`), liveness links, exchange
(`jdtensor.heartbeat.exchange.LinkExchange`), watchdog and verdicts
(`jdtensor.heartbeat.protocol.Heartbeat`); only what JAX would tell the
heartbeat is a stand-in at its interface (the main thread's phase, and that
the client has joined a collective). Client 0 runs alone in the first
process; the client that fails, alone in the second.

Per N, two runs at the default period (2 s):
1. Start-up: seconds from the start signal to the last client's ``go``,
   client 0's CPU seconds in it, and the descriptors client 0 held.
2. A beat's bytes (the real exchange on client 0, its links replaced by a
   counter): what one client sends, an outcome's size, what client 0 sends
   a beat (a mean: without news, an outcome goes out every `ACK_EVERY`
   beats).
3. The heartbeat's CPU, idle clients, over `CPU_BEATS` beats (two rounds of
   outcomes) after a warm-up:
   client 0's process, and the others' processes per client (a mean; the
   clients there share one GIL, so this is a bound), in % of one core.
4. Detection: the failing client's process is SIGKILLed; seconds until the
   last survivor has named it (its verdict, just before its exit). A second
   run: once every client beats, the failing client stalls (its own code,
   idle, while every other client waits in a collective) with a 4 s stall
   time-out; seconds from the time-out to the last survivor's verdict
   (verdicts come at beats, so this is up to a period, then the staller's
   stack shared through client 0).

A simulated client is as faithful to a real one as a thread can be: it
records its own thread's stack at a verdict (a real process holds its own
few threads, not a thousand clients'); its heartbeat's log lines (to
/dev/null here) are left out below errors and its verdict's line to stderr
is discarded, so that a thousand threads do not queue on one handler's or
stream's lock; and a worker's GIL switch interval is 0.2 s, so that a
thousand threads woken at once do not each wake every 5 ms to ask for the
GIL (`SWITCH_INTERVAL`).

The last line: ``pod scale: N clients: detection X s, client 0 heartbeat Y%
of a core, Z bytes a beat at client 0`` for the largest N.

The simulation's limits: one machine's loopback, not a data-centre network
(loopback's send also does the receiver's TCP work, so client 0's CPU here
is an upper bound); N clients share 2 cores and a few GILs, so start-up
and the other clients' CPU are bounds, not estimates.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np

from jdtensor._deadline import Deadline
from jdtensor._env import HeartbeatSettings
from jdtensor._wire import Frames, encode, encode_binary
from jdtensor.heartbeat.exchange import ROW_FRAME, LinkExchange, ack_every_for
from jdtensor.heartbeat.flight import RUNNING, WAITING
from jdtensor.heartbeat.interfaces import ProcessHooks
from jdtensor.heartbeat.protocol import Heartbeat
from jdtensor.heartbeat.verdicts import Row
from jdtensor.launcher import free_ports
from jdtensor.runtime import rendezvous


SECRET = "pod-scale-bench-" * 4
TIMEOUT = 300.0
PERIOD = 2.0  # The default period.
STALL_TIMEOUT = 4.0
# Client 0 sends an outcome without news every ACK_EVERY beats at the
# default period and stuck time-out.
ACK_EVERY = ack_every_for(PERIOD, HeartbeatSettings().stuck_timeout)
# Beats over which the heartbeat's CPU is measured: two whole rounds of
# outcomes, so that the figure is a beat's mean.
CPU_BEATS = 2 * ACK_EVERY
# Seconds after a failure (or a stall's time-out) before the driver first
# asks the workers for verdicts.
QUIET = 3 * PERIOD
# Each worker's GIL switch interval (seconds; CPython's default is 5 ms).
SWITCH_INTERVAL = 0.2
# Seconds one run (its start-up, beats and verdicts) may take in all before
# its workers are killed: no read of a worker's output waits for ever.
RUN_DEADLINE = 2 * TIMEOUT + 300.0


def _jobs(n: int, port: int) -> tuple[str, ...]:
  # Only client 0's address is dialled; the others are compared as a digest.
  return (f"127.0.0.1:{port}",) + tuple(f"127.0.0.1:{i}" for i in range(1, n))


def _open_files() -> int:
  return len(os.listdir("/proc/self/fd"))


class _StandInRecorder:
  """What JAX's main thread would show: one phase since `since` (wall time;
  None: the phase has not begun, so a client has been in it 0 s)."""
  at_exit, joined, active = False, True, True

  def __init__(self, phase: int, since: float | None):
    self.phase, self.since = phase, since

  def sample(self, busy: float = 0.0, idle_percent: float = 0.0,
             moving: bool = False) -> tuple[int, float]:
    return self.phase, 0.0 if self.since is None else max(0.0, time.time() - self.since)

  def where(self) -> str:
    return "bench_pod_scale.py (stand-in main thread)"

  def where_in_program(self) -> str:
    return self.where()


class _StandInExchange(LinkExchange):
  """The real exchange; only "has this client joined a collective" (a
  question to JAX) is answered yes."""

  def joined_collective(self) -> bool:
    return True


class _Hooks(ProcessHooks):
  """The process as the heartbeat sees it, but a thread: the verdict's time
  is noted where the real one tells the launcher (just before its exit), and
  the exit is not taken."""

  def __init__(self, client: int, verdicts: dict[int, tuple[float, list[int]]]):
    self.client, self.verdicts = client, verdicts

  def tell_launcher(self, clients: list[int], why: str, leaving: bool) -> None:
    self.verdicts.setdefault(self.client, (time.time(), clients))

  def terminate(self, code: int) -> None:
    pass

  def cpu_seconds(self) -> float:
    return 0.0  # Idle: the stand-in main thread does nothing.

  def thread_stacks(self) -> str:
    # A real client's process holds its own few threads; a worker here holds
    # a thousand clients' threads, so a client records only its own: the
    # beat thread that names the verdict.
    return "".join(traceback.format_stack())


class _Discarded:
  """A stream that keeps nothing, and has no lock to queue on."""

  def write(self, text: str) -> int:
    return len(text)

  def flush(self) -> None:
    pass


def worker(n: int, port: int, mine: list[int], mode: str) -> None:
  """Clients `mine` of `n` as threads. Commands on stdin: ``go`` meets
  client 0 (one ``GO`` line per client, then ``MET``); ``beat T`` starts
  every client's heartbeat (the failing client, n - 1, stalls from wall
  time T in mode ``stall``; ``BEATING`` once every first exchange is done);
  ``stall T`` (mode ``stall``): the failing client stalls, and the others
  wait, from wall time T (sent once every client beats, so that the stall
  time-out is timed from the steady state, not from a first exchange that
  a thousand threads on one GIL take their time over: ``STALLING``);
  ``report`` prints each client's verdict (``V client time culprits``);
  end of input ends the process."""
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
  # Each real client writes its heartbeat's lines to its own stderr; here a
  # thousand clients would queue on one handler's lock to write them to
  # /dev/null (the worker's stderr), and a watchdog starved of the GIL by a
  # thousand threads warns that its process paused: errors only.
  logging.getLogger("jdtensor").setLevel(logging.ERROR)
  # The line a survivor writes at its verdict goes to its own stderr in a
  # real run; here a thousand threads would queue on one stream's lock.
  sys.stderr = _Discarded()
  threading.stack_size(256 * 1024)
  # CPython wakes every thread waiting for the GIL once a switch interval to
  # ask for it: a thousand client threads woken at once by a verdict, at the
  # default 5 ms, are some 200,000 futex wake-ups a second, nearly all the
  # system time of a run (a SIGKILL at 2,048 clients reached the last
  # survivor in 7.6 s, not 0.5 s). A real client holds a few threads, and
  # every one here blocks within microseconds, so a longer interval changes
  # whom the GIL goes to next, not what any client does.
  sys.setswitchinterval(SWITCH_INTERVAL)
  jobs = _jobs(n, port)
  settings = (("DTENSOR_JOB_NAME", "worker"),)
  start = threading.Event()
  results: dict[int, str] = {}
  meetings: dict[int, Any] = {}
  lock = threading.Lock()

  def client(c: int) -> None:
    # Fixed versions: the simulated clients share one process, and reading
    # the real ones would put a JAX import inside the measured handshake.
    hello = rendezvous.Hello(c, n, jobs, 1, True, settings,
                             software=rendezvous.Software("0.1.0", "0", "0", False))
    start.wait()
    cpu = time.thread_time()
    try:
      meeting = rendezvous.rendezvous(hello, jobs[0], ("127.0.0.1", port),
                                      Deadline(TIMEOUT), SECRET)
    except Exception as e:  # pylint: disable=broad-except
      results[c] = f"ERROR {c} {type(e).__name__}: {e}"
      return
    done = time.time()
    with lock:
      meetings[c] = meeting
      fds = _open_files() if c == 0 else 0
    results[c] = f"GO {c} {done:.6f} {time.thread_time() - cpu:.4f} {fds}"
  threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in mine]
  for t in threads:
    t.start()
  print("READY", flush=True)
  verdicts: dict[int, tuple[float, list[int]]] = {}
  beats = []
  recorders: list[_StandInRecorder] = []
  for line in sys.stdin:
    command = line.split()
    if command[0] == "go":
      start.set()
      for t in threads:
        t.join(TIMEOUT + 10)
      print("\n".join(results[c] for c in mine if c in results), flush=True)
      print("MET", flush=True)
    elif command[0] == "stall":
      for recorder in recorders:
        recorder.since = float(command[1])
      print("STALLING", flush=True)
    elif command[0] == "beat":
      since = float(command[1])
      hb_settings = HeartbeatSettings(
          period=PERIOD, stall_timeout=STALL_TIMEOUT if mode == "stall" else 300.0)
      for c in mine:
        phase = RUNNING
        if mode == "stall":
          phase = RUNNING if c == n - 1 else WAITING
        links = meetings[c].links
        exchange = _StandInExchange(c, n, links, ACK_EVERY)
        recorder = _StandInRecorder(phase, None if mode == "stall" else since)
        recorders.append(recorder)
        hb = Heartbeat(hb_settings, c, n, exchange=exchange,
                       peers=links, process=_Hooks(c, verdicts), recorder=recorder)
        links.watch(hb)
        hb.start_threads()
        beats.append(hb)
      for hb in beats:
        hb.ready.wait(TIMEOUT)
      print("BEATING", flush=True)
    elif command[0] == "report":
      for c in mine:
        if c in verdicts:
          at, culprits = verdicts[c]
          print(f"V {c} {at:.6f} {','.join(map(str, culprits))}")
      print("END", flush=True)
  os._exit(0)  # pylint: disable=protected-access  # Every thread is a daemon.


class _Workers:
  """The worker processes of one run: client 0 alone, the failing client
  (n - 1) alone, the others spread over `processes`."""

  def __init__(self, n: int, processes: int, mode: str):
    self.n = n
    port = free_ports(1)[0]
    rest = list(range(1, n - 1))
    groups = [[0], [n - 1]] + [rest[w::processes] for w in range(processes)]
    self.groups = [g for g in groups if g]
    self.procs = [subprocess.Popen(
        [sys.executable, __file__, "--worker", str(n), str(port), mode,
         ",".join(map(str, g))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True) for g in self.groups]
    self.expired = False
    self._deadline = threading.Timer(RUN_DEADLINE, self._expire)
    self._deadline.daemon = True
    self._deadline.start()
    try:
      for p in self.procs:
        if p.stdout.readline().strip() != "READY":
          raise RuntimeError(f"{n} clients: a worker did not start")
    except BaseException:
      self.close()
      raise

  def _expire(self) -> None:
    """Past `RUN_DEADLINE`: kills every worker (each pending read then ends)."""
    self.expired = True
    for p in self.procs:
      p.kill()

  def tell(self, command: str, until: str, procs: list[Any] | None = None
           ) -> list[list[str]]:
    """Sends `command` to every worker; their lines up to `until`."""
    procs = self.procs if procs is None else procs
    for p in procs:
      p.stdin.write(command + "\n")
      p.stdin.flush()
    lines = []
    for p in procs:
      for line in iter(p.stdout.readline, ""):
        if line.strip() == until:
          break
        lines.append(line.split())
    if self.expired:
      raise RuntimeError(f"{self.n} clients: the workers did not answer "
                         f"{command.split()[0]!r} within {RUN_DEADLINE:g} s; killed")
    return lines

  def cpu(self) -> list[float]:
    """Each worker's CPU seconds so far (utime + stime)."""
    out = []
    for p in self.procs:
      try:
        with open(f"/proc/{p.pid}/stat") as f:
          fields = f.read().rsplit(")", 1)[1].split()
        out.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
      except (OSError, IndexError, ValueError):
        out.append(float("nan"))
    return out

  def close(self) -> None:
    self._deadline.cancel()
    for p in self.procs:
      try:
        p.stdin.close()
      except OSError:
        pass
    for p in self.procs:
      try:
        p.wait(30)
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)


def startup(workers: _Workers) -> tuple[float, float, int]:
  """(seconds to the last go, client 0's CPU seconds, its descriptors)."""
  started = time.time()
  lines = workers.tell("go", "MET")
  errors = [" ".join(x) for x in lines if x[0] == "ERROR"]
  if errors or len(lines) != workers.n:
    raise RuntimeError(f"{workers.n} clients: {len(lines)} answered; {errors[:3]}")
  last = max(float(x[2]) for x in lines)
  zero = next(x for x in lines if x[1] == "0")
  return last - started, float(zero[3]), int(zero[4])


def _verdicts(workers: _Workers, after: float, wait: float) -> list[list[str]]:
  """Every survivor's verdict line, asking until all are in or `wait` s
  after `after`. The first question waits `QUIET` s past `after`: each
  answer is a thousand lines from a worker's main thread, which would take
  the GIL from the clients still coming to their verdicts (each client
  notes its verdict's time itself, so asking later changes no figure)."""
  survivors = workers.procs[:1] + workers.procs[2:]
  time.sleep(max(0.0, after + QUIET - time.time()))
  deadline = after + wait
  while True:
    lines = workers.tell("report", "END", survivors)
    if len(lines) >= workers.n - 1 or time.time() > deadline:
      return lines
    time.sleep(0.5)


def heartbeat_run(n: int, processes: int, mode: str, cpu_beats: int = CPU_BEATS
                  ) -> dict[str, Any]:
  """One run: start-up, the heartbeat's CPU (mode ``kill``), then the
  failing client's end and every survivor's verdict."""
  workers = _Workers(n, processes, mode)
  out: dict[str, Any] = {}
  try:
    out["startup"] = startup(workers)
    since = time.time()
    workers.tell(f"beat {since:.6f}", "BEATING")
    if mode == "kill":
      time.sleep(2 * PERIOD)  # Warm-up.
      before, wall = workers.cpu(), time.monotonic()
      time.sleep(cpu_beats * PERIOD)
      after, wall = workers.cpu(), time.monotonic() - wall
      used = [a - b for a, b in zip(after, before)]
      out["client0_cpu"] = 100.0 * used[0] / wall
      others = sum(len(g) for g in workers.groups[2:])
      out["other_cpu"] = 100.0 * sum(used[2:]) / wall / max(others, 1)
      killed = time.time()
      workers.procs[1].kill()
      lines = _verdicts(workers, killed, QUIET + 30.0)
      start = killed
    else:
      stalled = time.time()
      workers.tell(f"stall {stalled:.6f}", "STALLING")
      start = stalled + STALL_TIMEOUT
      lines = _verdicts(workers, start, QUIET + 30.0)
    named = [x for x in lines if x[0] == "V" and x[3] == str(n - 1)]
    wrong = [x for x in lines if x[0] == "V" and x[3] != str(n - 1)]
    if wrong or not named:
      raise RuntimeError(f"{n} clients, {mode}: {len(named)} of {n - 1} survivors "
                         f"named client {n - 1}; others named: {wrong[:3]}")
    times = sorted(float(x[2]) - start for x in named)
    # Every survivor, or as many as named it while the driver asked (the
    # harness's own bound: a thousand client threads share one GIL).
    out["named"] = len(named)
    out["detection"] = times[-1] if len(named) == n - 1 else float("nan")
    out["detection_first"], out["detection_median"] = times[0], times[len(times) // 2]
    out["detection_last_named"] = times[-1]
  finally:
    workers.close()
  return out


class _CountingLinks:
  """Links that count the bytes client 0 would send instead of sending."""

  def __init__(self, n: int):
    self.n, self.sent, self.largest = n, 0, 0
    self.carrier = None

  def carry(self, handler):
    self.carrier = handler

  def send(self, message, to=None, skip=()):
    size = len(encode_binary(message) if isinstance(message, bytes) else encode(message))
    targets = 1 if to is not None else self.n - 1 - len(skip)
    self.sent += size * targets
    self.largest = max(self.largest, size)


def beat(n: int) -> tuple[int, int, float, float]:
  """(bytes a client sends a beat, bytes of an outcome without news, bytes
  client 0 sends a beat (mean over a round of `ACK_EVERY` beats), client
  0's CPU seconds a beat (median)), with the real exchange on client 0: the
  frames each link would bring, decoded, gathered and decided."""
  links = _CountingLinks(n)
  exchange = LinkExchange(0, n, links, ACK_EVERY)
  exchange.open(Heartbeat(HeartbeatSettings(), 0, n).decider)
  cpu, sent = [], []
  row_bytes = 0
  for b in range(1 + ACK_EVERY):  # The first beat, then a round.
    links.sent = 0
    token = 0 if b == 0 else 4242
    row = encode_binary(ROW_FRAME.pack(ord("R"), b, token, 0, RUNNING, 37, 3, 0))
    row_bytes = len(row)
    frames = [Frames(lenient=True, binary=True) for _ in range(1, n)]
    started = time.thread_time()
    for c, frame in zip(range(1, n), frames):
      for message in frame.feed(row):
        links.carrier(c, message)
    exchange.beat(Row(0, 4242, False, RUNNING, 37, 3, first=b == 0))
    cpu.append(time.thread_time() - started)
    sent.append(links.sent)
  return row_bytes, links.largest, float(np.mean(sent[1:])), float(np.median(cpu))


def _detection(run: dict[str, Any], n: int) -> str:
  """The last survivor's seconds, with the first's and the median's; or how
  many survivors named the culprit while the driver asked."""
  if "named" not in run:
    return "-"
  first, median = run["detection_first"], run["detection_median"]
  if run["named"] == n - 1:
    return f"{run['detection']:.2f} ({first:.2f} / {median:.2f})"
  return (f"{run['named']} of {n - 1} in {run['detection_last_named']:.0f} s "
          f"({first:.2f} / {median:.2f})")


def main(argv: list[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", default="256,1024,4096")
  parser.add_argument("--processes", type=int, default=4)
  parser.add_argument("--cpu-beats", type=int, default=CPU_BEATS,
                      help="beats over which the heartbeat's CPU is measured")
  parser.add_argument("--stall", choices=["on", "off"], default="on",
                      help="also measure a stall's detection (a second start-up)")
  parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    n, port, mode, mine = args.worker
    worker(int(n), int(port), [int(c) for c in mine.split(",")], mode)
    return ""
  rows = ["| clients | start-up s | client 0 CPU s in it | client 0 descriptors | "
          "bytes a client sends a beat | bytes of an outcome | "
          "bytes client 0 sends a beat (mean) | client 0 CPU a beat (ms) | "
          "client 0 heartbeat % of a core | other clients % (mean) | "
          "SIGKILL detection s, last survivor (first / median) | stall detection s "
          "after the time-out, last survivor (first / median) |",
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  last = ""
  for n in (int(x) for x in args.clients.split(",")):
    kill = heartbeat_run(n, args.processes, "kill", args.cpu_beats)
    stall = (heartbeat_run(n, args.processes, "stall") if args.stall == "on"
             else {})
    seconds, cpu, fds = kill["startup"]
    sends, outcome, zero_sends, beat_cpu = beat(n)
    rows.append(f"| {n} | {seconds:.2f} | {cpu:.2f} | {fds} | {sends} | {outcome} | "
                f"{zero_sends:.0f} | {beat_cpu * 1e3:.1f} | {kill['client0_cpu']:.2f} | "
                f"{kill['other_cpu']:.3f} | {_detection(kill, n)} | "
                f"{_detection(stall, n)} |")
    print(rows[-1], flush=True)
    last = (f"pod scale: {n} clients: detection {kill['detection']:.2f} s, client 0 "
            f"heartbeat {kill['client0_cpu']:.2f}% of a core, {zero_sends:.0f} bytes a "
            "beat at client 0")
  text = "\n".join(rows + ["", last])
  print(text)
  return text


if __name__ == "__main__":
  main()
