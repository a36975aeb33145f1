"""What the launcher shows of its clients' output, and its command line."""

import io
import time

from jdtensor import cli
from jdtensor.launcher import output
from jdtensor.launcher.output import Output, segments


def pump(lines):
  sink = io.StringIO()
  Output(sink, sink).pump(1, io.BytesIO("".join(lines).encode()), sink)
  return sink.getvalue()


GLOO = ("[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected "
        "peer ranks is : 1\n")


def test_gloo_notices_and_their_fragments_are_dropped():
  assert pump([GLOO, "\n", "5\n", "step 1\n"]) == "[client 1] step 1\n"


def test_empty_lines_of_the_program_are_kept():
  assert pump(["a\n", "\n", "7\n", "b\n"]) == (
      "[client 1] a\n[client 1] \n[client 1] 7\n[client 1] b\n")


def test_fragments_only_right_after_a_notice():
  class SlowPipe:
    """Gives its chunks one read at a time; the last after the fragment window."""

    def __init__(self, chunks):
      self.chunks = list(chunks)

    def read1(self, size):
      if len(self.chunks) == 1:
        time.sleep(output._GLOO_FRAGMENT_SECONDS + 0.1)
      return self.chunks.pop(0) if self.chunks else b""

    def close(self):
      pass
  sink = io.StringIO()
  Output(sink, sink).pump(1, SlowPipe([("x\n" + GLOO + "\n").encode(), b"\n"]), sink)
  # The first empty line came within the window (dropped); the second after.
  assert sink.getvalue() == "[client 1] x\n[client 1] \n"


def test_help_lists_only_public_commands(capsys):
  try:
    cli.main(["--help"])
  except SystemExit:
    pass
  text = capsys.readouterr().out
  assert "{launch,demo,env,status}" in text
  assert "demo-client" not in text and "SUPPRESS" not in text


def test_progress_updates_are_passed_on_as_they_come():
  """tqdm ends each update with a carriage return and no newline: each is
  shown at once (a terminal draws it over the last), CRLF is one line."""
  import os
  r, w = os.pipe()
  os.write(w, b"start\n 10%|#  |\r 20%|## |\r 30%|###|\r\nend\r\nlast")
  os.close(w)
  assert list(segments(os.fdopen(r, "rb"))) == [
      (b"start", "\n"), (b" 10%|#  |", "\r"), (b" 20%|## |", "\r"),
      (b" 30%|###|", "\n"), (b"end", "\n"), (b"last", "\n")]


def test_a_progress_bar_s_closing_newline_in_its_own_read_is_not_a_blank_line():
  import os
  import threading
  r, w = os.pipe()
  got = []
  reader = threading.Thread(target=lambda: got.extend(segments(os.fdopen(r, "rb"))))
  reader.start()
  os.write(w, b" 99%\r")
  import time
  time.sleep(0.2)  # The update arrives on its own.
  os.write(w, b"\ndone\n")
  os.close(w)
  reader.join(5)
  assert got == [(b" 99%", "\r"), (b"done", "\n")]
