"""Cluster detection for the orchestrators people run: Kubernetes (the example
manifests' own environment), SLURM's node-list grammar, multi-slice Cloud
TPU; and the same answers as JAX's own cluster detection for each source
(``DTENSOR_*`` the user set still win: tests/unit/test_cluster.py)."""

import itertools
import pathlib
import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from jdtensor import _env, cluster
from jdtensor.errors import ConfigError

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "k8s"


# -- Kubernetes: the manifests in examples/k8s ------------------------------------

def _container_env(container, labels):
  """The container's variables as Kubernetes gives them (downward-API
  labels resolved, secrets replaced by a stand-in)."""
  env = {}
  for item in container["env"]:
    if "value" in item:
      env[item["name"]] = item["value"]
    elif "fieldRef" in item["valueFrom"]:
      path = item["valueFrom"]["fieldRef"]["fieldPath"]
      key = path.split("['", 1)[1].rstrip("']")
      env[item["name"]] = labels[key]
    else:
      env[item["name"]] = "a secret from the cluster " + "s" * 16
  return env


def _pods(path):
  """(hostname.subdomain, env) of every pod the manifest makes, as Kubernetes
  and JobSet name and label them."""
  docs = list(yaml.safe_load_all(path.read_text()))
  pods = []
  for doc in docs:
    if doc["kind"] == "Job":
      spec = doc["spec"]
      template = spec["template"]["spec"]
      for p in range(spec["completions"]):
        hostname = f"{doc['metadata']['name']}-{p}"
        env = _container_env(template["containers"][0], {})
        env.update(JOB_COMPLETION_INDEX=str(p), HOSTNAME=hostname)
        pods.append((f"{hostname}.{template['subdomain']}", env))
    elif doc["kind"] == "JobSet":
      name = doc["metadata"]["name"]
      subdomain = doc["spec"]["network"].get("subdomain", name)
      for rjob in doc["spec"]["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        container = job_spec["template"]["spec"]["containers"][0]
        for j in range(rjob["replicas"]):
          for p in range(job_spec["completions"]):
            labels = {"jobset.sigs.k8s.io/jobset-name": name,
                      "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                      "jobset.sigs.k8s.io/job-index": str(j)}
            hostname = f"{name}-{rjob['name']}-{j}-{p}"
            env = _container_env(container, labels)
            env.update(JOB_COMPLETION_INDEX=str(p), HOSTNAME=hostname)
            pods.append((f"{hostname}.{subdomain}", env))
  return pods


@pytest.mark.parametrize("manifest", ["indexed-job.yaml", "jobset.yaml"])
def test_the_example_manifests_give_every_pod_its_dtensor_variables(manifest):
  pods = _pods(EXAMPLES / manifest)
  assert len(pods) == 4
  exports = [cluster.resolve(env) for _, env in pods]
  # Every pod derives the same DTENSOR_JOBS: the pods' DNS names, in client
  # order, on JAX's Kubernetes port.
  jobs = {e[_env.DTENSOR_JOBS] for e in exports}
  assert jobs == {",".join(f"{name}:55527" for name, _ in pods)}
  assert [int(e[_env.DTENSOR_CLIENT_ID]) for e in exports] == [0, 1, 2, 3]
  for (_, env), e in zip(pods, exports):
    assert _env.read_cluster_env({**env, **e}).num_clients == 4


def test_kubernetes_mistakes_are_named():
  base = {"JOB_COMPLETION_INDEX": "1", "JDTENSOR_K8S_PODS_PER_JOB": "2"}
  with pytest.raises(ConfigError, match=r"JDTENSOR_K8S_SUBDOMAIN is not; set it to "
                     "the headless service's name"):
    cluster.detect(base, "k8s")
  with pytest.raises(ConfigError, match=r"HOSTNAME='x' does not end in '-1'; set "
                     "JDTENSOR_K8S_JOB_NAME"):
    cluster.detect({**base, "JDTENSOR_K8S_SUBDOMAIN": "svc", "HOSTNAME": "x"}, "k8s")
  with pytest.raises(ConfigError, match=r"JOB_COMPLETION_INDEX=5 \(job 0\) is "
                     "outside the 1 x 2 pods"):
    cluster.detect({**base, "JOB_COMPLETION_INDEX": "5",
                    "JDTENSOR_K8S_SUBDOMAIN": "svc", "HOSTNAME": "t-5"}, "k8s")
  found = cluster.detect({**base, "JDTENSOR_K8S_SUBDOMAIN": "svc",
                          "HOSTNAME": "train-1"}, "auto")
  assert found.method == "k8s" and found.jobs == ("train-0.svc:55527",
                                                  "train-1.svc:55527")


@pytest.mark.parametrize("env,message", [
    ({"JOB_COMPLETION_INDEX": "0", "JDTENSOR_K8S_PODS_PER_JOB": "999999999",
      "JDTENSOR_K8S_SUBDOMAIN": "svc", "HOSTNAME": "t-0"},
     "JDTENSOR_K8S_PODS_PER_JOB=999999999 must be 1..100,000."),
    ({"JOB_COMPLETION_INDEX": "0", "JDTENSOR_K8S_PODS_PER_JOB": "1000",
      "JDTENSOR_K8S_NUM_JOBS": "1000", "JOBSET_NAME": "j", "REPLICATED_JOB_NAME": "w"},
     "Kubernetes pods '1000 x 1000' names 1,000,000 nodes or more"),
    ({"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "a", "SLURM_NTASKS": "999999999",
      "SLURM_PROCID": "0"}, "SLURM_NTASKS=999999999 must be 1..100,000."),
])
def test_huge_sizes_are_refused_before_anything_is_built(env, message):
  """Each used to build a list of a billion job names (24 GB, OOM-killed)."""
  import resource  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match=re.escape(message)):
    cluster.detect(env, "auto")
  assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * 2**20  # < 4 GiB


# -- SLURM's node lists ------------------------------------------------------------

_TEXT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1,
                max_size=5)


@st.composite
def _bracket(draw):
  """(its text, its expansion): ``[01-03,7]`` -> 01 02 03 7."""
  parts, values = [], []
  for _ in range(draw(st.integers(1, 3))):
    width = draw(st.integers(1, 3))
    lo = draw(st.integers(0, 10 ** width - 1))
    hi = draw(st.integers(lo, min(lo + 3, 10 ** 9)))
    text_lo = f"{lo:0{width}d}"
    if hi == lo and draw(st.booleans()):
      parts.append(text_lo)
      values.append(text_lo)
    else:
      parts.append(f"{text_lo}-{hi}")
      values += [f"{i:0{len(text_lo)}d}" for i in range(lo, hi + 1)]
  return "[" + ",".join(parts) + "]", values


@st.composite
def _item(draw):
  """One node-list item: text and bracket groups, e.g. rack[1-2]-n[01-02]."""
  segments = []
  for i in range(draw(st.integers(1, 4))):
    if i % 2 == 0:
      text = draw(_TEXT)
      segments.append((text, [text]))
    else:
      segments.append(draw(_bracket()))
  return "".join(s for s, _ in segments), ["".join(c) for c in itertools.product(
      *(values for _, values in segments))]


@settings(max_examples=300, deadline=None)
@given(st.lists(_item(), min_size=1, max_size=4))
def test_slurm_node_lists_expand_as_scontrol_does(items):
  text = ",".join(t for t, _ in items)
  assert cluster.expand_hostlist(text) == [h for _, hosts in items for h in hosts]


def test_slurm_node_list_examples():
  assert cluster.expand_hostlist("rack[1-2]-n[01-02]") == [
      "rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
  assert cluster.expand_hostlist("gpu[1,3-4]x,cpu[08-10],login") == [
      "gpu1x", "gpu3x", "gpu4x", "cpu08", "cpu09", "cpu10", "login"]
  for bad, message in (("n[1-2", "has an unclosed '['"), ("n1]", "unmatched ']'"),
                       ("a,,b", "has an empty entry"), ("n[2-1]", "runs backwards"),
                       ("n[[1]]", "nests brackets"), ("n[x]", "has a bad range 'x'")):
    with pytest.raises(ConfigError, match=re.escape(message)):
      cluster.expand_hostlist(bad)
  with pytest.raises(ConfigError, match="names 100,000,000 nodes or more"):
    cluster.expand_hostlist("a[0-9999]b[0-9999]")


def test_slurm_with_a_multi_bracket_node_list():
  env = {"SLURM_JOB_ID": "123", "SLURM_STEP_NODELIST": "rack[1-2]-n[01-02]",
         "SLURM_NTASKS": "8", "SLURM_PROCID": "5",
         "SLURM_STEP_TASKS_PER_NODE": "2(x4)"}
  found = cluster.detect(env, "slurm")
  port = 61440 + 123
  assert found.jobs[:3] == (f"rack1-n01:{port}", f"rack1-n01:{port + 1}",
                            f"rack1-n02:{port}")
  assert found.jobs[5] == f"rack2-n01:{port + 1}" and found.client_id == 5


# -- multi-slice Cloud TPU ----------------------------------------------------------

MULTISLICE = {"TPU_WORKER_HOSTNAMES": "t0,t1", "TPU_WORKER_ID": "1",
              "MEGASCALE_NUM_SLICES": "3", "MEGASCALE_SLICE_ID": "2",
              "MEGASCALE_COORDINATOR_ADDRESS": "slice0-host0:8080"}


def test_multislice_numbers_clients_slice_by_slice():
  found = cluster.detect(MULTISLICE, "tpu")
  assert found.client_id == 2 * 2 + 1 and found.num_slices == 3
  assert found.jobs[0] == "slice0-host0:8482"
  assert found.jobs[1:3] == ("slice0-worker1.megascale.invalid:8482",
                             "slice1-worker0.megascale.invalid:8482")
  assert len(found.jobs) == 6
  # Every slice derives the same list (the clients' handshake compares it).
  other = cluster.detect({**MULTISLICE, "TPU_WORKER_HOSTNAMES": "u0,u1",
                          "MEGASCALE_SLICE_ID": "0", "TPU_WORKER_ID": "0"}, "tpu")
  assert other.jobs == found.jobs and other.client_id == 0
  with pytest.raises(ConfigError, match=r"MEGASCALE_SLICE_ID is not set, but the "
                     "other variables of this cluster are"):  # Found by the fuzz test.
    cluster.detect({k: v for k, v in MULTISLICE.items()
                    if k != "MEGASCALE_SLICE_ID"}, "tpu")
  with pytest.raises(ConfigError, match=r"MEGASCALE_SLICE_ID=3 must be in \[0, "
                     "MEGASCALE_NUM_SLICES=3\\)"):
    cluster.detect({**MULTISLICE, "MEGASCALE_SLICE_ID": "3"}, "tpu")


# -- the same answers as JAX's own detection -------------------------------------

def _jax_view(monkeypatch, cls, env, **kwargs):
  """(coordinator, process count, process id) as JAX's cluster class says."""
  for k in list(__import__("os").environ):
    if k.startswith(("SLURM_", "OMPI_", "TPU_", "MEGASCALE_")):
      monkeypatch.delenv(k, raising=False)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  return (cls.get_coordinator_address(timeout_secs=1, override_coordinator_port=None,
                                      **kwargs),
          cls.get_process_count(), cls.get_process_id())


def _ours(env, method):
  found = cluster.detect(env, method)
  return found.jobs[0], len(found.jobs), found.client_id


@pytest.mark.parametrize("env", [
    {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[003-004],x", "SLURM_NTASKS": "3",
     "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x3)"},
    {"SLURM_JOB_ID": "4097", "SLURM_STEP_NODELIST": "gpu7", "SLURM_NTASKS": "2",
     "SLURM_PROCID": "1", "SLURM_LOCALID": "1"},
])
def test_slurm_agrees_with_jax(monkeypatch, env):
  from jax._src.clusters.slurm_cluster import SlurmCluster  # pylint: disable=g-import-not-at-top
  assert _ours(env, "slurm") == _jax_view(monkeypatch, SlurmCluster, env)


def test_slurm_multi_bracket_lists_are_where_jax_is_wrong(monkeypatch):
  """JAX takes the first host of rack[1-2]-n[01-02] to be 'rack1'; it is
  rack1-n01 (scontrol show hostnames)."""
  from jax._src.clusters.slurm_cluster import SlurmCluster  # pylint: disable=g-import-not-at-top
  env = {"SLURM_JOB_ID": "9", "SLURM_STEP_NODELIST": "rack[1-2]-n[01-02]",
         "SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
  jax_coordinator = _jax_view(monkeypatch, SlurmCluster, env)[0]
  assert jax_coordinator == f"rack1:{61440 + 9}"
  assert _ours(env, "slurm")[0] == f"rack1-n01:{61440 + 9}"


def test_open_mpi_agrees_with_jax(monkeypatch):
  from jax._src.clusters.ompi_cluster import OmpiCluster  # pylint: disable=g-import-not-at-top
  env = {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911",
         "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3",
         "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
  assert _ours(env, "ompi") == _jax_view(monkeypatch, OmpiCluster, env)


@pytest.mark.parametrize("env", [
    # MEGASCALE_* set empty/1: JAX would ask the GCE metadata server otherwise.
    {"TPU_WORKER_HOSTNAMES": "127.0.0.1,127.0.0.2", "TPU_WORKER_ID": "1",
     "MEGASCALE_NUM_SLICES": "1", "MEGASCALE_SLICE_ID": "0",
     "MEGASCALE_COORDINATOR_ADDRESS": ""},
    {"TPU_WORKER_HOSTNAMES": "127.0.0.3,127.0.0.4", "TPU_WORKER_ID": "1",
     "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1",
     "MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.1:8080"},
], ids=["one-slice", "two-slices"])
def test_cloud_tpu_agrees_with_jax(monkeypatch, env):
  from jax._src.clusters.cloud_tpu_cluster import GkeTpuCluster  # pylint: disable=g-import-not-at-top
  assert _ours(env, "tpu") == _jax_view(monkeypatch, GkeTpuCluster, env)
