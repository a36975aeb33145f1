"""A client's text is only ever shown: terminal control sequences in an
exception's message (a window title, a screen clear, NUL) come out escaped
in the launcher's summary and in every survivor's heartbeat line."""

import sys
import textwrap

import pytest

from tests.helpers import launch_clients

pytestmark = pytest.mark.multiprocess

SCRIPT = """
import time
import jdtensor
import jax
jdtensor.initialize_accelerator_system("CPU")
if jax.process_index() == 1:
  time.sleep(1)
  raise RuntimeError("bad \\x1b]0;TITLE\\x07 \\x1b[2J nul\\x00 end")
time.sleep(30)
"""
SHOWN = r"RuntimeError: bad \x1b]0;TITLE\x07 \x1b[2J nul\x00 end"


def test_control_sequences_in_a_clients_text_are_shown_escaped(tmp_path):
  script = tmp_path / "train.py"
  script.write_text(textwrap.dedent(SCRIPT))
  res, out, err, _ = launch_clients([sys.executable, str(script)], 3, timeout=60)
  assert res.first_failure == 1, (res.reason, err)
  assert SHOWN in res.reason, res.reason
  for c in (0, 2):  # Every survivor's heartbeat line.
    lines = [line for line in err.splitlines() if line.startswith(f"[client {c}] heartbeat:")]
    assert any(SHOWN in line for line in lines), err
  launcher_lines = [line for line in err.splitlines() if line.startswith("jdtensor launch")]
  assert not any(ch in line for line in launcher_lines for ch in "\x1b\x00\x07"), err
