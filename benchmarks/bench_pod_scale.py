"""Pod scale with the real code: start-up of N clients, and what a beat costs.

    python benchmarks/bench_pod_scale.py [--clients 256,1024,4096] [--processes 4]

No JAX: what this measures runs before JAX starts or beside it.

1. Start-up: N clients meet client 0 through the real handshake
   (`jdtensor.runtime.rendezvous`, authenticated, every client's hello
   checked), as threads in a few processes (`--processes`; client 0 in the
   first). Printed: seconds from the start signal to the last client's
   ``go``, client 0's CPU seconds in it, and the descriptors client 0 held.
2. A beat: the real exchange (`jdtensor.heartbeat.exchange.LinkExchange`)
   on client 0 takes one row from every client and sends the sum back to
   every client; its links are replaced by a counter of the bytes it would
   send. Printed: bytes one client sends and receives per beat, bytes
   client 0 sends per beat, and client 0's CPU per beat (decoding, summing,
   encoding; no system calls).

The last line: ``pod scale: N clients: start-up X s, client 0 Y bytes a beat``
for the largest N.

The simulation's limits: one machine's loopback, not a data-centre network;
the clients are threads, which share their process's CPU and GIL, so
start-up here is slower than N machines' would be (a bound, not an
estimate). The heartbeat's CPU and detection at scale are not measured
here yet (issue #42, items 2-3: the beat itself must first become O(1) per
client).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from jdtensor._deadline import Deadline  # noqa: E402
from jdtensor._wire import encode  # noqa: E402
from jdtensor.heartbeat.exchange import LinkExchange  # noqa: E402
from jdtensor.heartbeat.flight import RUNNING  # noqa: E402
from jdtensor.heartbeat.protocol import BeatLayout  # noqa: E402
from jdtensor.launcher import free_ports  # noqa: E402
from jdtensor.runtime import rendezvous  # noqa: E402

SECRET = "pod-scale-bench-" * 4
TIMEOUT = 300.0


def _jobs(n: int, port: int) -> tuple[str, ...]:
  # Only client 0's address is dialled; the others are compared as a digest.
  return (f"127.0.0.1:{port}",) + tuple(f"127.0.0.1:{i}" for i in range(1, n))


def _open_files() -> int:
  return len(os.listdir("/proc/self/fd"))


def worker(n: int, port: int, first: int, step: int) -> None:
  """Clients first, first + step, ... of `n` as threads: waits for a line
  on stdin, meets client 0, prints one line per client, then waits for
  stdin to close before closing its links."""
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
  jobs = _jobs(n, port)
  settings = (("DTENSOR_JOB_NAME", "worker"),)
  mine = list(range(first, n, step))
  start = threading.Event()
  results: dict[int, str] = {}
  meetings = []
  lock = threading.Lock()

  def client(c: int) -> None:
    hello = rendezvous.Hello(c, n, jobs, 1, True, settings)
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
      meetings.append(meeting)
      fds = _open_files() if c == 0 else 0
    results[c] = f"GO {c} {done:.6f} {time.thread_time() - cpu:.4f} {fds}"
  threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in mine]
  for t in threads:
    t.start()
  print("READY", flush=True)
  sys.stdin.readline()
  start.set()
  for t in threads:
    t.join(TIMEOUT + 10)
  print("\n".join(results[c] for c in mine if c in results), flush=True)
  print("END", flush=True)
  sys.stdin.read()  # The links stay open until every worker is done.


def startup(n: int, processes: int) -> tuple[float, float, int]:
  """(seconds to the last go, client 0's CPU seconds, its descriptors)."""
  port = free_ports(1)[0]
  procs = [subprocess.Popen(
      [sys.executable, __file__, "--worker", str(n), str(port), str(w), str(processes)],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
      for w in range(processes)]
  try:
    for p in procs:
      assert p.stdout.readline().strip() == "READY"
    started = time.time()
    for p in procs:
      p.stdin.write("go\n")
      p.stdin.flush()
    lines = []
    for p in procs:
      for line in iter(p.stdout.readline, ""):
        if line.strip() == "END":
          break
        lines.append(line.split())
  finally:
    for p in procs:
      try:
        p.stdin.close()
      except OSError:
        pass
    for p in procs:
      try:
        p.wait(30)
      except subprocess.TimeoutExpired:
        p.kill()
  errors = [" ".join(x) for x in lines if x[0] == "ERROR"]
  if errors or len(lines) != n:
    raise RuntimeError(f"{n} clients: {len(lines)} answered; {errors[:3]}")
  last = max(float(x[2]) for x in lines)
  zero = next(x for x in lines if x[1] == "0")
  return last - started, float(zero[3]), int(zero[4])


class _CountingLinks:
  """Links that count the bytes client 0 would send instead of sending."""

  def __init__(self, n: int):
    self.n, self.sent, self.largest = n, 0, 0
    self.carrier = None

  def carry(self, handler):
    self.carrier = handler

  def send(self, message, to=None, skip=()):
    size = len(encode(message))
    targets = 1 if to is not None else self.n - 1 - len(skip)
    self.sent += size * targets
    self.largest = max(self.largest, size)


def beat(n: int, beats: int = 3) -> tuple[int, int, int, float]:
  """(bytes a client sends, bytes a client receives, bytes client 0 sends,
  client 0's CPU seconds) for one beat, with the real exchange on client 0."""
  layout = BeatLayout(n)
  links = _CountingLinks(n)
  exchange = LinkExchange(0, n, links)
  exchange.open()
  rows = []
  for c in range(1, n):
    row = layout.row(c, 4242, False, RUNNING, 37, 3)
    nonzero = np.flatnonzero(row)
    rows.append((c, {"hb": "row", "i": nonzero.tolist(), "v": row[nonzero].tolist()}))
  row_bytes = max(len(encode({**m, "b": 0})) for _, m in rows)
  own = layout.row(0, 4242, False, RUNNING, 37, 3)
  cpu = []
  for b in range(beats):
    links.sent = 0
    # What client 0's watching thread decodes from each link, then the sum.
    frames = [encode({**m, "b": b}) for _, m in rows]
    started = time.thread_time()
    for (c, _), frame in zip(rows, frames):
      links.carrier(c, json.loads(frame))
    exchange.all_reduce(own)
    cpu.append(time.thread_time() - started)
  return row_bytes, links.largest, links.sent, float(np.median(cpu))


def main(argv: list[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", default="256,1024,4096")
  parser.add_argument("--processes", type=int, default=4)
  parser.add_argument("--worker", nargs=4, type=int, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    n, port, first, step = args.worker
    worker(n, port, first, step)
    return ""
  rows = ["| clients | start-up s | client 0 CPU s in it | client 0 descriptors | "
          "bytes a client sends a beat | bytes a client receives a beat | "
          "bytes client 0 sends a beat | client 0 CPU a beat (ms) |",
          "|---:|---:|---:|---:|---:|---:|---:|---:|"]
  last = ""
  for n in (int(x) for x in args.clients.split(",")):
    seconds, cpu, fds = startup(n, args.processes)
    sends, receives, zero_sends, beat_cpu = beat(n)
    rows.append(f"| {n} | {seconds:.2f} | {cpu:.2f} | {fds} | {sends} | {receives} | "
                f"{zero_sends} | {beat_cpu * 1e3:.1f} |")
    print(rows[-1], flush=True)
    last = (f"pod scale: {n} clients: start-up {seconds:.2f} s, client 0 "
            f"{zero_sends} bytes a beat")
  text = "\n".join(rows + ["", last])
  print(text)
  return text


if __name__ == "__main__":
  main()
