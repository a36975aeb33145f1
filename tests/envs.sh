#!/usr/bin/env bash
# The suite's two other environments, each in its own throw-away virtual
# environment (the README's test command runs this after the main suite):
#
# 1. The oldest supported JAX (the lower end of pyproject.toml's pin, also
#    `runtime/jax_private.TESTED_RANGE`): the pure, single-process and start-up
#    tests, and the multi-client tests that touch each private JAX symbol
#    (start-up, the heartbeat on the liveness links, failure verdicts,
#    JAX's own view). The full suite passes there too (measured; see CONTRIBUTING.md,
#    "Supported JAX versions"), but twice the full suite would not fit CI's
#    30 minutes on 2 cores.
# 2. The integration extra (flax, optax, orbax, Keras 3, grain: never
#    jdtensor's dependencies): tests/integration, and test_invisible.py's
#    orbax checkpoint test.
# 3. The docs extra (Sphinx, MyST, the theme): the documentation site built
#    with warnings as errors (a broken link, a missing include, a docstring
#    Sphinx cannot read fail it). The examples the pages show run in the
#    main suite (tests/test_docs.py).
#
# Usage: bash tests/other_envs.sh [oldest|integration|docs]... (default: all three).
set -euo pipefail
cd "$(dirname "$0")/.."
OLDEST_JAX=$(python - <<'EOF'
import re
text = open("pyproject.toml").read()
print(re.search(r'"jax>=([0-9.]+),', text).group(1))
EOF
)
ROOT="${JDTENSOR_ENVS_DIR:-${TMPDIR:-/tmp}/jdtensor-envs}"
mkdir -p "$ROOT"

make_env() {  # make_env NAME PIP-ARGS...: a fresh venv with jdtensor in it.
  local venv="$ROOT/$1"; shift
  rm -rf "$venv"
  python -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$@" 2>&1 \
    | grep -v -e "^WARNING: Location" -e "^WARNING: Running pip as" || true
  "$venv/bin/python" -c "import jdtensor" >/dev/null
}

run_oldest() {
  local start=$SECONDS
  echo "+ the oldest supported JAX: jax==$OLDEST_JAX"
  make_env "jax-$OLDEST_JAX" "jax==$OLDEST_JAX" "jaxlib==$OLDEST_JAX" -e '.[test]'
  "$ROOT/jax-$OLDEST_JAX/bin/python" -c \
    "import jax; from jdtensor.runtime import jax_private as p; assert not p.MISSING, p.MISSING; print('jax', jax.__version__, '- all private symbols found')"
  "$ROOT/jax-$OLDEST_JAX/bin/python" -m pytest -q -p no:cacheprovider \
    tests/unit tests/jax_single tests/test_architecture.py \
    tests/multiprocess/test_multi_client.py tests/multiprocess/test_invisible.py \
    tests/multiprocess/test_failure_modes.py tests/multiprocess/test_device_count.py \
    tests/multiprocess/test_heartbeat.py tests/multiprocess/test_jaxlib_texts.py
  echo "+ oldest JAX: $((SECONDS - start)) s"
}

run_integration() {
  local start=$SECONDS
  echo "+ the integration extra (flax, optax, orbax, Keras 3, grain)"
  make_env integration -e '.[test,integration]'
  KERAS_BACKEND=jax "$ROOT/integration/bin/python" -m pytest -q -p no:cacheprovider \
    tests/integration "tests/multiprocess/test_invisible.py::test_orbax_checkpoint_manager_beside_the_heartbeat"
  echo "+ integration: $((SECONDS - start)) s"
}

run_docs() {
  local start=$SECONDS
  echo "+ the docs extra: sphinx-build -W (warnings are errors)"
  make_env docs -e '.[docs]'
  rm -rf "$ROOT/docs-html"
  "$ROOT/docs/bin/sphinx-build" -W --keep-going -q -b html docs "$ROOT/docs-html"
  echo "+ docs: built in $ROOT/docs-html, $((SECONDS - start)) s"
}

for part in "${@:-oldest integration docs}"; do
  for p in $part; do
    case "$p" in
      oldest) run_oldest ;;
      integration) run_integration ;;
      docs) run_docs ;;
      *) echo "tests/other_envs.sh: unknown part '$p' (oldest, integration, docs)" >&2; exit 2 ;;
    esac
  done
done
