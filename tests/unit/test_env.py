"""DTENSOR_* parsing: DTensor's semantics and exact messages, minus its quirks."""

import pytest

from jdtensor import _env
from jdtensor.errors import ConfigError


@pytest.mark.parametrize("raw,expected", [
    ("1", True), ("true", True), ("TRUE", True), ("Yes", True), (" yes ", True),
    ("0", False), ("false", False), ("False", False), ("NO", False),
])
def test_parse_bool_accepts(raw, expected):
  assert _env.parse_bool("DTENSOR_ENABLE_HEARTBEAT", raw) is expected


@pytest.mark.parametrize("raw", ["", "2", "on", "off", "ture", "y", "1.0"])
def test_parse_bool_rejects_with_name_and_value(raw):
  with pytest.raises(ConfigError) as e:
    _env.parse_bool("DTENSOR_ENABLE_HEARTBEAT", raw)
  assert str(e.value) == (
      f"DTENSOR_ENABLE_HEARTBEAT={raw!r} is not a boolean; use one of "
      "true/false, 1/0 or yes/no (any case), or unset it for the default.")


def test_read_bool_defaults_and_fixes_tf_quirks():
  assert _env.read_bool("DTENSOR_ENABLE_HEARTBEAT", True, {}) is True
  # TF: "yes" -> False; jdtensor: True.
  assert _env.read_bool("DTENSOR_ENABLE_HEARTBEAT", True,
                        {"DTENSOR_ENABLE_HEARTBEAT": "yes"}) is True
  # TF: "false" -> True for the != "0" variables; jdtensor: False.
  assert _env.read_bool("DTENSOR_GPU_USE_NCCL_COMMUNICATION", False,
                        {"DTENSOR_GPU_USE_NCCL_COMMUNICATION": "false"}) is False


@pytest.mark.parametrize("raw,expected", [
    (None, []),
    ("", []),
    ("   ", []),
    ("localhost:1000", ["localhost:1000"]),
    ("localhost:1000,localhost:1001", ["localhost:1000", "localhost:1001"]),
    (" a:1 , b:2 ", ["a:1", "b:2"]),
    ("10.0.0.1:80,[::1]:81", ["10.0.0.1:80", "[::1]:81"]),
    ("h:65535", ["h:65535"]),
])
def test_parse_jobs_valid(raw, expected):
  assert _env.parse_jobs(raw) == expected


def test_jobs_with_ip_port_are_not_sort_checked():
  # DTensor's test_jobs_with_ip_port: descending ports are accepted as given.
  raw = ",".join(f"localhost:{16 - i}" for i in range(16))
  assert _env.parse_jobs(raw) == raw.split(",")


def test_bns_jobs_sorted_numerically():
  # DTensor's test_sort_jobs_with_bns_names.
  names = [f"/bns/localhost/{i}" for i in range(16)]
  assert _env.parse_jobs(",".join(names)) == names
  ports = [f"/bns/localhost/{i}:8888" for i in range(16)]
  assert _env.parse_jobs(",".join(ports)) == ports


def test_bns_jobs_unsorted_gives_dtensor_message():
  raw = ",".join(f"/bns/localhost/{100 - i}" for i in range(3))
  with pytest.raises(ValueError) as e:
    _env.parse_jobs(raw)
  assert str(e.value) == (
      f"Unexpected DTENSOR_JOBS content {raw}. Sort entries in DTENSOR_JOBS "
      "because cluster construction relies on the order.")


def test_bns_mixed_keys_is_a_clear_error_not_type_error():
  with pytest.raises(ConfigError, match=r"DTENSOR_JOBS='/bns/a/1:p,host:2' mixes"):
    _env.parse_jobs("/bns/a/1:p,host:2")


@pytest.mark.parametrize("raw,problem", [
    ("a:1,,a:2", "has an empty entry at position 1"),
    ("a:1,a:2,", "has an empty entry at position 2"),
    ("localhost", "entry 'localhost' is not of the form host:port"),
    (":1000", "entry ':1000' is not of the form host:port"),
    ("host:0", "entry 'host:0' has an invalid port '0' (expected 1..65535 in ASCII digits)"),
    ("host:65536", "entry 'host:65536' has an invalid port '65536'"),
    ("host:http", "entry 'host:http' has an invalid port 'http'"),
    ("ho st:1", "entry 'ho st:1' has an invalid host 'ho st'"),
    ("a:1,a:1", "lists 'a:1' twice (clients 0 and 1)"),
    ("a:1,a:001", "lists 'a:1' twice (as 'a:1' and 'a:001') (clients 0 and 1)"),
    ("host:0065536", "entry 'host:0065536' has an invalid port '0065536'"),
    ("host:000000", "entry 'host:000000' has an invalid port '000000'"),
    ("host:+123", "entry 'host:+123' has an invalid port '+123'"),
    ("host:٠٦٠٢٩٣", "entry 'host:٠٦٠٢٩٣' has an invalid port '٠٦٠٢٩٣'"),
])
def test_parse_jobs_rejects(raw, problem):
  with pytest.raises(ConfigError) as e:
    _env.parse_jobs(raw)
  assert str(e.value).startswith(f"DTENSOR_JOBS={raw!r}")
  assert problem in str(e.value)


def test_tf_test_helpers_zero_padded_ports_are_accepted_and_normalised():
  # TF's multi_client_test_util writes f"localhost:{port:06d}" for ports
  # sorted in descending order; TF accepts them and so do we.
  ports = sorted([60293, 37339, 8080], reverse=True)
  raw = ",".join(f"localhost:{port:06d}" for port in ports)
  assert raw == "localhost:060293,localhost:037339,localhost:008080"
  # jobs() is DTensor's config.jobs(): the entries as given.
  assert _env.parse_jobs(raw) == ["localhost:060293", "localhost:037339",
                                  "localhost:008080"]
  env = _env.read_cluster_env({"DTENSOR_JOBS": raw, "DTENSOR_CLIENT_ID": "1"})
  # What JAX is given: the value, without the zeros.
  assert env.coordinator_address == "localhost:60293"
  assert [_env.normalize_address(e) for e in env.jobs] == [
      "localhost:60293", "localhost:37339", "localhost:8080"]
  assert _env.normalize_address("[::1]:000443") == "[::1]:443"
  assert _env.normalize_address("/bns/a/1:p") == "/bns/a/1:p"
  assert _env.parse_bind_address("X", ":08080") == (None, 8080)


def test_num_clients_counts_jobs():
  assert _env.num_clients({}) == 1
  assert _env.num_clients({"DTENSOR_JOBS": "a:1,a:2,a:3"}) == 3


def test_legacy_num_clients_accepted_when_consistent():
  assert _env.num_clients({"DTENSOR_JOBS": "a:1,a:2",
                           "DTENSOR_NUM_CLIENTS": "2"}) == 2
  assert _env.num_clients({"DTENSOR_NUM_CLIENTS": "1"}) == 1


def test_legacy_num_clients_disagreeing_names_both():
  with pytest.raises(ConfigError) as e:
    _env.num_clients({"DTENSOR_JOBS": "a:1,a:2", "DTENSOR_NUM_CLIENTS": "4"})
  assert str(e.value) == (
      "DTENSOR_NUM_CLIENTS='4' disagrees with DTENSOR_JOBS='a:1,a:2', which "
      "names 2 client(s). Make DTENSOR_JOBS list one host:port per client, and "
      "set DTENSOR_NUM_CLIENTS to that count or unset it.")
  with pytest.raises(ConfigError, match=r"DTENSOR_NUM_CLIENTS='4' disagrees "
                     r"with DTENSOR_JOBS=unset \(local mode\)"):
    _env.num_clients({"DTENSOR_NUM_CLIENTS": "4"})


def test_legacy_num_clients_not_an_int():
  with pytest.raises(ConfigError, match=r"^DTENSOR_NUM_CLIENTS='two' is not an "
                     "integer; set it to the number of entries in DTENSOR_JOBS"):
    _env.num_clients({"DTENSOR_NUM_CLIENTS": "two"})


def test_client_id_default_and_value():
  assert _env.client_id({}) == 0
  assert _env.client_id({"DTENSOR_JOBS": "a:1,a:2", "DTENSOR_CLIENT_ID": "1"}) == 1


@pytest.mark.parametrize("env,message", [
    ({"DTENSOR_JOBS": "a:1,a:2", "DTENSOR_CLIENT_ID": "2"},
     "Environment variable DTENSOR_CLIENT_ID must be < 2, got 2"),
    ({"DTENSOR_JOBS": "a:1,a:2", "DTENSOR_CLIENT_ID": "-1"},
     "Environment variable DTENSOR_CLIENT_ID must be >= 0, got -1. "),
    ({"DTENSOR_CLIENT_ID": "1"},
     "Environment variable DTENSOR_CLIENT_ID must be < 1, got 1"),
])
def test_client_id_range_dtensor_messages(env, message):
  with pytest.raises(ValueError) as e:
    _env.client_id(env)
  assert str(e.value) == message


@pytest.mark.parametrize("raw", ["one", "", "1.0", "0x1", "1_0", " "])
def test_client_id_not_an_integer(raw):
  with pytest.raises(ConfigError) as e:
    _env.client_id({"DTENSOR_CLIENT_ID": raw})
  assert str(e.value) == (
      f"DTENSOR_CLIENT_ID={raw!r} is not an integer; set it to this process's "
      "index in DTENSOR_JOBS (0 for the first).")


def test_job_name_defaults_and_validation():
  assert _env.job_name({}) == "localhost"
  assert _env.job_name({"DTENSOR_JOBS": "a:1,a:2"}) == "worker"
  assert _env.job_name({"DTENSOR_JOB_NAME": "trainer"}) == "trainer"
  for bad in ("", "1abc", "a/b", "a:b", "a b"):
    with pytest.raises(ConfigError, match=r"^DTENSOR_JOB_NAME=.* is not a valid "
                       "job name"):
      _env.job_name({"DTENSOR_JOB_NAME": bad})


def test_read_cluster_env_snapshot():
  env = _env.read_cluster_env({"DTENSOR_JOBS": "h:5,h:6", "DTENSOR_CLIENT_ID": "1",
                               "DTENSOR_ENABLE_HEARTBEAT": "no"})
  assert env == _env.ClusterEnv(jobs=("h:5", "h:6"), num_clients=2, client_id=1,
                                job_name="worker", heartbeat_enabled=False,
                                gpu_use_nccl_communication=False)
  assert env.coordinator_address == "h:5" and not env.is_local_mode
  assert _env.read_cluster_env({}).is_local_mode


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "inf", "nan", "", "604801"])
def test_parse_timeout_rejects(raw):
  with pytest.raises(ConfigError, match=r"^JDTENSOR_INIT_TIMEOUT="):
    _env.parse_timeout("JDTENSOR_INIT_TIMEOUT", raw)


def test_parse_timeout_accepts():
  assert _env.parse_timeout("X", " 2.5 ") == 2.5
  assert _env.parse_timeout("X", "604800") == _env.MAX_TIMEOUT


def test_read_timeouts():
  assert _env.read_timeouts({}) == _env.Timeouts(120.0, 100.0, 60.0)
  t = _env.read_timeouts({"JDTENSOR_INIT_TIMEOUT": "5", "JDTENSOR_SHUTDOWN_TIMEOUT": "7"},
                         coordination=3)
  assert t == _env.Timeouts(5.0, 3.0, 7.0)
  assert _env.read_timeouts({"JDTENSOR_INIT_TIMEOUT": "5"}, init=9).init == 9.0
  with pytest.raises(ConfigError) as e:
    _env.read_timeouts({}, init=-1)
  assert str(e.value) == ("init_timeout=-1 must be a number of seconds above 0 and "
                          "at most 604800 (a week).")
  for name in ("JDTENSOR_COORDINATION_TIMEOUT", "JDTENSOR_HEARTBEAT_TIMEOUT"):
    for raw in ("1e20", "nan", "inf", "0"):
      with pytest.raises(ConfigError) as e:
        _env.read_timeouts({name: raw})
      assert str(e.value) == (f"{name}={raw!r} must be a number of seconds above "
                              "0 and at most 604800 (a week).")


def test_the_coordination_timeout_keeps_its_deprecated_name(caplog):
  env = _env.read_timeouts({"JDTENSOR_HEARTBEAT_TIMEOUT": "7"})
  assert env.coordination == 7.0
  assert ("JDTENSOR_HEARTBEAT_TIMEOUT is deprecated: it is JAX's coordination-"
          "service time-out, not jdtensor's heartbeat; set "
          "JDTENSOR_COORDINATION_TIMEOUT instead.") in caplog.text
  both = {"JDTENSOR_HEARTBEAT_TIMEOUT": "7", "JDTENSOR_COORDINATION_TIMEOUT": "7"}
  assert _env.read_timeouts(both).coordination == 7.0
  with pytest.raises(ConfigError) as e:
    _env.read_timeouts({**both, "JDTENSOR_COORDINATION_TIMEOUT": "9"})
  assert str(e.value) == (
      "JDTENSOR_COORDINATION_TIMEOUT='9' and its deprecated name "
      "JDTENSOR_HEARTBEAT_TIMEOUT='7' disagree; unset JDTENSOR_HEARTBEAT_TIMEOUT.")


def test_bind_address():
  from jdtensor.runtime.rendezvous import bind_address
  parse = lambda raw: _env.parse_bind_address("JDTENSOR_COORDINATOR_BIND_ADDRESS", raw)
  assert bind_address("localhost:9000", None, None) == ("127.0.0.1", 9000)
  assert bind_address("10.1.2.3:9000", None, None) == ("10.1.2.3", 9000)
  assert bind_address("[::1]:9000", None, None) == ("::1", 9000)
  assert bind_address("localhost:9000", *parse("0.0.0.0")) == ("0.0.0.0", 9000)
  assert bind_address("localhost:9000", *parse("0.0.0.0:9100")) == ("0.0.0.0", 9100)
  assert bind_address("localhost:9000", *parse("[::]")) == ("::", 9000)
  assert bind_address("localhost:9000", *parse("::")) == ("::", 9000)
  assert bind_address("localhost:9000", *parse(":9100")) == ("127.0.0.1", 9100)


@pytest.mark.parametrize("raw,message", [
    ("127.0.0.1:99999", "JDTENSOR_COORDINATOR_BIND_ADDRESS='127.0.0.1:99999' has an "
     "invalid port '99999' (expected 1..65535 in ASCII digits)."),
    (":0", "JDTENSOR_COORDINATOR_BIND_ADDRESS=':0' has an invalid port '0' "
     "(expected 1..65535 in ASCII digits)."),
    ("h:٤٥", "JDTENSOR_COORDINATOR_BIND_ADDRESS='h:٤٥' has an invalid port '٤٥' "
     "(expected 1..65535 in ASCII digits)."),
    (" ", "JDTENSOR_COORDINATOR_BIND_ADDRESS=' ' is empty; give a host, host:port "
     "or [IPv6]:port, or unset it."),
    ("a" * 64 + ":5", "JDTENSOR_COORDINATOR_BIND_ADDRESS='" + "a" * 64 + ":5' has "
     "an invalid host '" + "a" * 64 + "': each dot-separated part of a host name "
     "has 1 to 63 characters."),
    ("hö:5", "JDTENSOR_COORDINATOR_BIND_ADDRESS='hö:5' has an invalid host 'hö': "
     "it may hold only ASCII letters, digits, '.', '-' and '_', or be [IPv6]."),
], ids=["port-too-big", "port-zero", "port-arabic-digits", "blank", "long-label",
        "non-ascii"])
def test_bind_address_is_strict(raw, message):
  with pytest.raises(ConfigError) as e:
    _env.parse_bind_address("JDTENSOR_COORDINATOR_BIND_ADDRESS", raw)
  assert str(e.value) == message


def test_bind_address_must_be_a_string():
  with pytest.raises(TypeError) as e:
    _env.parse_bind_address("coordinator_bind_address", 12345)
  assert str(e.value) == ("coordinator_bind_address must be a str like 'host', "
                          "'host:port' or '[::1]:port', got 12345 of type int.")


def test_a_cluster_read_parses_dtensor_jobs_once(monkeypatch):
  """Every check of one read uses the same parse, once."""
  calls = []
  from jdtensor._env import cluster_env  # pylint: disable=g-import-not-at-top
  real = cluster_env.parse_jobs
  monkeypatch.setattr(cluster_env, "parse_jobs", lambda raw: calls.append(raw) or real(raw))
  env = _env.read_cluster_env({"DTENSOR_JOBS": "localhost:1,localhost:2",
                               "DTENSOR_CLIENT_ID": "1", "DTENSOR_NUM_CLIENTS": "2"})
  assert (env.num_clients, env.client_id, env.job_name) == (2, 1, "worker")
  assert calls == ["localhost:1,localhost:2"]


@pytest.mark.parametrize("environ,expected", [
    ({"OMPI_COMM_WORLD_SIZE": "3"}, "mpirun -x JDTENSOR_RUN_SECRET"),
    ({"SLURM_JOB_ID": "7"}, "srun passes the environment on: --export=ALL"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "secretKeyRef"),
    ({}, "`jdtensor launch` sets one per run"),
])
def test_the_run_secret_hint_names_the_engines_way(environ, expected):
  """The unauthenticated-handshake warning says how to share the secret
  under the engine the client runs under."""
  assert expected in _env.run_secret_hint(environ)
