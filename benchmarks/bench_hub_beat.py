"""Client 0's cost of a beat alone, at N clients: the real links, exchange
and decider over N real TCP connections, nothing else on the machine's
clock.

    python -m benchmarks.bench_hub_beat [--clients 1024,4096] [--beats 2]

`bench_pod_scale.py` runs every client's real heartbeat as threads, so on a
2-core machine client 0's figure there carries the other clients' load
(their processes take the cores and client 0's caches). Here one driver
process (one thread) stands for clients 1..N-1: each beat it sends every
client's row on its own connection and reads whatever comes back; client 0
is the real `jdtensor.runtime.links.Links`, `LinkExchange` and `Decider`.
Client 0's user and system CPU seconds a beat (its whole process: the
links' thread receives, decides and sends) are medians over the beats,
measured twice in one run:

* ``every beat``: an outcome to every client every beat (``ack_every=1``);
* ``default``: without news, an outcome every `ACK_EVERY` beats (the
  default period and stuck time-out).

and given as % of one core at the default period (2 s). Loopback's send
also does the receiver's TCP work, so system time here is an upper bound
for a real network.
"""

from __future__ import annotations

import argparse
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import threading

from jdtensor._env import HeartbeatSettings
from jdtensor._wire import encode_binary
from jdtensor.heartbeat.exchange import ROW_FRAME, LinkExchange, ack_every_for
from jdtensor.heartbeat.flight import RUNNING
from jdtensor.heartbeat.protocol import Heartbeat
from jdtensor.heartbeat.verdicts import Row
from jdtensor.runtime.links import Links


PERIOD = 2.0  # The default period.
ACK_EVERY = ack_every_for(PERIOD, HeartbeatSettings().stuck_timeout)
TOKEN = 4242
DEADLINE = 120.0  # Seconds any wait of this benchmark may take.


def _raise_open_files(need: int) -> None:
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  if soft < need:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))


def driver(n: int, port: int) -> None:
  """Clients 1..n-1 in one thread: a row each on "go", outcomes drained."""
  _raise_open_files(n + 64)
  socks = []
  for c in range(1, n):
    sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
    sock.sendall(c.to_bytes(4, "little"))
    sock.setblocking(False)
    socks.append(sock)
  poller = select.epoll()
  for sock in socks:
    poller.register(sock.fileno(), select.EPOLLIN)
  print("ready", flush=True)
  beat = 0
  for line in sys.stdin:
    if line.strip() != "go":
      break
    row = encode_binary(ROW_FRAME.pack(ord("R"), beat, 0 if beat == 0 else TOKEN, 0,
                                       RUNNING, 37, 3, 0))
    for sock in socks:
      sock.sendall(row)
    beat += 1
    for fd, _ in poller.poll(0):
      try:
        os.read(fd, 65536)
      except BlockingIOError:
        pass


def hub_round(n: int, ack_every: int, beats: int) -> tuple[float, float]:
  """Client 0's (user, system) CPU seconds a beat, medians over `beats`
  rounds of `ack_every` beats each (a beat's mean in each round)."""
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen(n)
  listener.settimeout(DEADLINE)
  proc = subprocess.Popen(
      [sys.executable, __file__, "--driver", str(n), str(listener.getsockname()[1])],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    sockets = {}
    for _ in range(1, n):
      conn, _ = listener.accept()
      conn.settimeout(DEADLINE)
      sockets[int.from_bytes(conn.recv(4), "little")] = conn
    assert proc.stdout is not None and proc.stdin is not None
    ready = select.poll()
    ready.register(proc.stdout, select.POLLIN)
    if not ready.poll(DEADLINE * 1000) or proc.stdout.readline().strip() != "ready":
      raise RuntimeError(f"the driver did not start within {DEADLINE:g} s")
    links = Links(0, sockets)
    exchange = LinkExchange(0, n, links, ack_every)
    exchange.open(Heartbeat(HeartbeatSettings(), 0, n).decider)
    links.watch(None)
    user, system = [], []
    total = 1 + ack_every * (beats + 1)  # The first beat, a warm-up round, rounds.

    def run_beats() -> None:
      for b in range(total):
        before = resource.getrusage(resource.RUSAGE_SELF)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        exchange.beat(Row(0, TOKEN, False, RUNNING, 37, 3, first=b == 0))
        after = resource.getrusage(resource.RUSAGE_SELF)
        if b > ack_every:
          user.append(after.ru_utime - before.ru_utime)
          system.append(after.ru_stime - before.ru_stime)
    # On a thread, so that a beat that never completes (the driver gone) is
    # bounded: the exchange's wait has no deadline of its own.
    beater = threading.Thread(target=run_beats, daemon=True, name="hub-beats")
    beater.start()
    beater.join(DEADLINE)
    if beater.is_alive() or len(user) != total - ack_every - 1:
      raise RuntimeError(f"client 0's {total} beats did not complete within "
                         f"{DEADLINE:g} s")
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    proc.wait(timeout=DEADLINE)

    def per_beat(values: list[float]) -> float:
      rounds = [values[i:i + ack_every] for i in range(0, len(values), ack_every)]
      return statistics.median(sum(r) / len(r) for r in rounds)
    links.goodbye()
    for sock in sockets.values():
      sock.close()
    return per_beat(user), per_beat(system)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    listener.close()


def main(argv: list[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", default="1024,4096")
  parser.add_argument("--beats", type=int, default=2,
                      help="rounds of outcomes measured (after a warm-up round)")
  parser.add_argument("--driver", nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.driver:
    driver(int(args.driver[0]), int(args.driver[1]))
    return ""
  rows = [f"| clients | outcomes without news | client 0 user ms a beat | "
          f"client 0 system ms a beat | client 0 % of a core at {PERIOD:g} s |",
          "|---:|---|---:|---:|---:|"]
  for n in (int(x) for x in args.clients.split(",")):
    _raise_open_files(2 * n + 64)
    for name, ack in (("every beat", 1), (f"every {ACK_EVERY} beats (default)", ACK_EVERY)):
      user, system = hub_round(n, ack, args.beats)
      rows.append(f"| {n} | {name} | {user * 1e3:.1f} | {system * 1e3:.1f} | "
                  f"{100 * (user + system) / PERIOD:.2f} |")
      print(rows[-1], flush=True)
  text = "\n".join(rows)
  print(text)
  return text


if __name__ == "__main__":
  main()
