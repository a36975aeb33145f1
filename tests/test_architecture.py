"""Architecture rules: pure modules stay pure, config never starts a backend."""

import ast
import pathlib
import re

import pytest

from tests.helpers import clean_env, run_python

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jdtensor"

# No module imports jax at module level (functions that touch the runtime
# import it lazily), so importing any of them never starts a backend. The one
# exception is the private-JAX boundary, which only runtime code imports, and
# only inside functions.
PRIVATE_JAX = "runtime/jax_private.py"
MODULES = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if str(p.relative_to(PACKAGE)) != PRIVATE_JAX)
# The launcher's parent process and the pure layers: not even numpy.
STDLIB_ONLY = ["launcher", "launcher.gpus", "launcher.spec", "launcher.processes", "launcher.output",
               "launcher.trace", "_trace",
               "launcher.supervisor", "launcher.channels", "launcher.compile_cache",
               "launcher.nodes", "_report", "_wire", "steps",
               "_status",
               "_jaxlib_texts", "_monitoring", "_threads",
               "cli", "_env", "cluster", "errors",
               "device_spec", "_device_nodes", "_logging", "testing", "testing._transport",
               "testing._client", "testing._warm"]


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
    if path.relative_to(PACKAGE).as_posix() in ("runtime/state.py", "runtime/startup.py"):
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
  """jax._src and jaxlib are touched only by runtime.jax_private
  (CONTRIBUTING.md, "Testing a
  new JAX"), and nobody imports that module at module level."""
  tree = ast.parse((PACKAGE / module).read_text())
  private = {n for n in set(_all_imports(tree)) | set(_dotted_names(tree))
             if n.startswith(("jax._src", "jaxlib"))}
  assert not private, (module, private)
  assert "jdtensor.runtime.jax_private" not in _top_level_imports(PACKAGE / module)
  top_from = [n for n in tree.body if isinstance(n, ast.ImportFrom)
              and n.module == "jdtensor.runtime" and any(a.name == "jax_private"
                                                         for a in n.names)]
  assert not top_from, module


# The heartbeat's decisions, what they mean for a client and their words:
# functions of their arguments, pinned as tables without threads.
HEARTBEAT_PURE = ["heartbeat/verdicts.py", "heartbeat/stragglers.py",
                  "heartbeat/failures.py", "heartbeat/wording.py", "heartbeat/wire.py"]
# What would make them more than that: threads, time, the process, I/O.
IMPURE = {"threading", "time", "os", "sys", "socket", "selectors", "subprocess",
          "signal", "logging", "jdtensor._logging", "jdtensor.heartbeat.protocol",
          "jdtensor.heartbeat.exchange", "jdtensor.runtime"}


@pytest.mark.parametrize("module", HEARTBEAT_PURE)
def test_the_heartbeats_decisions_are_pure(module):
  imports = set(_all_imports(ast.parse((PACKAGE / module).read_text())))
  assert not imports & IMPURE, (module, sorted(imports & IMPURE))
  assert not [i for i in imports if i.startswith(("jax", "jdtensor.runtime."))], module


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


# -- the layer table (docs/guides/architecture.md) --------------------------------------
#
# A module may import (at module level or inside a function) only modules of
# its own layer or below, and nothing may form a cycle. One import goes up, on
# purpose: the data model's JAX conversion methods (Mesh.jax_mesh,
# Layout.to_jax_sharding, ...) call down into runtime.interop when called;
# interop never imports layout back.
LAYERS = [
    ("the floor", ["errors", "_env.names", "_env.parse", "_env.cluster_env",
                   "_env.runtime_env", "_env.heartbeat_env", "_env", "_logging",
                   "_deadline", "_ids", "_limits", "device_spec", "_device_nodes", "_wire",
                   "_jaxlib_texts", "_monitoring", "_threads",
                   "_report", "_status", "_trace", "cluster", "steps"]),
    ("the data model", ["tpu", "tpu.ring", "layout", "_proto"]),
    ("runtime leaves", ["runtime.link_messages", "runtime.links", "runtime.handshake",
                        "runtime.host",
                        "runtime.rendezvous", "runtime.jax_private",
                        "runtime.startup", "tpu.topology"]),
    ("the state owner", ["runtime.state", "runtime"]),
    ("runtime users", ["runtime.interop"]),
    # Inside heartbeat/, the exit path walks down: the package wires
    # `process` (the exit guard) -> `protocol` -> `leaving` (the way out) ->
    # `interfaces` -> the decisions -> the floor.
    ("heartbeat's floor", ["heartbeat.watched", "heartbeat.departure", "heartbeat.flight",
                           "heartbeat.progress",
                           "heartbeat.watchdog", "heartbeat.wire", "heartbeat.lifecycle"]),
    ("heartbeat's decisions", ["heartbeat.stragglers", "heartbeat.meetings",
                               "heartbeat.verdicts", "heartbeat.wording",
                               "heartbeat.failures"]),
    ("heartbeat's seams", ["heartbeat.interfaces"]),
    ("heartbeat's way out", ["heartbeat.leaving"]),
    ("heartbeat's threads", ["heartbeat.protocol", "heartbeat.exchange"]),
    ("heartbeat's process", ["heartbeat.process"]),
    ("heartbeat", ["heartbeat"]),
    ("DTensor's face", ["config", "api", "mesh_util", "tpu.mesh", "tpu.system",
                        "accelerator"]),
    ("the launcher's floor", ["launcher.gpus", "launcher.output", "launcher.processes",
                              "launcher.compile_cache"]),
    ("the launch spec", ["launcher.spec"]),
    ("the run's trace", ["launcher.trace"]),
    ("one node", ["launcher.supervisor", "launcher.channels"]),
    ("several nodes", ["launcher.nodes"]),
    ("the launcher", ["launcher"]),
    ("tools", ["cli", "demo", "__main__", "testing", "testing._transport",
               "testing._client", "testing._warm", "testing.pytest_plugin"]),
]
ALLOWED_UPWARD = {("layout", "runtime.interop")}
LAYER_OF = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}


def _module_names():
  names = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    names[name or "__init__"] = path
  return names


def _type_checking_nodes(tree):
  """Nodes inside `if TYPE_CHECKING:` blocks (imports for type checkers)."""
  skipped = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
      skipped.update(id(n) for n in ast.walk(node))
  return skipped


def _imports_of(name, path, names):
  """Every jdtensor module `name` imports, at any depth of its code, those
  for type checkers (``if TYPE_CHECKING:``) included: a cycle a type checker
  follows is one a reader follows too."""
  import jdtensor  # pylint: disable=g-import-not-at-top
  tree = ast.parse(path.read_text())
  is_package = path.name == "__init__.py"
  out = set()
  for node in ast.walk(tree):
    targets = []
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        package = ["jdtensor"] + name.split(".")[:None if is_package else -1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
      # `from package import module` imports the module (its package's
      # __init__ runs first, as for any submodule: not counted); `from module
      # import name` imports the module.
      modules = [f"{base}.{a.name}" for a in node.names
                 if f"{base}.{a.name}".removeprefix("jdtensor").lstrip(".") in names]
      targets = modules if len(modules) == len(node.names) else modules + [base]
    for target in targets:
      if not target.startswith("jdtensor"):
        continue
      module = target.removeprefix("jdtensor").lstrip(".")
      if module in jdtensor._EXPORTS:  # pylint: disable=protected-access
        module = jdtensor._EXPORTS[module].removeprefix("jdtensor.")  # pylint: disable=protected-access
      if module in names and module not in ("__init__", name):
        out.add(module)
  return out


def _import_graph():
  names = _module_names()
  return {n: _imports_of(n, p, names) for n, p in names.items() if n != "__init__"}


def test_every_module_has_a_layer():
  missing = sorted(set(_import_graph()) - set(LAYER_OF))
  assert not missing, f"put {missing} in LAYERS (and docs/guides/architecture.md)"


def test_imports_only_go_down_the_layers():
  wrong = [(a, b) for a, targets in _import_graph().items() for b in targets
           if LAYER_OF[b] > LAYER_OF[a] and (a, b) not in ALLOWED_UPWARD]
  assert not wrong, [f"{a} ({LAYERS[LAYER_OF[a]][0]}) imports {b} "
                     f"({LAYERS[LAYER_OF[b]][0]})" for a, b in wrong]


def test_no_import_cycles_even_inside_functions():
  graph = _import_graph()
  state = {}

  def visit(node, path):
    state[node] = "open"
    for nxt in sorted(graph[node]):
      if state.get(nxt) == "open":
        raise AssertionError("import cycle: " + " -> ".join(path + [node, nxt]))
      if nxt not in state:
        visit(nxt, path + [node])
    state[node] = "done"
  for node in sorted(graph):
    if node not in state:
      visit(node, [])


# Submodules that use their own package's public functions: users of the
# package, never imported by its __init__ (which re-exports the others).
PACKAGE_USERS = {"runtime.interop", "testing.pytest_plugin"}


def test_a_submodule_imports_its_own_package_only_as_a_named_user():
  """A package's __init__ re-exports its submodules, so it imports them; a
  submodule that took a name from its package's __init__ would close a cycle
  that works only by import order. Submodules import each other by name; the
  few that use their package's API are named, and their package never
  imports them."""
  graph = _import_graph()
  wrong = sorted(f"{name} imports {package}" for name, targets in graph.items()
                 for package in targets
                 if name.startswith(package + ".") and name not in PACKAGE_USERS)
  assert not wrong, wrong
  for user in PACKAGE_USERS:
    package = user.rsplit(".", 1)[0]
    assert package in graph[user], f"{user} no longer uses {package}: unlist it"
    assert user not in graph[package], f"{package} imports its user {user}"


def test_the_launcher_never_imports_the_runtime():
  """The launcher's parent is a plain process supervisor: it reaches the clients
  only through the environment, their exit codes and `_report`'s files, and
  meets other launchers over `_wire`; nothing of the runtime, the heartbeat or
  DTensor's face."""
  floor = set(LAYERS[0][1])
  graph = _import_graph()
  wrong = {name: sorted(t for t in targets if t not in floor
                        and not t.startswith("launcher"))
           for name, targets in graph.items()
           if name == "launcher" or name.startswith("launcher.")}
  assert not any(wrong.values()), wrong


def test_the_public_names_are_listed_once_and_agree():
  """__init__ names each export in _EXPORTS; the TYPE_CHECKING imports (for
  type checkers) and __all__ must say the same."""
  import jdtensor  # pylint: disable=g-import-not-at-top
  tree = ast.parse((PACKAGE / "__init__.py").read_text())
  typed = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and id(node) in _type_checking_nodes(tree):
      for alias in node.names:
        typed[alias.asname or alias.name] = node.module
  assert typed == jdtensor._EXPORTS  # pylint: disable=protected-access
  assert jdtensor.__all__ == sorted(jdtensor._EXPORTS)  # pylint: disable=protected-access
  for name, module in jdtensor._EXPORTS.items():  # pylint: disable=protected-access
    assert name in __import__(module, fromlist=["_"]).__all__, (name, module)


def test_environment_names_and_reads_live_in_env():
  """jdtensor's own variables are named only in _env/names.py, and only _env
  (and the tools, which pass the environment on to children) reads os.environ; the
  cluster managers' variables are parsed by cluster.py from a mapping."""
  for path in PACKAGE.rglob("*.py"):
    name = path.relative_to(PACKAGE).as_posix()
    if name == "_env/names.py":
      continue
    text = path.read_text()
    tree = ast.parse(text)
    exported = {id(c) for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "__all__" for t in node.targets)
                for c in ast.walk(node)}
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                and isinstance(n.value, str) and id(n) not in exported}
    own = {v for v in literals if re.fullmatch(r"J?DTENSOR_[A-Z0-9_]+", v)
           or v == "JAX_NUM_CPU_DEVICES"}
    assert not own, (name, own)
    reads = "os.environ" in set(_dotted_names(tree))
    # testing/_client.py saves and restores the whole environment around a
    # test body on a warm cluster: no variable is read there.
    assert not reads or name in ("_env/parse.py", "launcher/__init__.py",
                                 "testing/__init__.py", "testing/_client.py",
                                 "cluster.py"), name


def test_the_tested_jax_range_is_pinned_once():
  """pyproject.toml pins exactly `runtime.jax_private.TESTED_RANGE` (what the warning
  for a missing private symbol quotes), the README's install line and
  CONTRIBUTING say the same, and CI (tests/envs.sh, the README's test command)
  tests its lower end, a version between, and the newest release below its
  upper bound (pip resolves it)."""
  import re  # pylint: disable=g-import-not-at-top
  tree = ast.parse((PACKAGE / PRIVATE_JAX).read_text())
  tested = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "TESTED_RANGE")
  root = PACKAGE.parent
  pyproject = (root / "pyproject.toml").read_text()
  assert f'"jax{tested}"' in pyproject and f'"jaxlib{tested}"' in pyproject
  readme, contributing = (root / "README.md").read_text(), (root / "CONTRIBUTING.md").read_text()
  assert f"jax and jaxlib {tested}," in readme
  assert f"jax and jaxlib `{tested}`" in contributing
  command = readme.split("<!-- test-command -->")[1].split("```")[1]
  assert "bash tests/envs.sh" in command, command
  low, high = re.fullmatch(r">=([0-9.]+),<([0-9.]+)", tested).groups()
  envs = (root / "tests" / "envs.sh").read_text()
  middle = re.search(r"^MIDDLE_JAX=([0-9.]+)$", envs, re.M).group(1)

  def version(text):
    return tuple(int(part) for part in text.split("."))
  assert version(low) < version(middle) < version(high)
  # The newest part pins no JAX of its own: pip installs the newest release
  # the pin allows, so the leg never falls behind a release.
  newest = re.search(r"^    newest\) .*?;;$", envs, re.M | re.S).group(0)
  assert "make_env newest" in newest and "jax==" not in newest and "jax_pins" not in newest


def test_every_jaxlib_text_has_a_probe_that_exists():
  """Each jaxlib text jdtensor matches on names the test that produces it on
  the installed JAX (CONTRIBUTING.md, "Testing a new JAX"), and that test exists; the
  private-JAX module lists every text beside its symbols."""
  from jdtensor import _jaxlib_texts  # pylint: disable=g-import-not-at-top
  texts = [n for n in _jaxlib_texts.__all__ if n != "PROBES"]
  assert sorted(_jaxlib_texts.PROBES) == sorted(texts)
  for name, probe in _jaxlib_texts.PROBES.items():
    path, _, test = probe.partition("::")
    source = (PACKAGE.parent / path).read_text()
    assert f"def {test}(" in source, (name, probe)
  private = (PACKAGE / PRIVATE_JAX).read_text()
  assert "TEXTS = {name: _jaxlib_texts.text(name)" in private


def test_jaxlib_patterns_compile_on_first_use_and_match_their_text():
  """The patterns are compiled when first read (a start-up compiles none:
  test_a_cpu_start_up_loads_only_what_it_uses), each once, from the text the
  private-JAX module lists."""
  import re  # pylint: disable=g-import-not-at-top
  from jdtensor import _jaxlib_texts  # pylint: disable=g-import-not-at-top
  for name in _jaxlib_texts.__all__:
    if name == "PROBES":
      continue
    value = getattr(_jaxlib_texts, name)
    if isinstance(value, re.Pattern):
      assert value.pattern == _jaxlib_texts.text(name)
      assert getattr(_jaxlib_texts, name) is value
    else:
      assert value == _jaxlib_texts.text(name)
  assert _jaxlib_texts.GLOO_NEVER_JOINED.search(
      "Gloo context initialization failed: DEADLINE_EXCEEDED\n... duration: 30.0s"
  ).group(1) == "30.0"  # re.S: the duration may be on a later line.
  with pytest.raises(AttributeError, match="GLOO_NOPE"):
    _jaxlib_texts.GLOO_NOPE  # pylint: disable=pointless-statement


def test_the_start_up_benchmark_times_functions_that_exist():
  """`bench_startup_cpu.py` times each start-up step around its function, by
  name: a rename must show here, not as a row missing from RESULTS.md."""
  import importlib  # pylint: disable=g-import-not-at-top
  from benchmarks import _phases_client  # pylint: disable=g-import-not-at-top
  for label, module_name, name in _phases_client.STEPS:
    assert callable(getattr(importlib.import_module(module_name), name)), label



def test_the_instruction_benchmark_reads_one_callgrind_summary_per_client():
  """`bench_instructions.py` takes each client's count from callgrind's
  summary line, and refuses output with none or several (a child process
  traced too, or a client that died before valgrind wrote it)."""
  from benchmarks import bench_instructions  # pylint: disable=g-import-not-at-top
  err = ("==2273== Events    : Ir\n==2273== Collected : 9350044446\n"
         "==2273== \n==2273== I   refs:      9,350,044,446\n")
  assert bench_instructions.collected(err) == 9350044446
  for bad in ("", err + err.replace("2273", "2274")):
    with pytest.raises(ValueError, match="expected one callgrind summary"):
      bench_instructions.collected(bad)


def test_the_timeline_benchmark_reads_the_critical_path_from_the_client_that_imported_last():
  """`bench_timeline.py` measures from the last client's end of imports to
  the last first psum, with the steps of that client (not of the first)."""
  from benchmarks import bench_timeline  # pylint: disable=g-import-not-at-top
  first = {"phase imports": (10.0, 10.0), "checks": (10.01, 10.012),
           "rendezvous": (10.012, 10.3), "phase init": (10.35, 10.35),
           "phase first": (10.45, 10.45)}
  last = {"phase imports": (10.2, 10.2), "checks": (10.22, 10.221),
          "rendezvous": (10.221, 10.3), "phase init": (10.36, 10.36),
          "phase first": (10.5, 10.5)}
  row = bench_timeline.critical_path([first, last])
  assert row["to first psum"] == pytest.approx(300.0)
  assert row["rendezvous"] == pytest.approx(79.0)
  assert row["init path's imports"] == pytest.approx(20.0)
  assert row["after init"] == pytest.approx(140.0)
  assert row["client 0 last"] == 0.0
  assert bench_timeline.critical_path([last, first])["client 0 last"] == 1.0


# -- sizes, types and frames (docs/guides/architecture.md) -------------------------------

def _lines(path):
  return len(path.read_text().splitlines())


def test_no_module_outgrows_a_sitting():
  """A newcomer reads a module in one sitting: none over 600 lines but the
  data model's `layout.py` (DTensor's Mesh and Layout, kept as TF has them),
  and the heartbeat's package entry point is the wiring only."""
  big = {name: _lines(PACKAGE / name) for name in MODULES
         if name != "layout.py" and _lines(PACKAGE / name) > 600}
  assert not big, big
  assert _lines(PACKAGE / "heartbeat" / "__init__.py") < 150


# The modules that build or parse a frame another process reads: each layer
# has one (the floor's `_wire`, the start-up handshake's messages, the links'
# messages, the heartbeat's rows and outcomes, the launchers' node messages). `struct` elsewhere reads what the
# kernel or a file format hands over, never a frame of jdtensor's.
WIRE_MODULES = {"_wire.py", "runtime/handshake.py", "runtime/link_messages.py",
                "heartbeat/wire.py", "launcher/channels.py"}
KERNEL_AND_FILE_FORMATS = {"heartbeat/progress.py", "launcher/compile_cache.py"}


@pytest.mark.parametrize("module", MODULES)
def test_only_the_wire_modules_build_or_parse_frames(module):
  tree = ast.parse((PACKAGE / module).read_text())
  if module not in WIRE_MODULES | KERNEL_AND_FILE_FORMATS:
    assert "struct" not in set(_all_imports(tree)), module
  if module not in WIRE_MODULES:
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert not defined & {"to_frame", "from_frame", "to_wire", "from_wire", "row_frame",
                          "read_row_frame"}, module


def test_the_node_launchers_send_typed_messages():
  """The launchers' attempt messages (``ports``, ``go``, ``done``, ``next``,
  ``finish``) are `channels`' dataclasses: `nodes.py` writes none as a dict
  of its own (a field renamed on one side only would be read as missing)."""
  tree = ast.parse((PACKAGE / "launcher" / "nodes.py").read_text())
  literal = {k.value for n in ast.walk(tree) if isinstance(n, ast.Dict)
             for k in n.keys if isinstance(k, ast.Constant)}
  assert not literal & {"ports", "go", "done", "next", "finish"}, literal


def test_the_links_are_typed_without_exceptions():
  """Link messages are `link_messages`' dataclasses and the watcher a
  `LinkEvents`: nothing in the links needs a type checker silenced."""
  assert "type: ignore" not in (PACKAGE / "runtime" / "links.py").read_text()


BENCHMARKS = PACKAGE.parent / "benchmarks"


def test_the_benchmarks_are_a_package_without_path_edits():
  """Every benchmark runs as ``python -m benchmarks.<name>`` from the
  checkout's root and imports the checkout as it is: none edits sys.path."""
  edits = sorted(p.name for p in BENCHMARKS.glob("*.py")
                 if re.search(r"sys\.path\.(insert|append)|sys\.path *\+?=", p.read_text()))
  assert not edits, edits


def test_every_benchmark_runs_from_run_all_or_says_why_not():
  from benchmarks import run_all  # pylint: disable=g-import-not-at-top
  imported = set(_all_imports(ast.parse((BENCHMARKS / "run_all.py").read_text())))
  imported |= {f"benchmarks.{a.name}" for node in ast.walk(ast.parse(
      (BENCHMARKS / "run_all.py").read_text())) if isinstance(node, ast.ImportFrom)
               and node.module == "benchmarks" for a in node.names}
  names = {p.stem for p in BENCHMARKS.glob("*.py")
           if p.stem.startswith("bench_") or p.stem == "gpu_check"}
  missing = sorted(n for n in names
                   if f"benchmarks.{n}" not in imported and n not in run_all.STANDALONE)
  assert not missing, f"run {missing} from run_all.py or list them in STANDALONE"
  assert set(run_all.STANDALONE) <= names, set(run_all.STANDALONE) - names
