"""What the launcher shows of its clients' output (`jdtensor.launcher.output`)."""

import io
import time

import pytest

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


def notice(rank, count):
  """gloo's notice as it is written, one write each (strace of a client)."""
  return ["[Gloo] Rank ", rank, " is connected to ", count, " peer ranks. ",
          "Expected number of connected peer ranks is : ", count, "\n"]


USER = "y: global (8, 8), sum 1024.0"  # print() writes it, then its newline.


@pytest.mark.parametrize("rank, count", [("3", "3"), ("12", "15"), ("0", "1")])
def test_the_program_s_line_is_whole_wherever_gloo_s_notice_lands_in_it(rank, count):
  """Seen in CI: ``[client 3] [Gloo] Rank 3y: global (8, 8), ...``. Every
  place of the program's two writes among the notice's eight."""
  pieces = notice(rank, count)
  for text_at in range(len(pieces) + 1):
    for newline_at in range(text_at, len(pieces) + 1):
      written = pieces[:]
      written.insert(newline_at, "\n")
      written.insert(text_at, USER)
      assert pump(written) == f"[client 1] {USER}\n", written


@pytest.mark.parametrize("line, repaired", [
    ("[Gloo] Rank 3y: global (8, 8)", "y: global (8, 8)"),
    ("loss 0.5[Gloo] Rank 12 is connected to 15 peer ranks. ", "loss 0.5"),
    ("step 3Expected number of connected peer ranks is : 3", "step 3"),
    # Only the notice's own labels mark a line of the program's as carrying it.
    ("server is connected to 3 clients", "server is connected to 3 clients"),
    ("2 peer ranks. done", "2 peer ranks. done"),
    ("[Gloo] is a library", "[Gloo] is a library"),
])
def test_only_gloo_s_pieces_are_taken_out_of_a_line(line, repaired):
  assert output.without_gloo_pieces(line) == (repaired, repaired)


def test_a_number_owed_at_the_end_of_a_line_may_be_the_next_line_s():
  """``[Gloo] Rank `` then the program's text: the rank came either before
  the program's newline or after it (then a lone number follows)."""
  assert output.without_gloo_pieces("[Gloo] Rank loss 0.53") == ("loss 0.53", "loss 0.5")
  assert pump(["[Gloo] Rank ", "loss 0.5", "3", "\n"]) == "[client 1] loss 0.5\n"
  assert pump(["[Gloo] Rank ", "loss 0.5", "\n", "3", "\n"]) == "[client 1] loss 0.5\n"
  assert pump(["[Gloo] Rank ", "loss 0.53", "\n", "next\n"]) == (
      "[client 1] loss 0.5\n[client 1] next\n")


def test_right_after_a_notice_any_of_its_pieces_is_taken_out():
  assert output.without_gloo_pieces(" is connected to 3step 2", in_notice=True) == (
      "step 2", "step 2")
  assert pump(["[Gloo] Rank 1\n", "server is connected to 3 clients\n"]) == (
      "[client 1] server clients\n")  # Within the notice's half second: its pieces.
  assert pump(["server is connected to 3 clients\n"]) == (
      "[client 1] server is connected to 3 clients\n")


def test_a_repaired_line_is_shown_soon_when_nothing_follows_it():
  """A repaired line waits for the next one (which may hold its number) for
  a tenth of a second at most: a program that then computes for minutes
  shows its line at once, and in order."""
  sink = io.StringIO()
  seen = []

  class QuietPipe:
    def __init__(self):
      self.chunks = [b"[Gloo] Rank 3y: global\n", b"after\n"]

    def read1(self, size):
      if len(self.chunks) == 1:
        time.sleep(output._GLOO_NUMBER_SECONDS + 0.3)  # The program computes.
        seen.append(sink.getvalue())
      return self.chunks.pop(0) if self.chunks else b""

    def close(self):
      pass
  Output(sink, sink).pump(1, QuietPipe(), sink)
  assert seen == ["[client 1] y: global\n"]
  assert sink.getvalue() == "[client 1] y: global\n[client 1] after\n"


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
