"""Architecture rules: pure modules stay pure, config never starts a backend."""

import ast
import pathlib

import pytest

from tests.helpers import clean_env, run_python

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jdtensor"

# No module imports jax at module level (functions that touch the runtime
# import it lazily), so importing any of them never starts a backend. The one
# exception is the private-JAX boundary, which only runtime code imports, and
# only inside functions.
PRIVATE_JAX = "_jax_private.py"
MODULES = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if p.name != PRIVATE_JAX)
# The launcher's parent process and the pure layers: not even numpy.
STDLIB_ONLY = ["launcher", "cli", "_env", "_rendezvous", "cluster", "errors",
               "device_spec", "_logging", "testing", "testing._transport"]


def _top_level_imports(path):
  tree = ast.parse(path.read_text())
  names = []
  for node in tree.body:
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.append(node.module)
  return names


@pytest.mark.parametrize("module", MODULES)
def test_no_module_level_jax_import(module):
  imports = _top_level_imports(PACKAGE / module)
  assert not [i for i in imports if i == "jax" or i.startswith("jax.")], imports


@pytest.mark.subprocess
def test_launcher_parent_imports_neither_jax_nor_numpy():
  result = run_python(f"""
      import sys
      for name in {STDLIB_ONLY!r}:
        __import__("jdtensor." + name)
      heavy = sorted(m for m in ("jax", "numpy", "absl") if m in sys.modules)
      print("HEAVY", heavy)
      """)
  assert result.returncode == 0, result.stderr
  assert "HEAVY []" in result.stdout, result.stdout


def _dotted_names(tree):
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute):
      parts, value = [node.attr], node.value
      while isinstance(value, ast.Attribute):
        parts.append(value.attr)
        value = value.value
      if isinstance(value, ast.Name):
        yield ".".join([value.id, *reversed(parts)])
    elif isinstance(node, ast.ImportFrom) and node.module:
      yield node.module


def test_only_runtime_touches_jax_config_and_distributed():
  """Runtime state has one owner: nobody else configures JAX or its runtime."""
  for path in PACKAGE.rglob("*.py"):
    if path.name == "runtime.py":
      continue
    names = set(_dotted_names(ast.parse(path.read_text())))
    assert not {n for n in names if n.startswith(("jax.config.update",
                                                   "jax.distributed",
                                                   "jax._src.distributed"))}, path


def _all_imports(tree):
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      yield node.module


@pytest.mark.parametrize("module", MODULES)
def test_private_jax_api_lives_in_one_module(module):
  """jax._src and jaxlib are touched only by _jax_private (README, "Testing a
  new JAX"), and nobody imports that module at module level."""
  tree = ast.parse((PACKAGE / module).read_text())
  private = {n for n in set(_all_imports(tree)) | set(_dotted_names(tree))
             if n.startswith(("jax._src", "jaxlib"))}
  assert not private, (module, private)
  assert "jdtensor._jax_private" not in _top_level_imports(PACKAGE / module)
  top_from = [n for n in tree.body if isinstance(n, ast.ImportFrom)
              and n.module == "jdtensor" and any(a.name == "_jax_private"
                                                 for a in n.names)]
  assert not top_from, module


@pytest.mark.subprocess
def test_config_and_data_model_never_start_a_backend():
  result = run_python("""
      import sys
      import jdtensor
      from jdtensor import config
      assert "jax" not in sys.modules, "import jdtensor imported jax"
      import jax  # importing jax is fine; starting a backend is not
      from jax._src import xla_bridge
      for fn in (jdtensor.client_id, jdtensor.num_clients, jdtensor.job_name,
                 jdtensor.full_job_name, jdtensor.jobs, jdtensor.heartbeat_enabled,
                 jdtensor.preferred_device_type, config.is_local_mode,
                 config.gpu_use_nccl_communication, config.use_multi_device_mode):
        fn()
      for t in ("CPU", "GPU", "TPU"):
        jdtensor.local_devices(t); jdtensor.local_devices(t, for_client_id=1)
        jdtensor.num_local_devices(t); jdtensor.num_global_devices(t)
      assert jdtensor.num_local_devices("CPU") == 3
      m = jdtensor.Mesh.from_string("|x=2|0,1|1|/job:worker/replica:0/task:1/device:CPU:0")
      jdtensor.Layout.from_string("sharding_specs:x, mesh:" + m.to_string())
      jdtensor.Layout.batch_sharded(m, "x", 2).local_shape_from_global_shape([4, 2])
      for bad in ("garbage", "|x=2|0,1|0,1|CPU:0,CPU:1"):
        try:
          jdtensor.Mesh.from_string(bad)
        except ValueError:
          pass
      assert not xla_bridge.backends_are_initialized(), "a backend was started"
      print("PURE-OK")
      """, env=clean_env(DTENSOR_JOBS="localhost:1,localhost:2",
                         DTENSOR_CLIENT_ID="1", JAX_NUM_CPU_DEVICES="3"))
  assert result.returncode == 0, result.stderr
  assert "PURE-OK" in result.stdout


@pytest.mark.subprocess
def test_bad_env_errors_do_not_start_a_backend():
  result = run_python("""
      import jdtensor
      from jax._src import xla_bridge
      try:
        jdtensor.initialize_accelerator_system()
      except ValueError as e:
        print("ERR", e)
      assert not xla_bridge.backends_are_initialized()
      """, env=clean_env(DTENSOR_CLIENT_ID="one"))
  assert result.returncode == 0, result.stderr
  assert ("ERR DTENSOR_CLIENT_ID='one' is not an integer; set it to this "
          "process's index in DTENSOR_JOBS (0 for the first).") in result.stdout
