"""The start-up handshake's messages, shared by client 0 (`jdtensor.runtime.host`)
and the clients that join it (`jdtensor.runtime.rendezvous`).

PURE: standard library only.
"""

from __future__ import annotations

import hashlib
import re
import socket
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from jdtensor._device_nodes import GpuIdentity
from jdtensor._ids import ids_text, to_ranges
from jdtensor._wire import encode, split_host_port
from jdtensor.runtime.links import Links

__all__ = ["Hello", "PeerHello", "Software", "software_groups", "software_mismatch",
           "software_told", "Meeting", "bind_address", "run_id",
           "jobs_digest", "PROTOCOL", "STAGE_SECONDS", "CLIENT_STAGE_SECONDS",
           "WAITING_SECONDS", "START_EVERY_CLIENT", "POLL_SECONDS", "retry_delays", "NONCE_RE", "RUN_RE",
           "send", "clients_text", "CLIENTS_SHOWN"]

# 3: the heartbeat beats on the links; ``go`` carries no private service port.
# 4: until ``go``, client 0 says whom it is still waiting for (``waiting``).
# 5: client 0 says on the links when its JAX service listens (``service``).
# 6: a GPU client's hello names its GPUs; ``go`` says how many clients share
#    its most shared GPU (``sharing``).
# 7: a hello says the address family of its collectives (``family``); a link
#    report carries its detail and subject as fields, a departure whether it
#    raised (``raised``).
# 9: a hello says what the client runs (``software``); client 0 refuses a mix.
PROTOCOL = 9
# At most this many GPUs in a hello, each named in at most MAX_GPU_TEXT
# characters (a node has a handful; a MIG-sliced one a few dozen).
MAX_GPUS = 256
MAX_GPU_TEXT = 256
# The time a peer has for each stage of the handshake on client 0 (a
# legitimate client answers at once); frames are at most MAX_FRAME bytes.
STAGE_SECONDS = 2.0
# How long a client waits for client 0's answer at each stage; while client 0
# waits for the other clients it says so every WAITING_SECONDS, so a client
# that waits longer than this for ``go`` is waiting for a client 0 that is
# gone or stopped, never for a late client (that wait has the init timeout).
CLIENT_STAGE_SECONDS = 10.0
WAITING_SECONDS = 2.0
# What a client that is waited for in vain is told to do (client 0 and the
# others say it alike).
START_EVERY_CLIENT = ("Start every client with the same DTENSOR_JOBS and its own "
                      "DTENSOR_CLIENT_ID, or raise the init timeout "
                      "(JDTENSOR_INIT_TIMEOUT).")
# How many clients a message names before "and N more": client 0 tells every
# client whom it waits for, which must not cost O(N^2) bytes at pod scale.
CLIENTS_SHOWN = 16
POLL_SECONDS = 0.05
# A client that finds client 0 not yet listening tries again soon
# (`retry_delays`): clients started together reach the rendezvous tens of
# milliseconds apart, and a fixed POLL_SECONDS sleep put up to 50 ms on every
# start-up's critical path. A failed attempt costs about 0.1 ms of CPU, so
# after FAST_RETRY_WINDOW of waiting (client 0 is seconds late, as under
# oversubscription) the attempts slow to POLL_SECONDS again.
FIRST_RETRY_SECONDS = 0.001
FAST_RETRY_SECONDS = 0.01
FAST_RETRY_WINDOW = 1.0
NONCE_RE = re.compile(r"[0-9a-f]{64}")
RUN_RE = re.compile(r"[0-9a-f]{0,32}")


def clients_text(clients: Sequence[int], more: int = 0) -> str:
  """``1, 2, 3`` or, past CLIENTS_SHOWN, ``1, 2, ... 16 and 2032 more``
  (`more`: clients not in `clients` to count as well)."""
  shown = list(clients[:CLIENTS_SHOWN])
  more += len(clients) - len(shown)
  return ", ".join(map(str, shown)) + (f" and {more} more" if more else "")


def run_id(secret: str | None) -> str:
  """The run's name, derived from its secret ('' without one)."""
  if not secret:
    return ""
  return hashlib.sha256(b"jdtensor run id|" + secret.encode()).hexdigest()[:12]


def jobs_digest(jobs: Sequence[str]) -> str:
  """What clients compare instead of sending ``DTENSOR_JOBS`` itself."""
  return hashlib.sha256(",".join(jobs).encode()).hexdigest()


# A client's `Hello.family`: '' when it does not matter or is not known.
ADDRESS_FAMILIES = ("", "IPv4", "IPv6")
# A version as a hello may carry it (PEP 440 with a local label, or "unknown").
_VERSION_RE = re.compile(r"[0-9A-Za-z.+!_-]{1,64}")


class Software(NamedTuple):
  """What a client runs that every client must run alike.

  Each client traces, lowers and compiles the program itself; their
  collectives meet only if every client built the same program. Clients on
  two JAX versions hang at their first collective (or mix up data), as do
  clients where one has 64-bit types on. What may differ between hosts
  (Python, numpy, XLA_FLAGS' per-host paths) is not compared.

  Attributes:
    jdtensor: jdtensor's version (the links' and the heartbeat's messages).
    jax: JAX's version (it traces and lowers the program).
    jaxlib: jaxlib's version (XLA compiles the program; its collectives run it).
    x64: ``jax_enable_x64`` (every traced value's type follows it).
  """
  jdtensor: str
  jax: str
  jaxlib: str
  x64: bool

  @classmethod
  def of(cls, jdtensor: str, jax: str, jaxlib: str, x64: bool) -> Software:
    """Versions as a hello may carry them (odd characters as ``_``, at most
    64 of them): a peer refuses anything else as malformed."""
    def version(text: str) -> str:
      return re.sub(r"[^0-9A-Za-z.+!_-]", "_", text)[:64] or "unknown"
    return cls(version(jdtensor), version(jax), version(jaxlib), bool(x64))

  def to_frame(self) -> dict[str, Any]:
    return {"jdtensor": self.jdtensor, "jax": self.jax, "jaxlib": self.jaxlib,
            "jax_enable_x64": self.x64}

  @classmethod
  def parse(cls, value: Any) -> Software:
    """Raises ValueError unless `value` is what `to_frame` makes."""
    if not (isinstance(value, dict) and sorted(value) == sorted(_SOFTWARE_NAMES)
            and all(isinstance(value[name], str) and _VERSION_RE.fullmatch(value[name])
                    for name in _SOFTWARE_NAMES[:3])
            and isinstance(value["jax_enable_x64"], bool)):
      raise ValueError("field 'software' is malformed")
    return cls(value["jdtensor"], value["jax"], value["jaxlib"],
               value["jax_enable_x64"])


# The fields of `Software` as messages name them, in its order.
_SOFTWARE_NAMES = ("jdtensor", "jax", "jaxlib", "jax_enable_x64")
# A refusal names at most this many groups of clients (each with what it
# runs) and this many runs of ids in a group: one short line at any scale.
GROUPS_SHOWN = 3
RUNS_SHOWN = 8
_WHY = ("so the programs they compile would not match (a collective that never "
        "returns, or wrong data)")
_X64_HOW = ("JAX_ENABLE_X64, or jax.config.update before "
            "initialize_accelerator_system")


def software_groups(by_client: Iterable[tuple[int, Software | None]]
                    ) -> dict[Software | None, list[int]]:
  """Clients by what they run (None: a hello that did not say), each
  group's ids in the order given; the groups in the order of their first
  client. O(N)."""
  groups: dict[Software | None, list[int]] = {}
  for client, software in by_client:
    groups.setdefault(software, []).append(client)
  return groups


def _clients(ids: Sequence[int]) -> str:
  """``client 1`` or ``clients 0, 2-299``, at most RUNS_SHOWN runs, then
  ``and N more``."""
  runs = to_ranges(ids)
  if len(runs) <= RUNS_SHOWN:
    text = ids_text(ids)
  else:
    more = sum(b - a + 1 for a, b in runs[RUNS_SHOWN:])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}"
                     for a, b in runs[:RUNS_SHOWN]) + f" and {more} more"
  return f"client{'s' if len(ids) > 1 else ''} {text}"


def _differing(groups: dict[Software | None, list[int]]) -> list[int]:
  """The indexes of the `Software` fields whose values differ among groups."""
  known = [s for s in groups if s is not None]
  return [i for i in range(len(_SOFTWARE_NAMES))
          if len({s[i] for s in known}) > 1 or (None in groups and known)]


def _described(software: Software | None, fields: Sequence[int]) -> str:
  if software is None:
    return "a jdtensor that does not say its versions"
  return ", ".join(f"jax_enable_x64={software.x64}" if i == 3
                   else f"{_SOFTWARE_NAMES[i]} {software[i]}" for i in fields)


def _and(names: Sequence[str]) -> str:
  return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _fixes(fields: Sequence[int], first: Software | None) -> list[str]:
  """What to do about each differing field; with `first` (client 0's), the
  versions to install."""
  versions = [i for i in fields if i < 3]
  fixes = []
  if versions:
    mine = "" if first is None else " (client 0 has " + " ".join(
        f"{_SOFTWARE_NAMES[i]}=={first[i]}" for i in versions) + ")"
    fixes.append(f"install the same {_and([_SOFTWARE_NAMES[i] for i in versions])} "
                 f"on every client{mine}")
  if 3 in fields:
    mine = "" if first is None else f"client 0 has {first.x64}: "
    fixes.append(f"set jax_enable_x64 the same on every client ({mine}{_X64_HOW})")
  return fixes


def _cap(text: str) -> str:
  return text[:1].upper() + text[1:]


def software_mismatch(groups: dict[Software | None, list[int]]) -> str:
  """'' if every client runs the same (one group of `software_groups`);
  else client 0's refusal: each group with what differs, and the fix."""
  if len(groups) < 2:
    return ""
  fields = _differing(groups)
  items = list(groups.items())
  text = "; ".join(f"{_clients(ids)}: {_described(s, fields)}"
                   for s, ids in items[:GROUPS_SHOWN])
  rest = sum(len(ids) for _, ids in items[GROUPS_SHOWN:])
  if rest:
    text += f"; {rest} more client{'s' if rest > 1 else ''} run something else"
  return (f"Clients run different software, {_WHY}: {text}. "
          f"{_cap('; '.join(_fixes(fields, items[0][0])))}.")


def software_told(groups: dict[Software | None, list[int]],
                  software: Software | None) -> str:
  """The refusal for the clients that run `software` (one of `groups`, whose
  first is client 0's) when they have not proved they know the run's secret:
  their own versions (what they sent), never client 0's or the others'.
  O(N) for client 0's group, O(1) for another."""
  fields = _differing(groups)
  first = next(iter(groups))
  fixes = _cap("; ".join(_fixes(fields, None)))
  see = "Client 0's output names what each client runs."
  if software != first:
    return (f"{_cap(_clients(groups[software]))} "
            f"run{'s' if len(groups[software]) == 1 else ''} "
            f"{_described(software, fields)}, unlike client 0, {_WHY}. "
            f"{fixes}. {see}")
  others = sorted(c for s, ids in groups.items() if s != first for c in ids)
  return (f"{_cap(_clients(others))} differ{'s' if len(others) == 1 else ''} from "
          f"client 0 in {_and([_SOFTWARE_NAMES[i] for i in fields])}, {_WHY}. "
          f"{fixes}. {see}")


class Hello(NamedTuple):
  """What each client tells client 0 (once both are authenticated).

  Attributes:
    client_id, num_clients: This client and the cluster size.
    jobs: ``DTENSOR_JOBS`` (only its digest is sent).
    local_devices: This client's device count.
    heartbeat: ``DTENSOR_ENABLE_HEARTBEAT``.
    settings: Settings every client must share, by variable name (heartbeat
      period and policy, time-outs, ``DTENSOR_JOB_NAME``).
    gpus: The GPUs a GPU client will use (none for other device types):
      client 0 refuses two clients on one GPU.
    family: ``IPv4`` or ``IPv6``: the address family of this client's
      DTENSOR_JOBS host, where its CPU collectives (gloo) listen; '' when
      gloo is not used or JAX picks the address. Client 0 refuses a mix.
    software: What this client runs (`Software`); None: not said (the
      rendezvous then says what this process runs). Client 0 refuses a mix
      once every client has met, naming each client's.
  """
  client_id: int
  num_clients: int
  jobs: tuple[str, ...]
  local_devices: int
  heartbeat: bool = True
  settings: tuple[tuple[str, object], ...] = ()
  gpus: tuple[GpuIdentity, ...] = ()
  family: str = ""
  software: Software | None = None

  def to_frame(self) -> dict[str, Any]:
    return {"jdtensor": PROTOCOL, "client_id": self.client_id,
            "num_clients": self.num_clients, "jobs": jobs_digest(self.jobs),
            "num_jobs": len(self.jobs), "local_devices": self.local_devices,
            "heartbeat": self.heartbeat, "settings": dict(self.settings),
            "gpus": [list(g) for g in self.gpus[:MAX_GPUS]], "family": self.family,
            **({} if self.software is None else {"software": self.software.to_frame()})}


class PeerHello(NamedTuple):
  """A hello as received: checked field by field, nothing trusted."""
  client_id: int
  num_clients: int
  jobs: str
  num_jobs: int
  local_devices: int
  heartbeat: bool
  settings: dict[str, object]
  gpus: tuple[GpuIdentity, ...] = ()
  family: str = ""
  software: Software | None = None

  @classmethod
  def parse(cls, frame: dict[str, Any]) -> PeerHello:
    """Raises ValueError naming the first field that is wrong."""
    def integer(name: str, low: int, high: int) -> int:
      value = frame.get(name)
      if type(value) is not int or not low <= value <= high:  # pylint: disable=unidiomatic-typecheck
        raise ValueError(f"field {name!r} is not an integer in {low}..{high}")
      return value
    if frame.get("jdtensor") != PROTOCOL:
      raise ValueError("not a jdtensor hello of this version")
    jobs = frame.get("jobs")
    if not isinstance(jobs, str) or not re.fullmatch(r"[0-9a-f]{64}", jobs):
      raise ValueError("field 'jobs' is not a digest")
    heartbeat = frame.get("heartbeat")
    settings = frame.get("settings")
    if not isinstance(heartbeat, bool):
      raise ValueError("field 'heartbeat' is not a boolean")
    if not (isinstance(settings, dict) and len(settings) <= 64 and all(
        isinstance(k, str) and len(k) <= 64 and
        isinstance(v, (str, int, float, bool)) and len(str(v)) <= 256
        for k, v in settings.items())):
      raise ValueError("field 'settings' is malformed")
    gpus = frame.get("gpus", [])
    if not (isinstance(gpus, list) and len(gpus) <= MAX_GPUS and all(
        isinstance(g, list) and len(g) == 2 and all(
            isinstance(t, str) and len(t) <= MAX_GPU_TEXT for t in g) for g in gpus)):
      raise ValueError("field 'gpus' is malformed")
    family = frame.get("family", "")
    if family not in ADDRESS_FAMILIES:
      raise ValueError("field 'family' is not IPv4, IPv6 or empty")
    software = frame.get("software")
    return cls(integer("client_id", 0, 10**9), integer("num_clients", 1, 10**9),
               jobs, integer("num_jobs", 0, 10**9),
               integer("local_devices", 0, 10**9), heartbeat, settings,
               tuple(GpuIdentity(*g) for g in gpus), family,
               None if software is None else Software.parse(software))


def bind_address(coordinator: str, host: str | None, port: int | None
                 ) -> tuple[str, int]:
  """Where client 0 binds the coordinator: `coordinator`'s host and port,
  unless `host` or `port` (parsed from ``JDTENSOR_COORDINATOR_BIND_ADDRESS``)
  say otherwise. ``localhost`` binds to loopback (127.0.0.1)."""
  default_host, default_port = split_host_port(coordinator)
  if host is None:
    host = "127.0.0.1" if default_host == "localhost" else default_host
  return host, default_port if port is None else port


class Meeting(NamedTuple):
  """What the rendezvous leaves behind.

  Attributes:
    links: The connections, kept open as liveness links (see `Links`); the
      heartbeat beats on them.
    gpu_sharers: How many clients use this client's most shared GPU (more
      than 1 only with ``JDTENSOR_SHARE_GPUS``).
  """
  links: Links
  gpu_sharers: int = 1


def retry_delays() -> Iterator[float]:
  """Seconds to sleep before each next attempt to reach client 0.

  Doubling from FIRST_RETRY_SECONDS to FAST_RETRY_SECONDS, which holds
  through the first FAST_RETRY_WINDOW seconds of waiting (at most a
  hundred attempts, about 10 ms of CPU); doubling then to POLL_SECONDS.
  """
  delay, waited = FIRST_RETRY_SECONDS, 0.0
  while True:
    yield delay
    waited += delay
    cap = FAST_RETRY_SECONDS if waited < FAST_RETRY_WINDOW else POLL_SECONDS
    delay = min(2 * delay, cap)


def send(sock: socket.socket, frame: dict[str, Any]) -> bool:
  """Sends one frame; False if the peer is gone."""
  try:
    sock.setblocking(True)
    sock.settimeout(STAGE_SECONDS)
    sock.sendall(encode(frame))
    return True
  except OSError:
    return False
  finally:
    try:
      sock.setblocking(False)
    except OSError:
      pass
