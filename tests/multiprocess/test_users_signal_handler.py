"""The program's own SIGTERM handler: JAX's preemption notifier takes SIGTERM
in every jax.distributed run, so a handler installed before start-up never
runs. jdtensor says so once, at start-up, naming the handler and what to do
instead (docs/guides/preemption.md).
"""

import sys
import textwrap

import pytest

from tests.helpers import launch_clients

pytestmark = pytest.mark.multiprocess

SCRIPT = """
import signal
import jdtensor

def on_term(signum, frame):
  print("HANDLER RAN", flush=True)

if {install}:
  signal.signal(signal.SIGTERM, on_term)
jdtensor.initialize_accelerator_system("CPU")
print("READY", flush=True)
"""


@pytest.mark.parametrize("install", [True, False])
def test_a_sigterm_handler_that_jax_replaces_is_named_at_start_up(install, tmp_path):
  script = tmp_path / "train.py"
  script.write_text(textwrap.dedent(SCRIPT.format(install=install)))
  res, out, err, _ = launch_clients([sys.executable, str(script)], 2, timeout=60)
  assert res.exit_code == 0 and out.count("READY") == 2, (res.reason, err)
  said = [line for line in err.splitlines() if "SIGTERM handler" in line]
  if not install:
    assert said == [], said
    return
  assert len(said) == 2, err  # Once per client.
  for line in said:
    assert ("jdtensor: this program's SIGTERM handler (__main__.on_term) will not run: "
            "jax.distributed.initialize") in line, line
    assert "multihost_utils.reached_preemption_sync_point(step)" in line, line
