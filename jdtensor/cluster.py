"""DTENSOR_JOBS / DTENSOR_CLIENT_ID from a TPU pod, SLURM, Kubernetes or Open MPI.

PURE: standard library only; it reads the environment it is given.

On a Cloud TPU pod slice, under ``srun`` or under ``mpirun``, the DTENSOR_*
variables are usually not set, but the environment says who is who. Detection
is opt-in (DTensor semantics: no DTENSOR_JOBS means one client): pass
``cluster_detection=`` to `jdtensor.initialize_accelerator_system`, set
``JDTENSOR_CLUSTER_DETECTION``, or print the variables with
``jdtensor env --detect auto``.

Rules:

* DTENSOR_* that the user set always win; a detected cluster only fills them
  in. When both exist and disagree (client count or client id), it is a
  `ConfigError` naming both.
* The coordinator port follows JAX's choice for each environment (so a
  firewall opened for JAX fits): ``JAX_COORDINATOR_PORT`` if set, else 8482
  on TPU pods, ``61440 + SLURM_JOB_ID % 4096`` under SLURM, and a port derived
  from the Open MPI job id under mpirun.

Sources:

* ``tpu``: ``TPU_WORKER_HOSTNAMES`` (one host per worker, in worker order) and
  ``TPU_WORKER_ID``, as on Cloud TPU VMs and GKE. Multi-slice (``MEGASCALE_
  NUM_SLICES``, ``MEGASCALE_SLICE_ID``, ``MEGASCALE_COORDINATOR_ADDRESS``):
  clients are numbered slice by slice (JAX's process ids), so a
  distributed mesh's outer axis of size ``MEGASCALE_NUM_SLICES`` holds one
  slice per index; a worker knows only its own slice's hosts, so the entries
  are the coordinator, then placeholders (``slice1-worker0.megascale.invalid``),
  the same on every client.
* ``slurm``: ``SLURM_JOB_ID``, ``SLURM_STEP_NODELIST`` (or
  ``SLURM_JOB_NODELIST``), ``SLURM_NTASKS``, ``SLURM_PROCID`` and
  ``SLURM_STEP_TASKS_PER_NODE`` (or ``SLURM_TASKS_PER_NODE``); tasks are
  assumed numbered node by node (SLURM's default block distribution). Client
  k's entry is ``<its node>:<port + its local index>``.
* ``k8s``: a Kubernetes indexed Job or JobSet with a headless service, one
  client per pod. ``JOB_COMPLETION_INDEX`` (set by Kubernetes) and
  ``JDTENSOR_K8S_PODS_PER_JOB`` (the Job's completions, set by the manifest).
  JobSet (``JOBSET_NAME``, ``REPLICATED_JOB_NAME``, ``JOB_INDEX`` from the
  pod's labels, ``JDTENSOR_K8S_NUM_JOBS`` = the replicas): pod p of job j is
  client ``j * pods_per_job + p`` at ``<jobset>-<replicated job>-<j>-<p>.
  <subdomain>``, the subdomain ``JDTENSOR_K8S_SUBDOMAIN`` or the JobSet's
  name. Indexed Job: pod p is client p at ``<job>-<p>.<JDTENSOR_K8S_
  SUBDOMAIN>``, the job name ``JDTENSOR_K8S_JOB_NAME`` or the pod's
  ``HOSTNAME`` without its ``-<index>``. Port: ``JAX_COORDINATOR_PORT``, else
  55527 (JAX's). See ``examples/k8s/``.
* ``ompi``: ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_RANK`` and the
  launcher address in ``OMPI_MCA_orte_hnp_uri``. Open MPI does not tell a rank
  where the others run, so only the first entry (the coordinator, on the
  mpirun host) is a real address; the others are placeholders on the same host
  (jdtensor only ever connects to the first).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from jdtensor import _env
from jdtensor.errors import ConfigError

__all__ = [
    "JDTENSOR_CLUSTER_DETECTION",
    "METHODS",
    "DetectedCluster",
    "detect",
    "resolve",
    "expand_hostlist",
]

JDTENSOR_CLUSTER_DETECTION = _env.JDTENSOR_CLUSTER_DETECTION
METHODS = ("none", "auto", "tpu", "slurm", "k8s", "ompi")
_TPU_PORT = 8482  # JAX's Cloud TPU coordinator port.
_K8S_PORT = 55527  # JAX's Kubernetes coordinator port.


@dataclass(frozen=True)
class DetectedCluster:
  """A cluster found in the environment.

  Attributes:
    method: ``tpu``, ``slurm``, ``k8s`` or ``ompi``.
    jobs: One ``host:port`` per client; the first is the coordinator.
    client_id: This process's client id.
    num_slices: TPU slices (multi-slice Cloud TPU); clients are numbered
      slice by slice, ``len(jobs) // num_slices`` per slice.
  """
  method: str
  jobs: tuple[str, ...]
  client_id: int
  num_slices: int = 1


def _int(environ: Mapping[str, str], name: str) -> int:
  if name not in environ:
    raise ConfigError(f"{name} is not set, but the other variables of this "
                      "cluster are; it is set by the cluster's launcher (or set "
                      "DTENSOR_JOBS and DTENSOR_CLIENT_ID yourself).")
  return _env.parse_int(name, environ[name],
                        hint="it is set by the cluster's launcher.")


def _port(environ: Mapping[str, str], default: int) -> int:
  raw = environ.get("JAX_COORDINATOR_PORT")
  if raw is None:
    return default
  port = _env.parse_int("JAX_COORDINATOR_PORT", raw,
                        hint="give the coordinator's TCP port.")
  if not 1 <= port <= 65535:
    raise ConfigError(f"JAX_COORDINATOR_PORT={raw!r} is not a port in 1..65535.")
  return port


# The most nodes (or clients) a detected cluster may have: a bound checked
# before anything is expanded, so a typo cannot hang or exhaust memory.
MAX_NODES = 100_000


def _too_many(what: str, raw: str, count: int) -> ConfigError:
  shown = raw if len(raw) <= 60 else raw[:40] + "..." + raw[-10:]
  return ConfigError(f"{what} {shown!r} names {count:,} nodes or more; jdtensor "
                     f"supports at most {MAX_NODES:,}. Check the value.")


_BRACKETS = re.compile(r"(\[[^\[\]]*\])")


def _split_items(nodelist: str) -> list[str]:
  """Top-level comma-separated items (commas inside brackets stay)."""
  items, depth, start = [], 0, 0
  for i, ch in enumerate(nodelist):
    if ch == "[":
      depth += 1
      if depth > 1:
        raise ConfigError(f"SLURM node list {nodelist!r} nests brackets at "
                          f"position {i}.")
    elif ch == "]":
      depth -= 1
      if depth < 0:
        raise ConfigError(f"SLURM node list {nodelist!r} has an unmatched ']' "
                          f"at position {i}.")
    elif ch == "," and depth == 0:
      items.append(nodelist[start:i])
      start = i + 1
  if depth:
    raise ConfigError(f"SLURM node list {nodelist!r} has an unclosed '['.")
  return items + [nodelist[start:]]


def _expand_bracket(group: str, nodelist: str) -> list[str]:
  """``[01-03,7]`` -> 01 02 03 7 (each range keeps its first number's width)."""
  out: list[str] = []
  for part in group[1:-1].split(","):
    lo, _, hi = part.partition("-")
    if not re.fullmatch(r"[0-9]{1,9}", lo, re.ASCII) or (
        hi and not re.fullmatch(r"[0-9]{1,9}", hi, re.ASCII)):
      raise ConfigError(f"SLURM node list {nodelist!r} has a bad range {part!r}.")
    first, last = int(lo), int(hi or lo)
    if last < first:
      raise ConfigError(f"SLURM node list {nodelist!r} has a range {part!r} "
                        "that runs backwards.")
    if len(out) + last - first + 1 > MAX_NODES:
      raise _too_many("SLURM node list", nodelist, len(out) + last - first + 1)
    out += [f"{i:0{len(lo)}d}" for i in range(first, last + 1)]
  return out


def expand_hostlist(nodelist: str) -> list[str]:
  """SLURM's compressed host list, as ``scontrol show hostnames`` expands it.

  Items are comma-separated; each is text with any number of bracket groups
  of numbers and ranges, expanded left group outermost:
  ``n[01-03,7],gpu5`` -> n01 n02 n03 n7 gpu5, and ``rack[1-2]-n[01-02]`` ->
  rack1-n01 rack1-n02 rack2-n01 rack2-n02.

  Raises:
    ConfigError: For a malformed list (empty item, unbalanced or nested
      brackets, a bad range), or one of more than `MAX_NODES` nodes.
  """
  hosts: list[str] = []
  for item in _split_items(nodelist):
    if not item.strip():
      raise ConfigError(f"SLURM node list {nodelist!r} has an empty entry.")
    choices = [_expand_bracket(part, nodelist) if part.startswith("[") else [part]
               for part in _BRACKETS.split(item.strip()) if part]
    count = 1
    for options in choices:
      count *= len(options)
      if len(hosts) + count > MAX_NODES:
        raise _too_many("SLURM node list", nodelist, len(hosts) + count)
    hosts += ["".join(combo) for combo in itertools.product(*choices)]
  return hosts


def _tasks_per_node(spec: str, nodes: int) -> list[int]:
  """SLURM's ``2(x3),1`` -> [2, 2, 2, 1]."""
  counts: list[int] = []
  for part in spec.split(","):
    m = re.fullmatch(r"([0-9]{1,9})(?:\(x([0-9]+)\))?", part.strip(), re.ASCII)
    if not m:
      raise ConfigError(f"SLURM tasks per node {spec!r} is malformed at {part!r}.")
    repeat = int(m.group(2)[:10] or 1) if m.group(2) else 1  # Bounded digits.
    if len(counts) + repeat > MAX_NODES:
      raise _too_many("SLURM tasks per node", spec, len(counts) + repeat)
    counts += [int(m.group(1))] * repeat
  if len(counts) != nodes:
    raise ConfigError(f"SLURM tasks per node {spec!r} lists {len(counts)} nodes, "
                      f"but the node list has {nodes}.")
  return counts


def _detect_tpu(environ: Mapping[str, str]) -> DetectedCluster | None:
  if "TPU_WORKER_HOSTNAMES" not in environ or "TPU_WORKER_ID" not in environ:
    return None
  hosts = [h.strip() for h in environ["TPU_WORKER_HOSTNAMES"].split(",")]
  if not all(hosts):
    raise ConfigError(f"TPU_WORKER_HOSTNAMES={environ['TPU_WORKER_HOSTNAMES']!r} "
                      "has an empty entry.")
  port = _port(environ, _TPU_PORT)
  worker = _int(environ, "TPU_WORKER_ID")
  if environ.get("MEGASCALE_NUM_SLICES", "1").strip() in ("", "1"):
    return DetectedCluster("tpu", tuple(f"{h}:{port}" for h in hosts), worker)
  slices = _int(environ, "MEGASCALE_NUM_SLICES")
  slice_id = _int(environ, "MEGASCALE_SLICE_ID")
  if not 1 <= slices <= MAX_NODES or not 0 <= slice_id < slices:
    raise ConfigError(f"MEGASCALE_SLICE_ID={slice_id} must be in [0, "
                      f"MEGASCALE_NUM_SLICES={slices}).")
  if len(hosts) * slices > MAX_NODES:
    raise _too_many("MEGASCALE_NUM_SLICES x TPU_WORKER_HOSTNAMES",
                    f"{slices} x {len(hosts)}", len(hosts) * slices)
  coordinator = environ.get("MEGASCALE_COORDINATOR_ADDRESS", "").strip()
  if not coordinator:
    raise ConfigError("MEGASCALE_NUM_SLICES is set but MEGASCALE_COORDINATOR_ADDRESS "
                      "is not; it names slice 0's first worker.")
  coordinator = coordinator.rsplit(":", 1)[0] if coordinator.count(":") == 1 else coordinator
  # Every client must derive the same list, and a worker knows only its own
  # slice's hosts: the coordinator, then placeholders (only the first entry
  # is ever connected to).
  per_slice = len(hosts)
  jobs = [f"{coordinator}:{port}"] + [
      f"slice{c // per_slice}-worker{c % per_slice}.megascale.invalid:{port}"
      for c in range(1, per_slice * slices)]
  return DetectedCluster("tpu", tuple(jobs), slice_id * per_slice + worker, slices)


def _detect_k8s(environ: Mapping[str, str]) -> DetectedCluster | None:
  if "JOB_COMPLETION_INDEX" not in environ or (
      _env.JDTENSOR_K8S_PODS_PER_JOB not in environ):
    return None
  pods = _int(environ, _env.JDTENSOR_K8S_PODS_PER_JOB)
  pod = _int(environ, "JOB_COMPLETION_INDEX")
  port = _port(environ, _K8S_PORT)
  jobset = environ.get("JOBSET_NAME", "").strip()
  jobs_count, job = 1, 0
  if jobset:
    if _env.JDTENSOR_K8S_NUM_JOBS in environ:
      jobs_count = _int(environ, _env.JDTENSOR_K8S_NUM_JOBS)
    if "JOB_INDEX" in environ:
      job = _int(environ, "JOB_INDEX")
  # Sizes are checked before any name is made (a huge value must not be built).
  for value, what in ((pods, _env.JDTENSOR_K8S_PODS_PER_JOB),
                      (jobs_count, _env.JDTENSOR_K8S_NUM_JOBS)):
    if not 1 <= value <= MAX_NODES:
      raise ConfigError(f"{what}={value} must be 1..{MAX_NODES:,}.")
  if pods * jobs_count > MAX_NODES:
    raise _too_many("Kubernetes pods", f"{jobs_count} x {pods}", pods * jobs_count)
  if not 0 <= pod < pods or not 0 <= job < jobs_count:
    raise ConfigError(
        f"JOB_COMPLETION_INDEX={pod} (job {job}) is outside the "
        f"{jobs_count} x {pods} pods the manifest declares "
        f"({_env.JDTENSOR_K8S_NUM_JOBS} x {_env.JDTENSOR_K8S_PODS_PER_JOB}).")
  if jobset:
    replicated = environ.get("REPLICATED_JOB_NAME", "").strip()
    if not replicated:
      raise ConfigError("JOBSET_NAME is set but REPLICATED_JOB_NAME is not; set it "
                        "from the pod label jobset.sigs.k8s.io/replicatedjob-name.")
    subdomain = environ.get(_env.JDTENSOR_K8S_SUBDOMAIN, "").strip() or jobset
    names = [f"{jobset}-{replicated}-{j}-{p}.{subdomain}"
             for j in range(jobs_count) for p in range(pods)]
  else:
    subdomain = environ.get(_env.JDTENSOR_K8S_SUBDOMAIN, "").strip()
    if not subdomain:
      raise ConfigError(
          f"JOB_COMPLETION_INDEX is set (an indexed Job) but "
          f"{_env.JDTENSOR_K8S_SUBDOMAIN} is not; set it to the headless "
          "service's name (the pods' subdomain).")
    name = environ.get(_env.JDTENSOR_K8S_JOB_NAME, "").strip()
    if not name:
      hostname = environ.get("HOSTNAME", "")
      suffix = f"-{pod}"
      if not hostname.endswith(suffix):
        raise ConfigError(
            f"cannot tell the Job's name: HOSTNAME={hostname!r} does not end in "
            f"{suffix!r}; set {_env.JDTENSOR_K8S_JOB_NAME}.")
      name = hostname[:-len(suffix)]
    names = [f"{name}-{p}.{subdomain}" for p in range(pods)]
  return DetectedCluster("k8s", tuple(f"{n}:{port}" for n in names),
                         job * pods + pod)


def _detect_slurm(environ: Mapping[str, str]) -> DetectedCluster | None:
  nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
  needed = ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID")
  if not nodelist or any(k not in environ for k in needed):
    return None
  nodes = expand_hostlist(nodelist)
  ntasks = _int(environ, "SLURM_NTASKS")
  if not 1 <= ntasks <= MAX_NODES:  # Before a job entry is made for each task.
    raise ConfigError(f"SLURM_NTASKS={ntasks} must be 1..{MAX_NODES:,}.")
  spec = (environ.get("SLURM_STEP_TASKS_PER_NODE") or
          environ.get("SLURM_TASKS_PER_NODE") or f"{ntasks // len(nodes)}(x{len(nodes)})")
  counts = _tasks_per_node(spec, len(nodes))
  if sum(counts) != ntasks:
    raise ConfigError(f"SLURM_NTASKS={ntasks} but the tasks per node {spec!r} "
                      f"add up to {sum(counts)}.")
  port = _port(environ, 61440 + _int(environ, "SLURM_JOB_ID") % 4096)
  jobs = tuple(f"{node}:{port + k}" for node, n in zip(nodes, counts)
               for k in range(n))
  return DetectedCluster("slurm", jobs, _int(environ, "SLURM_PROCID"))


def _detect_ompi(environ: Mapping[str, str]) -> DetectedCluster | None:
  uri = environ.get("OMPI_MCA_orte_hnp_uri")
  if not uri or "OMPI_COMM_WORLD_SIZE" not in environ:
    return None
  # As JAX derives it: "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911".
  match = re.search(r"tcp://(.+?)[,:]|tcp6://\[(.+?)[,\]]", uri)
  job = uri.split(".", 1)[0]
  if not match or not job.isdigit():
    raise ConfigError(f"OMPI_MCA_orte_hnp_uri={uri!r} does not name the mpirun "
                      "host; set DTENSOR_JOBS instead.")
  host = match.group(1) or f"[{match.group(2)}]"
  size = _int(environ, "OMPI_COMM_WORLD_SIZE")
  if not 1 <= size <= MAX_NODES:
    raise ConfigError(f"OMPI_COMM_WORLD_SIZE={size} must be 1..{MAX_NODES:,}.")
  port = _port(environ, (int(job) // 2**12) % 2**12 + 65535 - 2**12 + 1)
  if port + size - 1 > 65535:
    port = 65535 - size + 1
  return DetectedCluster("ompi", tuple(f"{host}:{port + r}" for r in range(size)),
                         _int(environ, "OMPI_COMM_WORLD_RANK"))


_DETECTORS = {"tpu": _detect_tpu, "slurm": _detect_slurm, "k8s": _detect_k8s,
              "ompi": _detect_ompi}


def _check_method(method: str) -> str:
  if method not in METHODS:
    raise ConfigError(f"cluster_detection={method!r} is not one of "
                      f"{', '.join(METHODS)}.")
  return method


def detect(environ: Mapping[str, str] | None = None, method: str = "auto"
           ) -> DetectedCluster | None:
  """The cluster the environment describes, or None.

  Args:
    environ: The environment (default ``os.environ``).
    method: ``auto`` tries tpu, then slurm, then k8s, then ompi; or one of
      them.

  Raises:
    ConfigError: For an unknown method or a malformed cluster variable.
  """
  env = os.environ if environ is None else environ
  if _check_method(method) == "none":
    return None
  for name in (("tpu", "slurm", "k8s", "ompi") if method == "auto" else (method,)):
    found = _DETECTORS[name](env)
    if found is not None:
      return found
  return None


def resolve(environ: Mapping[str, str] | None = None, method: str | None = None
            ) -> dict[str, str]:
  """The DTENSOR_* variables to export for this process.

  Args:
    environ: The environment (default ``os.environ``).
    method: Detection method; default ``JDTENSOR_CLUSTER_DETECTION``, else
      ``none``.

  Returns:
    ``DTENSOR_JOBS`` and ``DTENSOR_CLIENT_ID`` to set, only for variables the
    user has not set; ``{}`` when nothing is detected or nothing is missing.

  Raises:
    ConfigError: Unknown method; a named method that finds nothing; a
      detected cluster that disagrees with the DTENSOR_* the user set.
  """
  env = os.environ if environ is None else environ
  if method is None:
    method = _env.detection_method(env)
  found = detect(env, method)
  if found is None:
    if method not in ("none", "auto"):
      raise ConfigError(f"cluster_detection={method!r}: this process is not part "
                        f"of a {method} cluster (its variables are not set).")
    return {}
  user_jobs = _env.jobs(env)
  user_id = env.get(_env.DTENSOR_CLIENT_ID)
  if user_jobs:
    if len(user_jobs) != len(found.jobs) or (
        user_id is not None and _env.client_id(env) != found.client_id):
      raise ConfigError(
          f"DTENSOR_JOBS={','.join(user_jobs)!r} (client "
          f"{user_id if user_id is not None else 0}) disagrees with the {found.method} "
          f"cluster ({len(found.jobs)} clients, this is client {found.client_id}). "
          "Unset DTENSOR_JOBS/DTENSOR_CLIENT_ID to use the cluster's, or turn "
          "cluster detection off.")
    return {}
  if user_id is not None and _env.parse_int(_env.DTENSOR_CLIENT_ID, user_id) != (
      found.client_id):
    raise ConfigError(
        f"DTENSOR_CLIENT_ID={user_id!r} disagrees with the {found.method} "
        f"cluster, where this process is client {found.client_id}.")
  out = {_env.DTENSOR_JOBS: ",".join(found.jobs)}
  if user_id is None:
    out[_env.DTENSOR_CLIENT_ID] = str(found.client_id)
  # Validate what we would export, as the runtime will read it.
  _env.read_cluster_env({**env, **out})
  return out
