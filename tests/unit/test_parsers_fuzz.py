"""Every parser of user input fails only with ValueError (or TypeError).

A KeyError, IndexError, UnicodeError or OverflowError out of a parser is a
bug: the user sees a stack trace instead of a message that names the input.
These tests throw arbitrary text, bytes and mutated valid inputs at every
parser jdtensor has: mesh, layout and device strings, the wire-format protos,
DTENSOR_JOBS, bind addresses, SLURM host lists, the cluster detectors and the
environment readers.
"""

import json
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jdtensor import Layout, Mesh, _env, cluster
from jdtensor.device_spec import DeviceSpec
from jdtensor.errors import ConfigError

_FIXTURES = json.loads(
    (pathlib.Path(__file__).parent / "fixtures" / "tf221_protos.json").read_text())
_VALID_PROTOS = {name: bytes.fromhex(hex_bytes)
                 for name, (_, hex_bytes) in _FIXTURES.items()}
_FAST = settings(max_examples=300, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])

# Text close enough to the real formats that hypothesis reaches deep branches.
_NEAR_TEXT = st.text(
    alphabet="|,=:/*[]-() \t0123456789abcxyzCPUTGjobtaskdevicereplica_.é\x00",
    max_size=80)
_ANY_TEXT = st.one_of(_NEAR_TEXT, st.text(max_size=60))


def _only_value_errors(parse, value) -> None:
  try:
    parse(value)
  except (ValueError, TypeError):
    pass


@st.composite
def _mutated(draw, valid: bytes) -> bytes:
  """A valid proto with a few bytes replaced, inserted, or cut short."""
  data = bytearray(valid)
  for _ in range(draw(st.integers(1, 4))):
    kind = draw(st.sampled_from(["replace", "insert", "truncate"]))
    pos = draw(st.integers(0, max(len(data) - 1, 0)))
    byte = draw(st.integers(0, 255))
    if kind == "replace" and data:
      data[pos] = byte
    elif kind == "insert":
      data.insert(pos, byte)
    else:
      del data[pos:]
  return bytes(data)


_MESH_BYTES = st.one_of(
    st.binary(max_size=64),
    *(_mutated(v) for k, v in _VALID_PROTOS.items() if k.startswith("mesh:")))
_LAYOUT_BYTES = st.one_of(
    st.binary(max_size=64),
    *(_mutated(v) for k, v in _VALID_PROTOS.items() if k.startswith("layout:")))


@_FAST
@given(_ANY_TEXT)
def test_device_spec_from_string(text):
  _only_value_errors(DeviceSpec.from_string, text)


@_FAST
@given(_ANY_TEXT)
def test_mesh_and_layout_from_string_any_text(text):
  _only_value_errors(Mesh.from_string, text)
  _only_value_errors(Layout.from_string, text)


@_FAST
@given(_MESH_BYTES)
def test_mesh_from_proto_bytes(data):
  _only_value_errors(Mesh.from_proto, data)


@_FAST
@given(_LAYOUT_BYTES)
def test_layout_from_proto_bytes(data):
  _only_value_errors(Layout.from_proto, data)


@pytest.mark.parametrize("name", sorted(_VALID_PROTOS))
def test_unmutated_fixtures_parse(name):
  """The fuzzers start from inputs that really parse."""
  parse = Mesh.from_proto if name.startswith("mesh:") else Layout.from_proto
  assert parse(_VALID_PROTOS[name]).as_proto().SerializeToString() == (
      _VALID_PROTOS[name])


@_FAST
@given(_ANY_TEXT)
def test_parse_jobs(text):
  try:
    jobs = _env.parse_jobs(text)
  except ConfigError as e:
    assert "DTENSOR_JOBS" in str(e)
  else:
    assert all(jobs)


@_FAST
@given(st.one_of(_ANY_TEXT, st.integers(), st.none(), st.floats()))
def test_parse_bind_address(value):
  try:
    _env.parse_bind_address("bind_address", value)
  except (ConfigError, TypeError) as e:
    assert "bind_address" in str(e)


@_FAST
@given(st.one_of(_ANY_TEXT, st.integers(), st.floats(), st.none()))
def test_parse_timeout(value):
  try:
    assert _env.parse_timeout("init_timeout", value) > 0
  except (ConfigError, TypeError) as e:
    assert "init_timeout" in str(e)


@_FAST
@given(st.one_of(_NEAR_TEXT, st.from_regex(r"[a-z]{1,3}(\[[0-9,\-]{0,12}\])?[a-z0-9]{0,2}",
                                           fullmatch=True)))
def test_expand_hostlist(text):
  try:
    hosts = cluster.expand_hostlist(text)
  except ConfigError as e:
    assert repr(text) in str(e) or "SLURM" in str(e)
  else:
    assert hosts and all(isinstance(h, str) for h in hosts)


_CLUSTER_VARS = ("TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID", "SLURM_JOB_ID",
                 "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NTASKS",
                 "SLURM_PROCID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                 "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_MCA_orte_hnp_uri", "JDTENSOR_COORDINATOR_PORT",
                 "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID",
                 "MEGASCALE_COORDINATOR_ADDRESS", "JOB_COMPLETION_INDEX",
                 "JDTENSOR_K8S_PODS_PER_JOB", "JDTENSOR_K8S_NUM_JOBS",
                 "JDTENSOR_K8S_SUBDOMAIN", "JDTENSOR_K8S_JOB_NAME", "JOBSET_NAME",
                 "REPLICATED_JOB_NAME", "JOB_INDEX", "HOSTNAME")
_NUMBERISH = st.one_of(st.from_regex(r"-?[0-9]{1,12}", fullmatch=True), _NEAR_TEXT)


@_FAST
@given(st.dictionaries(st.sampled_from(_CLUSTER_VARS), _NUMBERISH, max_size=8),
       st.sampled_from(["auto", "tpu", "slurm", "k8s", "ompi", "none"]))
def test_cluster_detection(environ, method):
  try:
    cluster.resolve(environ, method)
  except ConfigError:
    pass


_DTENSOR_VARS = ("DTENSOR_JOBS", "DTENSOR_CLIENT_ID", "DTENSOR_NUM_CLIENTS",
                 "DTENSOR_JOB_NAME", "JDTENSOR_COORDINATOR_BIND_ADDRESS",
                 "JDTENSOR_INIT_TIMEOUT", "JDTENSOR_HEARTBEAT_TIMEOUT", "JDTENSOR_COORDINATION_TIMEOUT",
                 "JDTENSOR_SHUTDOWN_TIMEOUT", "DTENSOR_ENABLE_HEARTBEAT",
                 "JDTENSOR_HEARTBEAT_PERIOD", "JDTENSOR_HEARTBEAT_POLICY",
                 "JDTENSOR_STUCK_TIMEOUT", "JDTENSOR_STALL_TIMEOUT",
                 "JDTENSOR_STALL_KILL_ALL_WAITING", "JDTENSOR_RUN_SECRET")


@_FAST
@given(st.dictionaries(st.sampled_from(_DTENSOR_VARS), _NUMBERISH, max_size=6))
def test_environment_readers(environ):
  for read in (_env.read_cluster_env, _env.read_timeouts,
               _env.read_heartbeat_settings, _env.read_run_secret):
    try:
      read(environ)
    except ConfigError as e:
      assert any(name in str(e) for name in environ), str(e)
