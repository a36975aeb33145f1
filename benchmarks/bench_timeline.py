"""Two clients' start-up by the wall clock: where jdtensor's critical path is
longer than raw JAX's.

    python -m benchmarks.bench_timeline [--repeats N] [--clients 2] [--heartbeat-off]

Each round starts the clients of each contender by hand, as
`bench_startup_cpu.py` does (`_phases_client.py`, every module's bytecode
from one cache), and reads each client's wall clock at each phase's end and
at each start-up step's first call (``WALL`` lines). Per round: the time from
the last client's end of imports to the last client's first psum (the part of
the start-up that jdtensor changes), and the steps on that path. Raw JAX's
rounds split in two: a client that connects before the coordinator's gRPC
service listens backs off for about a second, one that does not escapes it;
they are reported apart. jdtensor's rounds split by which client reached the
rendezvous last (client 0 then starts its server while the other waits).
With ``--heartbeat-off``, each round also runs jdtensor with
``DTENSOR_ENABLE_HEARTBEAT=false`` (one group): what the heartbeat's start
and its threads put on the path.
"""

from __future__ import annotations

import argparse
import statistics


from benchmarks.bench_startup_cpu import _CACHED, communicate_all, start_clients

# A raw JAX round whose initialisation took longer than this hit the back-off.
BACKOFF_SECONDS = 0.3


HEARTBEAT_OFF = {"DTENSOR_ENABLE_HEARTBEAT": "false"}


def one_run(mode: str, clients: int, timeout: float = 300.0,
            extra: dict[str, str] | None = None) -> list[dict[str, tuple[float, float]]]:
  """Each client's ``WALL`` events: name -> (start, end), seconds."""
  procs = start_clients(mode, clients, 1, {**_CACHED, **(extra or {})})
  outs = communicate_all(procs, timeout)
  events = []
  for c, (proc, out) in enumerate(zip(procs, outs)):
    if proc.returncode != 0:
      raise RuntimeError(f"{mode}: client {c} ended with {proc.returncode}: {out[-500:]}")
    wall = {}
    for line in out.splitlines():
      if line.startswith("WALL "):
        name, _, times = line[len("WALL "):].rpartition(": ")
        start, end = (float(v) for v in times.split())
        wall[name] = (start, end)
    events.append(wall)
  return events


def critical_path(events: list[dict[str, tuple[float, float]]]) -> dict[str, float]:
  """Milliseconds from the last client's end of imports: to the last first
  psum (``to first psum``), and each step of the client that imported last."""
  last = max(range(len(events)), key=lambda c: events[c]["phase imports"][0])
  t0 = events[last]["phase imports"][0]
  row = {"to first psum": 1e3 * (max(e["phase first"][0] for e in events) - t0)}
  mine = events[last]
  for name, (start, end) in mine.items():
    if not name.startswith("phase "):
      row[name] = 1e3 * (end - start)
  if "checks" in mine:  # jdtensor: its modules load on the first call.
    row["init path's imports"] = 1e3 * (mine["checks"][0] - t0)
  # Raw JAX's backend starts in this phase; jdtensor's in its init.
  row["after init"] = 1e3 * (mine["phase first"][0] - mine["phase init"][0])
  row["client 0 last"] = float(last == 0)
  return row


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=12)
  parser.add_argument("--clients", type=int, default=2)
  parser.add_argument("--heartbeat-off", action="store_true",
                      help="also run jdtensor with its heartbeat off, each round")
  args = parser.parse_args(argv)
  contenders = [("raw", None), ("jdtensor", None)]
  if args.heartbeat_off:
    contenders.append(("jdtensor", HEARTBEAT_OFF))
  for mode in ("raw", "jdtensor"):  # Fills the bytecode cache.
    one_run(mode, args.clients)
  rows: dict[str, list[dict[str, float]]] = {}
  for _ in range(args.repeats):
    for mode, extra in contenders:
      row = critical_path(one_run(mode, args.clients, extra=extra))
      if extra:
        group = "jdtensor, heartbeat off"
      elif mode == "raw":
        group = ("raw JAX, back-off hit" if row.get("jax.distributed.initialize", 0)
                 > 1e3 * BACKOFF_SECONDS else "raw JAX, back-off escaped")
      else:
        group = ("jdtensor, client 0 last" if row["client 0 last"]
                 else "jdtensor, another client last")
      rows.setdefault(group, []).append(row)
  lines = [f"{args.clients} clients x 1 device, {args.repeats} rounds: milliseconds "
           "from the last client's end of imports to the last first psum, and the "
           "steps of the client that imported last (medians over the rounds of each "
           "group):", "", "| group | rounds | to first psum | steps |", "|---|---:|---:|---|"]
  for group in ("raw JAX, back-off escaped", "raw JAX, back-off hit",
                "jdtensor, another client last", "jdtensor, client 0 last",
                *(["jdtensor, heartbeat off"] if args.heartbeat_off else [])):
    if group not in rows:
      lines.append(f"| {group} | 0 | | |")
      continue
    got = rows[group]
    steps = sorted({k for r in got for k in r} - {"to first psum", "client 0 last"},
                   key=lambda k: statistics.median(r.get(k, 0.0) for r in got), reverse=True)
    cells = ", ".join(f"{k} {statistics.median(r.get(k, 0.0) for r in got):.1f}"
                      for k in steps)
    lines.append(f"| {group} | {len(got)} | "
                 f"{statistics.median(r['to first psum'] for r in got):.0f} | {cells} |")
  report = "\n".join(lines)
  print(report)
  return report


if __name__ == "__main__":
  main()
