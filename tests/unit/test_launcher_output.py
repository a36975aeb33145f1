"""What the launcher shows of its clients' output, and its command line."""

import io
import time

from jdtensor import _supervisor, cli


def pump(lines):
  sup = _supervisor._Supervisor.__new__(_supervisor._Supervisor)
  sup.write_lock = __import__("threading").Lock()
  sink = io.StringIO()
  sup._pump(1, io.BytesIO("".join(lines).encode()), sink)
  return sink.getvalue()


GLOO = ("[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected "
        "peer ranks is : 1\n")


def test_gloo_notices_and_their_fragments_are_dropped():
  assert pump([GLOO, "\n", "5\n", "step 1\n"]) == "[client 1] step 1\n"


def test_empty_lines_of_the_program_are_kept():
  assert pump(["a\n", "\n", "7\n", "b\n"]) == (
      "[client 1] a\n[client 1] \n[client 1] 7\n[client 1] b\n")


def test_fragments_only_right_after_a_notice():
  class SlowPipe(io.BytesIO):
    empties = 0

    def readline(self, *args):
      line = super().readline(*args)
      if line == b"\n":
        self.empties += 1
        if self.empties == 2:  # Arrives after the fragment window.
          time.sleep(_supervisor._GLOO_FRAGMENT_SECONDS + 0.1)
      return line
  sup = _supervisor._Supervisor.__new__(_supervisor._Supervisor)
  sup.write_lock = __import__("threading").Lock()
  sink = io.StringIO()
  sup._pump(1, SlowPipe(("x\n" + GLOO + "\n" + "\n").encode()), sink)
  # The first empty line came within the window (dropped); the second after.
  assert sink.getvalue() == "[client 1] x\n[client 1] \n"


def test_help_lists_only_public_commands(capsys):
  try:
    cli.main(["--help"])
  except SystemExit:
    pass
  text = capsys.readouterr().out
  assert "{launch,demo,env}" in text
  assert "demo-client" not in text and "SUPPRESS" not in text
