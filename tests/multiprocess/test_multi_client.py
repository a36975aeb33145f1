"""Real multi-client runs: real processes, JAX's coordination service, gloo."""

import io
import sys
import time

import pytest

from jdtensor import launcher
from jdtensor.testing import multi_client
from tests.helpers import (CLIENT, TEST_TIMEOUTS, clean_env, cluster_env, finish,
                           free_port, parse_results, run_python, start_clients)

pytestmark = pytest.mark.multiprocess

W = "/job:worker/replica:0/task:{t}/device:CPU:{i}"


def run_launcher(monkeypatch, n, devices, scenario, timeout=120):
  for k, v in TEST_TIMEOUTS.items():
    monkeypatch.setenv(k, v)
  out, err = io.StringIO(), io.StringIO()
  spec = launcher.LaunchSpec(command=(sys.executable, CLIENT, scenario), num_clients=n,
                             devices_per_client=devices, timeout=timeout)
  res = launcher.launch(spec, out=out, err=err)
  return res, out.getvalue(), err.getvalue()


def test_two_clients_two_devices(monkeypatch):
  res, out, err = run_launcher(monkeypatch, 2, 2, "basic")
  assert res.exit_code == 0, out + err
  r = parse_results(out)
  assert set(r) == {0, 1}
  for t in (0, 1):
    assert r[t]["client"] == [t, 2, 2]
    devs = ",".join(W.format(t=t, i=i) for i in range(2))
    assert r[t]["mesh"] == f"|batch=2,model=2|0,1,2,3|{2 * t},{2 * t + 1}|{devs}"
    assert r[t]["local_ids"] == [2 * t, 2 * t + 1]
    assert r[t]["jax_mesh_process_order"] == [0, 0, 1, 1]
    assert r[t]["psum"] == 10.0
    assert r[t]["matmul_ok"] is True
    assert r[t]["packed_shape"] == [4, 3]
    assert r[t]["unpack_ok"] is True and r[t]["fetch_layout_ok"] is True
    # Rows of the relaid-out array come from client 0's then client 1's components.
    assert r[t]["relayout_rows"] == [0.0, 100.0]
    assert r[t]["call_with_layout"] == [[8, 3], True]
    assert r[t]["barrier_counts"] == {"b1": 2, "(barrier)": 1}
    assert r[t]["legacy_mesh_ok"] is True
    assert r[t]["legacy_error"] == ("num_global_devices (4) must be equal to total "
                                    "size of the mesh of shape (5,)")
    assert r[t]["shutdown_error"] == ("Shutting down accelerator system under "
                                      "multi-client mode is not supported.")
    assert r[t]["still_initialized"] is True
  # The coordinator listens on loopback only, not on every interface.
  assert r[0]["coordinator_listen"] == "127.0.0.1"
  assert "[Gloo]" not in out


def test_a_cpu_start_up_loads_only_what_it_uses(monkeypatch):
  """Every client pays for each module it loads (and compiles it where no
  bytecode is cached): a CPU run loads no TPU code and no cluster detection,
  and only client 0 loads the handshake's server; jaxlib's error texts are
  compiled when a failure first reads one (benchmarks/RESULTS.md, "Start-up
  CPU by phase")."""
  res, out, err = run_launcher(monkeypatch, 2, 1, "loaded_modules")
  assert res.exit_code == 0, out + err
  r = parse_results(out)
  for c in (0, 1):
    assert r[c]["heartbeat_ready"] is True
    assert r[c]["compiled_patterns"] == []
    assert r[c]["idna_modules"] == []
    loaded = set(r[c]["modules"])
    assert {"jdtensor.accelerator", "jdtensor.heartbeat.protocol",
            "jdtensor.layout"} <= loaded, loaded
    unused = {m for m in loaded if m.startswith(("jdtensor.tpu.", "jdtensor.launcher",
                                                 "jdtensor.testing"))}
    unused |= loaded & {"jdtensor.cluster", "jdtensor.api", "jdtensor._proto",
                        "jdtensor.cli"}
    assert not unused, unused
  assert "jdtensor.runtime.host" in r[0]["modules"]
  assert "jdtensor.runtime.host" not in r[1]["modules"]


def test_four_clients_one_device(monkeypatch):
  res, out, err = run_launcher(monkeypatch, 4, 1, "basic")
  assert res.exit_code == 0, out + err
  r = parse_results(out)
  assert r[1]["mesh"] == "|batch=2,model=2|0,1,2,3|1|" + W.format(t=1, i=0)
  assert [r[t]["local_ids"] for t in range(4)] == [[0], [1], [2], [3]]
  assert all(r[t]["psum"] == 10.0 and r[t]["matmul_ok"] for t in range(4))
  assert r[3]["jax_mesh_process_order"] == [0, 1, 2, 3]


@pytest.mark.parametrize("devices", [1, 2])
def test_jax_harness_short_coordination_timeout_starts_with_jdtensors_defaults(devices):
  """JAX's own multi-process harness shortens JAX's heartbeat to 5 s and sets
  nothing of jdtensor's: the stuck time-out and period follow it (3 s, 0.75 s),
  said once in the log, and the run works."""
  out, err = io.StringIO(), io.StringIO()
  res = launcher.launch(launcher.LaunchSpec(
      command=(sys.executable, CLIENT, "jax_harness_timeouts"), num_clients=2,
      devices_per_client=devices, timeout=90), out=out, err=err,
      env=clean_env())
  out, err = out.getvalue(), err.getvalue()
  assert res.exit_code == 0, out + err
  r = parse_results(out)
  for c in (0, 1):
    assert r[c]["heartbeat"] == [True, 3.0, 0.75], out
    assert r[c]["coordination"] == 5.0
    assert r[c]["psum"] == devices * 3.0
  derived = ("jdtensor: derived from what was set: JDTENSOR_STUCK_TIMEOUT 3 s, 0.6 of "
             "coordination_timeout=5")
  for c in (0, 1):
    assert err.count(f"[client {c}] INFO:jdtensor:{derived}") == 1, err


def test_legacy_dtensor_initialize_multi_client(monkeypatch):
  res, out, err = run_launcher(monkeypatch, 2, 1, "legacy_init")
  assert res.exit_code == 0, out + err
  r = parse_results(out)
  assert r[1]["legacy_init"] == [True, "|x=2|0,1|1|" + W.format(t=1, i=0)]


@multi_client(num_clients=2, env=TEST_TIMEOUTS)
def test_barrier_timeout_raises_instead_of_hanging():
  """Client 1 never reaches the barrier; client 0's times out and raises."""
  import jdtensor
  mesh = jdtensor.create_distributed_mesh([("x", 2)])
  if jdtensor.client_id() == 1:
    time.sleep(4)  # Alive, but elsewhere.
    return
  start = time.monotonic()
  with pytest.raises(jdtensor.BarrierTimeoutError) as e:
    jdtensor.barrier(mesh, "never", timeout_in_ms=1500)
  assert str(e.value) == (
      "Barrier 'never:0' timed out after 1500 ms: not every client arrived. A "
      "client that is slow, stuck, or has exited never reaches it; check the "
      "other clients' output.")
  assert 1.4 <= time.monotonic() - start < 10
  # JAX's own error stays the cause (its type, its message, its traceback).
  assert e.value.__cause__ is not None and "DEADLINE_EXCEEDED" in str(e.value.__cause__)


@pytest.mark.parametrize("form", ["{port}", "{port:06d}"],
                         ids=["plain", "tf-helper-zero-padded"])
def test_descending_ports(form):
  # DTensor's harness hands out ports in descending order to catch ordering
  # bugs, written f"localhost:{port:06d}" (multi_client_test_util.run_client).
  hi, lo = sorted([free_port(), free_port()], reverse=True)
  jobs = [f"localhost:{form.format(port=hi)}", f"localhost:{form.format(port=lo)}"]
  # With the rest of what that helper sets (slice_host_devices_for_multiworker
  # and multi_client_test.client_config_function).
  tf_helper = lambda c: {"CUDA_VISIBLE_DEVICES": str(c), "HIP_VISIBLE_DEVICES": str(c),
                         "CLOUD_TPU_TASK_ID": str(c), "DTENSOR_JOB_NAME": "worker"}
  results = finish(start_clients("init_only", [
      cluster_env(jobs, c, **(tf_helper(c) if "06d" in form else {}))
      for c in (0, 1)]), timeout=60)
  for res in results:
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'RESULT initialized=true' in res.stdout


# -- start-up failures between clients (single-client ones: tests/faults) ----------

def assert_clean_failure(res, message):
  assert res.returncode == 1, res.stdout + res.stderr
  assert message in res.stdout, res.stdout + res.stderr
  for crash in ("Check failed", "Fatal Python error", "Aborted", "*** SIG",
                "Terminating process"):
    assert crash not in res.stderr, res.stderr


@pytest.mark.parametrize("secret", [True, False], ids=["authenticated", "no-secret"])
def test_clients_disagree_on_jobs(secret):
  a, b, c = free_port(), free_port(), free_port()
  run = {"JDTENSOR_RUN_SECRET": "s" * 32} if secret else {}
  envs = [cluster_env([f"localhost:{a}", f"localhost:{b}"], 0, secret=False, **run),
          cluster_env([f"localhost:{a}", f"localhost:{c}"], 1, secret=False, **run)]
  r0, r1 = finish(start_clients("init_only", envs), timeout=60)
  assert_clean_failure(r0, (
      "ERROR StartupError: Client 1 has a DTENSOR_JOBS (2 entries) that differs "
      f"from client 0's (2 entries: 'localhost:{a},localhost:{b}'); every client "
      "needs the same DTENSOR_JOBS."))
  # Client 0's own value goes only to a client that proved it knows the secret.
  shown = f" ('localhost:{a},localhost:{b}')" if secret else ""
  assert_clean_failure(r1, (
      "ERROR StartupError: Client 1: start-up refused by client 0: Client 1 has a "
      f"DTENSOR_JOBS that differs from client 0's{shown}; every client needs the "
      "same DTENSOR_JOBS."))


def test_duplicate_client_ids_and_device_counts():
  jobs = [f"localhost:{free_port()}" for _ in range(3)]
  envs = [cluster_env(jobs, 0), cluster_env(jobs, 1), cluster_env(jobs, 1)]
  results = finish(start_clients("init_only", envs), timeout=60)
  assert all(r.returncode == 1 for r in results), results
  assert any("Two processes claim DTENSOR_CLIENT_ID=1" in r.stdout for r in results)
  jobs = [f"localhost:{free_port()}" for _ in range(2)]
  envs = [cluster_env(jobs, 0, devices=2), cluster_env(jobs, 1, devices=3)]
  r0, _ = finish(start_clients("init_only", envs), timeout=60)
  assert_clean_failure(r0, "Client 1 has 3 local devices but client 0 has 2")


def test_cluster_from_slurm_environment():
  port = free_port()
  envs = []
  for task in (0, 1):
    env = cluster_env([], task)
    del env["DTENSOR_JOBS"], env["DTENSOR_CLIENT_ID"]
    env.update(SLURM_JOB_ID="77", SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="2",
               SLURM_PROCID=str(task), SLURM_STEP_TASKS_PER_NODE="2",
               JAX_COORDINATOR_PORT=str(port), JDTENSOR_CLUSTER_DETECTION="slurm")
    envs.append(env)
  results = finish(start_clients("detected", envs), timeout=90)
  for task, res in enumerate(results):
    assert res.returncode == 0, res.stdout + res.stderr
    r = parse_results("\n".join(f"[client {task}] {l}" for l in res.stdout.splitlines()))
    assert r[task]["detected"] == [
        task, [f"localhost:{port}", f"localhost:{port + 1}"],
        f"|x=2|0,1|{task}|/job:worker/replica:0/task:{task}/device:CPU:0"]
    assert r[task]["environ_untouched"] is True


def test_one_answer_to_who_am_i_after_an_explicit_cluster():
  """initialize_multi_client_cluster(job_name="trainer", ..., client_id=1)
  with no DTENSOR_* set: every config function and mesh says client 1 of
  "trainer", as JAX runs it (before the fix: client 0 of 1, "localhost")."""
  jobs = [f"localhost:{free_port()}" for _ in range(2)]
  envs = []
  for c in (0, 1):
    env = cluster_env(jobs, c)
    del env["DTENSOR_JOBS"], env["DTENSOR_CLIENT_ID"]
    env.update(CLUSTER_JOBS=",".join(jobs), CLUSTER_ME=str(c))
    envs.append(env)
  results = finish(start_clients("explicit_cluster", envs), timeout=90)
  for c, res in enumerate(results):
    assert res.returncode == 0, res.stdout + res.stderr
    r = parse_results("\n".join(f"[client {c}] {l}" for l in res.stdout.splitlines()))
    device = f"/job:trainer/replica:0/task:{c}/device:CPU:0"
    assert r[c]["who"] == [c, 2, "trainer", jobs, f"trainer/replica:0/task:{c}",
                           [device], [device],
                           f"/job:trainer/replica:0/task:{c}/device:CUSTOM:0"]


def test_seed_dtensor_initialize_tpu_system_merges_core_ids():
  jobs = [f"localhost:{free_port()}" for _ in range(2)]
  envs = [cluster_env(jobs, c, devices=8, DTENSOR_JOB_NAME="worker",
                      JDTENSOR_SIMULATED_TPU_TOPOLOGY="2x4x1x2") for c in (0, 1)]
  results = finish(start_clients("seed_tpu_init", envs), timeout=90)
  outs = []
  for c, res in enumerate(results):
    assert res.returncode == 0, res.stdout + res.stderr
    outs.append(parse_results("\n".join(f"[client {c}] {l}"
                                         for l in res.stdout.splitlines()))[c])
  assert outs[0]["seed_tpu"] == outs[1]["seed_tpu"]
  device_type, core_ids, total = outs[0]["seed_tpu"]
  assert device_type == "TPU" and total == 16 and sorted(core_ids) == list(range(16))


def test_seed_dtensor_initialize_tpu_system_needs_dtensor_jobs():
  res = run_python("""
      import jdtensor
      try:
        jdtensor.dtensor_initialize_tpu_system()
      except ValueError as e:
        print("ERR", e)
      """, env=clean_env(DTENSOR_JOB_NAME="worker"))
  assert res.returncode == 0, res.stderr
  assert res.stdout.strip() == (
      "ERR DTENSOR_JOBS environment variable is required whenusing multi-client "
      "to properly set up communications between servers")


@multi_client(num_clients=2, devices_per_client=2, env=TEST_TIMEOUTS)
def test_barrier_takes_a_jax_mesh_as_well_as_a_jdtensor_mesh():
  """`jax.make_mesh(...)` (every client's devices) works as DTensor's mesh
  does: the coordination barrier, then the all-reduce over its devices."""
  import jax
  import jdtensor
  jdtensor.barrier(jax.make_mesh((jax.device_count(),), ("x",)), "a JAX mesh",
                   timeout_in_ms=30_000)
  jdtensor.barrier(jdtensor.create_distributed_mesh([("x", jax.device_count())]),
                   "a jdtensor mesh", timeout_in_ms=30_000)
  with pytest.raises(TypeError, match=r"got str$"):
    jdtensor.barrier("x")


@pytest.mark.parametrize("differs", ["jax", "x64"])
def test_clients_that_run_other_software_are_all_refused_at_once(differs):
  """Found by hand (issue #67): client 0 on jax 0.12.1 and client 1 on
  0.11.2 met, and their first jitted sum never returned, with no word (as
  do clients where one has JAX_ENABLE_X64=1). Client 1 here says it runs
  another JAX (its jax.__version__, set before initialisation: two JAX
  versions in one venv would cost an install), or has 64-bit types on;
  every client, client 0 too, exits at once naming what each runs and the
  fix."""
  jobs = [f"localhost:{free_port()}" for _ in range(3)]
  culprit = {"jax": {"DIFFERS": "jax"}, "x64": {"JAX_ENABLE_X64": "1"}}[differs]
  start = time.monotonic()
  results = finish(start_clients("mixed_software", [
      cluster_env(jobs, c, CULPRIT="1", **(culprit if c == 1 else {}))
      for c in range(3)]), timeout=60)
  took = time.monotonic() - start
  out = [parse_results("\n".join(f"[client {c}] {l}" for l in r.stdout.splitlines()))[c]
         for c, r in enumerate(results)]
  real = out[0]["jax"]
  each, fix = {
      "jax": (f"clients 0, 2: jax {real}; client 1: jax 0.0.0+culprit",
              f"Install the same jax on every client (client 0 has jax=={real})."),
      "x64": ("clients 0, 2: jax_enable_x64=False; client 1: jax_enable_x64=True",
              "Set jax_enable_x64 the same on every client (client 0 has False: "
              "JAX_ENABLE_X64, or jax.config.update before "
              "initialize_accelerator_system)."),
  }[differs]
  message = ("Clients run different software, so the programs they compile would "
             "not match (a collective that never returns, or wrong data): "
             f"{each}. {fix}")
  assert_clean_failure(results[0], f"ERROR StartupError: {message}\n")
  for c in (1, 2):
    assert_clean_failure(results[c], (
        f"ERROR StartupError: Client {c}: start-up refused by client 0: {message}\n"))
  # At once, not after a time-out (the init timeout is 30 s): within a second
  # of each other, and nobody reached JAX's collectives.
  refused = [o["refused_at"] for o in out]
  assert max(refused) - min(refused) < 1.0, refused
  assert took < 25, took
  assert not any("psum" in o for o in out), out
