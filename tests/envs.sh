#!/usr/bin/env bash
# The whole suite, each part in its own throw-away virtual environment, so
# that CI tests both ends of the supported range (pyproject.toml's pin, also
# `runtime/jax_private.TESTED_RANGE`) and the Pythons between them. The
# README's test command is `bash tests/envs.sh`; `.ci/run` runs it.
#
# 1. newest: the main suite (`python -m pytest -q`, every test) on the newest
#    Python with the newest JAX: Python 3.13, the newest jax/jaxlib release
#    that pyproject.toml's pin allows (pip resolves it: no pin of our own to
#    fall behind a release).
# 2. oldest: the oldest JAX, $OLDEST_JAX, on Python 3.11 (the default python
#    here; JAX dropped 3.11 with 0.11): the pure, single-process and start-up
#    tests, and the multi-client tests that touch each private JAX symbol or
#    depend on the Python version (start-up, the heartbeat on the liveness
#    links, failure verdicts, no false kill and forked workers, JAX's own
#    view, the launcher, jdtensor.testing).
#    The full suite passes there too (measured; see CONTRIBUTING.md,
#    "Supported JAX versions"), but twice the full suite would not fit CI's
#    30 minutes on 2 cores.
# 3. py312: the Python between the two ends, 3.12, with jax/jaxlib $MIDDLE_JAX:
#    the single-process tests and the multi-client tests whose outcome depends
#    on the Python version or on how a client ends (the oldest part's list,
#    and the waiting matrix: every way a script ends, at any moment of a
#    beat; the simplest program ended each way, a program on a worker thread,
#    a deadlock: helper threads and exits are what 3.12 changed), in about
#    15 minutes; the rest of tests/multiprocess (the
#    engines, nodes, recovery, pod scale, GPU nodes, traces: the launcher's
#    own work, the same on every Python) would double it.
# 4. integration: flax, optax, orbax, Keras 3 and grain (never jdtensor's
#    dependencies) on Python 3.12 with jax/jaxlib $MIDDLE_JAX: tests/integration,
#    and test_invisible.py's orbax checkpoint test.
# 5. docs: the documentation site built with warnings as errors (a broken
#    link, a missing include, a docstring Sphinx cannot read fail it). The
#    examples the pages show run in the main suite (tests/test_docs.py).
#
# An interpreter that is missing is said in the output (a NOTE line), and the
# part runs on the default python instead. Every part runs even when one
# before it failed; the last lines say each part's result, and the exit code
# is non-zero when any part failed.
#
# Usage: bash tests/envs.sh [newest|oldest|py312|integration|docs]... (default: all five).
set -euo pipefail
cd "$(dirname "$0")/.."
MIDDLE_JAX=0.11.2
OLDEST_JAX=$(python3 - <<'PY'
import re
text = open("pyproject.toml").read()
print(re.search(r'"jax>=([0-9.]+),', text).group(1))
PY
)
ROOT="${JDTENSOR_ENVS_DIR:-${TMPDIR:-/tmp}/jdtensor-envs}"
mkdir -p "$ROOT"

find_python() {  # find_python 3.13: a working interpreter of that version, or nothing.
  local version=$1 candidate
  # On PATH: a pyenv shim is there even when its version is not selected,
  # and then fails; only one that runs counts.
  if candidate=$(command -v "python$version") && "$candidate" -c "" 2>/dev/null; then
    echo "$candidate"; return
  fi
  if command -v pyenv >/dev/null 2>&1; then
    local installed
    installed=$(pyenv versions --bare 2>/dev/null | grep -E "^${version//./\\.}(\.[0-9]+)?$" \
                | sort -V | tail -n 1 || true)
    if [ -n "$installed" ] && candidate=$(PYENV_VERSION=$installed pyenv which "python$version" \
                                           2>/dev/null) && [ -x "$candidate" ]; then
      echo "$candidate"; return
    fi
  fi
  for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version"*/bin/"python$version" \
                   /usr/local/bin/"python$version" /usr/bin/"python$version"; do
    if [ -x "$candidate" ]; then echo "$candidate"; return; fi
  done
}

interpreter() {  # interpreter 3.13 PART: that Python, or the default with a NOTE.
  local found
  found=$(find_python "$1")
  if [ -n "$found" ]; then echo "$found"; return; fi
  echo "NOTE: tests/envs.sh $2: no Python $1 found (python$1 on PATH, pyenv, /usr/bin);" \
       "running on the default $(python3 --version 2>&1) instead: Python $1 is NOT tested." >&2
  command -v python3
}

make_env() {  # make_env NAME PYTHON EXTRAS PINS...: a fresh venv with jdtensor in it.
  local venv="$ROOT/$1" python=$2 extras=$3; shift 3
  rm -rf "$venv"
  "$python" -m venv "$venv"
  # jdtensor's dependencies (and the extras') first: several environments are
  # built at once, and only this step is long.
  local deps
  mapfile -t deps < <(python3 - "$extras" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = project["dependencies"] + [
    dep for extra in sys.argv[1].split(",") if extra
    for dep in project["optional-dependencies"][extra]]
print("\n".join(wanted))
PY
)
  pip_install "$venv" "$@" "${deps[@]}"
  # Then jdtensor itself, editable, one environment at a time (setuptools
  # writes jdtensor.egg-info into the checkout), as a user installs it beside
  # the JAX they have: `say_versions` checks that JAX was kept.
  flock "$ROOT/.editable.lock" "$venv/bin/pip" install -q --disable-pip-version-check \
    -e ".[$extras]" >"$venv.editable.log" 2>&1 || { cat "$venv.editable.log"; return 1; }
  "$venv/bin/python" -c "import jdtensor" >/dev/null
}

pip_install() {  # pip_install VENV ARGS...: a failed install fails the part.
  local venv=$1; shift
  if ! "$venv/bin/pip" install -q --disable-pip-version-check "$@" >"$venv.pip.log" 2>&1; then
    cat "$venv.pip.log"; return 1
  fi
  grep -v -e "^WARNING: Location" -e "^WARNING: Running pip as" "$venv.pip.log" || true
}

jax_pins() {  # jax_pins VERSION PYTHON: pins JAX where that Python can have it.
  if "$2" -c "import sys; sys.exit(sys.version_info < (3, 12))"; then
    echo "jax==$1 jaxlib==$1"
  else  # JAX >= 0.11 needs Python >= 3.12: the newest JAX this Python can have.
    echo "NOTE: tests/envs.sh: jax $1 needs Python 3.12 or newer; $("$2" --version 2>&1)" \
         "gets the newest JAX it can have instead." >&2
  fi
}

build_env() {  # build_env PART: that part's venv (run in the background, see below).
  local python
  case "$1" in
    newest) python=$(interpreter 3.13 newest)
            # shellcheck disable=SC2046
            make_env newest "$python" test --upgrade ;;
    oldest) python=$(interpreter 3.11 oldest)
            make_env oldest "$python" test "jax==$OLDEST_JAX" "jaxlib==$OLDEST_JAX" ;;
    py312) python=$(interpreter 3.12 py312)
            # shellcheck disable=SC2046
            make_env py312 "$python" test $(jax_pins "$MIDDLE_JAX" "$python") ;;
    integration) python=$(interpreter 3.12 integration)
            # shellcheck disable=SC2046
            make_env integration "$python" test,integration \
              $(jax_pins "$MIDDLE_JAX" "$python") ;;
    docs) make_env docs "$(command -v python3)" docs ;;
  esac
}

say_versions() {  # say_versions VENV [JAX]: the Python and JAX it tests (that JAX,
                 # kept by jdtensor's install where its Python can have it).
  "$1/bin/python" - "${2:-}" <<'PY'
import sys
import jax
from jdtensor.runtime import jax_private as p
assert not p.MISSING, p.MISSING
wanted = sys.argv[1]
if wanted == "newest":  # jax and jaxlib of one release.
  assert jax.__version__ == p.JAXLIB_VERSION, (jax.__version__, p.JAXLIB_VERSION)
elif wanted and (sys.version_info >= (3, 12) or wanted.startswith(("0.9.", "0.10."))):
  assert (jax.__version__, p.JAXLIB_VERSION) == (wanted, wanted), (jax.__version__, wanted)
print("+ Python", sys.version.split()[0], "+ jax", jax.__version__,
      "- all private symbols found")
PY
}

run_newest() {
  echo "+ newest: the main suite on the newest Python and the newest JAX the pin allows"
  say_versions "$ROOT/newest" newest
  "$ROOT/newest/bin/python" -m pytest -q -p no:cacheprovider
}

# The multi-client tests that touch each private JAX symbol or depend on the
# Python version (the oldest part runs them; py312 too).
VERSIONED=(
    tests/multiprocess/test_multi_client.py tests/multiprocess/test_invisible.py \
    tests/multiprocess/test_failure_modes.py tests/multiprocess/test_device_count.py \
    tests/multiprocess/test_heartbeat.py tests/multiprocess/test_jaxlib_texts.py \
    tests/multiprocess/test_launcher.py tests/multiprocess/test_testing.py \
    "tests/multiprocess/test_hang_triage.py::test_every_clients_stack_is_under_the_verdict" \
    tests/multiprocess/test_no_false_kill.py tests/multiprocess/test_forked_worker.py \
    tests/multiprocess/test_users_signal_handler.py tests/multiprocess/test_client_text.py \
    tests/multiprocess/test_log_dir_full.py tests/multiprocess/test_warm_clusters.py \
    "tests/multiprocess/test_recovery.py::test_a_one_client_cpu_runs_restart_loads_its_step_from_the_cache" \
    tests/multiprocess/test_clean_end.py tests/multiprocess/test_worker_thread.py \
    tests/multiprocess/test_deadlock.py tests/unit/test_threads.py
)

run_oldest() {
  echo "+ oldest: the oldest supported JAX, jax==$OLDEST_JAX"
  say_versions "$ROOT/oldest" "$OLDEST_JAX"
  "$ROOT/oldest/bin/python" -m pytest -q -p no:cacheprovider \
    tests/unit tests/jax_single tests/test_architecture.py "${VERSIONED[@]}"
}

run_py312() {
  echo "+ py312: Python 3.12 (jax $MIDDLE_JAX): the single-process tests, the versioned multi-client tests and the waiting matrix"
  say_versions "$ROOT/py312" "$MIDDLE_JAX"
  "$ROOT/py312/bin/python" -m pytest -q -p no:cacheprovider \
    tests/jax_single "${VERSIONED[@]}" tests/multiprocess/test_waiting.py
}

run_integration() {
  echo "+ integration: flax, optax, orbax, Keras 3, grain (jax $MIDDLE_JAX)"
  say_versions "$ROOT/integration" "$MIDDLE_JAX"
  KERAS_BACKEND=jax "$ROOT/integration/bin/python" -m pytest -q -p no:cacheprovider \
    tests/integration "tests/multiprocess/test_invisible.py::test_orbax_checkpoint_manager_beside_the_heartbeat" \
    "tests/test_docs.py::test_every_example_runs_as_its_page_says[restart_orbax.py]"
}

run_docs() {
  echo "+ docs: sphinx-build -W (warnings are errors)"
  rm -rf "$ROOT/docs-html"
  "$ROOT/docs/bin/sphinx-build" -W --keep-going -q -b html docs "$ROOT/docs-html"
  echo "+ docs: built in $ROOT/docs-html"
}

parts=()
for part in "${@:-newest oldest py312 integration docs}"; do
  for p in $part; do
    case "$p" in
      newest|oldest|py312|integration|docs) parts+=("$p") ;;
      *) echo "tests/envs.sh: unknown part '$p' (newest, oldest, py312, integration, docs)" >&2; exit 2 ;;
    esac
  done
done

# Every part's environment first, all at once: installing is mostly waiting
# on the network and the disk, and no test runs beside it (the multi-client
# tests' timings are measured on an otherwise idle machine).
start=$SECONDS
echo "+ building the environments of: ${parts[*]} (in $ROOT)"
pids=()
for p in "${parts[@]}"; do
  build_env "$p" >"$ROOT/$p.build.log" 2>&1 &
  pids+=($!)
done
declare -A result
for i in "${!parts[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "tests/envs.sh: building the ${parts[$i]} environment failed:" >&2
    cat "$ROOT/${parts[$i]}.build.log" >&2
    result[${parts[$i]}]="FAILED (its environment could not be built)"
  else
    grep -e "^NOTE" "$ROOT/${parts[$i]}.build.log" || true  # An interpreter missing.
  fi
done
echo "+ environments built in $((SECONDS - start)) s"

# Every part runs, whatever the parts before it did (each in a subshell of
# its own with -e, so that its first failing command ends it alone).
for p in "${parts[@]}"; do
  [ -z "${result[$p]:-}" ] || continue
  start=$SECONDS
  set +e
  ( set -e; "run_$p" )
  code=$?
  set -e
  if [ "$code" = 0 ]; then
    result[$p]="passed in $((SECONDS - start)) s"
  else
    result[$p]="FAILED (exit code $code) in $((SECONDS - start)) s"
  fi
  echo "+ $p: ${result[$p]}"
done

echo "+ tests/envs.sh: every part's result"
failed=0
for p in "${parts[@]}"; do
  echo "+   $p: ${result[$p]}"
  case "${result[$p]}" in FAILED*) failed=1 ;; esac
done
exit "$failed"
