"""The user's CPU device count is the user's (real launches, real clients).

The rule, for `jdtensor launch`, `jdtensor.testing` and
`initialize_accelerator_system` alike: the explicit count when given, else the
count the environment gives JAX (``JAX_NUM_CPU_DEVICES``, else ``XLA_FLAGS``'s
``--xla_force_host_platform_device_count``), else JAX's 1; given both ways and
different, an error naming both. (The pure rule: tests/unit/test_launcher_spec.py.)
"""

import pytest

from tests.helpers import TEST_TIMEOUTS, clean_env, parse_results, run_python

pytestmark = pytest.mark.multiprocess

FLAG = "--xla_force_host_platform_device_count={}"

# Each client says how many devices it has and sums its ones over all of them.
CLIENT = ("import jax, jax.numpy as jnp, json, jdtensor, numpy as np\n"
          "jdtensor.initialize_accelerator_system('CPU')\n"
          "mesh = jax.make_mesh((jax.device_count(),), ('x',))\n"
          "x = jax.make_array_from_process_local_data(\n"
          "    jax.sharding.NamedSharding(mesh, jax.P('x')),\n"
          "    np.ones(jax.local_device_count(), np.float32))\n"
          "total = float(jax.jit(jnp.sum, out_shardings=jax.sharding.NamedSharding(\n"
          "    mesh, jax.P()))(x))\n"
          "print('RESULT devices=' + json.dumps([jax.local_device_count(),\n"
          "      jax.device_count(), jdtensor.num_local_devices('CPU'), total]))\n")


def cli_launch(args, **env):
  """`jdtensor launch -n 2 ARGS -- python -c CLIENT`, as from a shell with `env`."""
  return run_python(f"""
      import sys
      from jdtensor.cli import main
      sys.exit(main(["launch", "-n", "2", *{args!r}, "--timeout", "90", "--",
                     sys.executable, "-c", {CLIENT!r}]))
      """, env=clean_env(**{**TEST_TIMEOUTS, **env}), timeout=120)


@pytest.mark.parametrize("args,env,per_client", [
    ([], {}, 1),
    (["--devices-per-client", "2"], {}, 2),
    ([], {"XLA_FLAGS": FLAG.format(4)}, 4),
    ([], {"JAX_NUM_CPU_DEVICES": "3"}, 3),
    (["--devices-per-client", "2"], {"JAX_NUM_CPU_DEVICES": "2"}, 2),
], ids=["default-1", "flag", "xla-flags", "jax-num-cpu-devices", "both-agree"])
def test_launch_honours_the_users_count(args, env, per_client):
  res = cli_launch(args, **env)
  assert res.returncode == 0, res.stdout + res.stderr
  results = parse_results(res.stdout)
  assert set(results) == {0, 1}, res.stdout + res.stderr
  for r in results.values():
    assert r["devices"] == [per_client, 2 * per_client, per_client, 2 * per_client]


@pytest.mark.parametrize("env,where", [
    ({"XLA_FLAGS": FLAG.format(8)}, "XLA_FLAGS='" + FLAG.format(8) + "'"),
    ({"JAX_NUM_CPU_DEVICES": "8"}, "JAX_NUM_CPU_DEVICES='8'"),
])
def test_launch_refuses_two_different_counts_before_starting(env, where):
  res = cli_launch(["--devices-per-client", "2"], **env)
  assert res.returncode == 2, res.stdout + res.stderr
  assert res.stderr.strip() == (
      f"jdtensor launch: --devices-per-client 2 conflicts with {where} in the "
      "environment, which gives JAX 8 CPU device(s) per process; give the count "
      "once: drop --devices-per-client to use the environment's 8, or remove the "
      "device count from the environment.")
  assert "[client" not in res.stdout  # No client was started.


def test_testing_follows_the_same_rule():
  # The pytest process's own count (its in-process tests' 8) is inherited
  # unless the test gives one: devices_per_client, or a count in env=.
  res = run_python("""
      from jdtensor.errors import ConfigError
      from jdtensor.testing import run_in_multi_client
      def count():
        import jax
        return jax.local_device_count(), jax.device_count()
      print("inherited", run_in_multi_client(count, 2))
      print("argument", run_in_multi_client(count, 2, 2))
      print("env", run_in_multi_client(count, 2, env={"XLA_FLAGS": "%s"}))
      try:
        run_in_multi_client(count, 2, 2, env={"JAX_NUM_CPU_DEVICES": "3"})
      except ConfigError as e:
        print("conflict", e)
      """ % FLAG.format(4), env=clean_env(JAX_NUM_CPU_DEVICES="5", **TEST_TIMEOUTS),
      timeout=150)
  assert res.returncode == 0, res.stdout + res.stderr
  lines = [l for l in res.stdout.splitlines() if not l.startswith("[client")]
  assert lines == [
      "inherited [(5, 10), (5, 10)]",
      "argument [(2, 4), (2, 4)]",
      "env [(4, 8), (4, 8)]",
      "conflict multi_client: devices_per_client=2 conflicts with "
      "JAX_NUM_CPU_DEVICES='3' in the environment, which gives JAX 3 CPU "
      "device(s) per process; give the count once: drop "
      "devices_per_client to use the environment's 3, or remove the device "
      "count from the environment.",
  ]


@pytest.mark.parametrize("env,call,expected", [
    ({"XLA_FLAGS": FLAG.format(4)}, "initialize_accelerator_system('CPU')", "4"),
    ({"JAX_NUM_CPU_DEVICES": "3"}, "initialize_accelerator_system('CPU')", "3"),
    ({"JAX_NUM_CPU_DEVICES": "3"},
     "initialize_accelerator_system('CPU', num_logical_cpu_devices=3)", "3"),
    ({}, "initialize_accelerator_system('CPU', num_logical_cpu_devices=6)", "6"),
    ({"JAX_NUM_CPU_DEVICES": "3"},
     "initialize_accelerator_system('CPU', num_logical_cpu_devices=6)",
     "ConfigError: num_logical_cpu_devices=6 conflicts with JAX_NUM_CPU_DEVICES="
     "'3' in the environment, which gives JAX 3 CPU device(s) per process; give "
     "the count once: drop num_logical_cpu_devices to use the environment's 3, "
     "or remove the device count from the environment."),
], ids=["xla-flags", "jax-num-cpu-devices", "agree", "argument", "conflict"])
def test_initialize_accelerator_system_follows_the_same_rule(env, call, expected):
  res = run_python(f"""
      import jax, jdtensor
      try:
        jdtensor.{call}
        print(jax.local_device_count())
      except Exception as e:
        print(f"{{type(e).__name__}}: {{e}}")
      """, env=clean_env(**env))
  assert res.returncode == 0, res.stderr
  assert res.stdout.strip() == expected
