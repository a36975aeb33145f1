"""The clients' output: read as it comes, tagged with its client, gloo's
notices dropped.

PURE of JAX: standard library only.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from jdtensor import _jaxlib_texts

__all__ = ["Output", "ClientLog", "say", "segments", "MAX_SEGMENT", "is_gloo_noise", "without_gloo_pieces"]

_GLOO_FRAGMENT_SECONDS = 0.5
_GLOO_NUMBER_SECONDS = 0.1


def is_gloo_noise(line: str) -> bool:
  """Whether `line` holds nothing but fragments of gloo's connection notice
  (`jdtensor._jaxlib_texts.GLOO_NOTICE`)."""
  return (bool(_jaxlib_texts.GLOO_NOTICE_MARKERS.search(line))
          and not _jaxlib_texts.GLOO_NOTICE_FRAGMENTS.sub("", line))


def without_gloo_pieces(line: str, in_notice: bool = False,
                        count: str | None = None) -> tuple[str, str]:
  """`line` without the pieces of gloo's notice that landed in it: as it
  reads if the number owed by its last label is the next line's, and as it
  reads if that number ends this line (the same but where that is unsure).

  gloo writes its notice in eight pieces from C++ threads into the stream
  the program prints to: "[Gloo] Rank ", r, " is connected to ", k,
  " peer ranks. ", "Expected number of connected peer ranks is : ", k and a
  newline. A line of the program's own (its text one write, its newline
  another) can carry some of them: ``[Gloo] Rank 3y: global (8, 8)``. A line
  is repaired when it holds one of the notice's own labels, or (`in_notice`:
  right after a notice) any of its pieces; ``server is connected to 3
  clients`` alone is the program's and is kept as it is.

  A label's number is written right after it, unless the program's text came
  between the two; then it ends the text before the next label, or, after
  the last label, either this line or (when the program's newline came
  first) the next one: the caller looks at the next line. Its width is k's
  (every rank is at most k), else one digit (or all of a number alone
  between two pieces). Only where the program's own
  text starts or ends with digits next to such a number, and k is unknown or
  the rank is shorter than k, can a digit of the program's be taken for
  gloo's. `count`: k where another line showed it.
  """
  if not (_jaxlib_texts.GLOO_NOTICE_LABELS.search(line)
          or in_notice and _jaxlib_texts.GLOO_NOTICE_MARKERS.search(line)):
    return line, line
  parts = _jaxlib_texts.GLOO_NOTICE_PIECES.split(line)
  texts, labels = parts[0::2], parts[1::2]
  # Which number each label is followed by: r, k, none, k.
  kinds = ["r" if "Rank" in label else "k" if label.endswith(("to ", ": ", ":")) else None
           for label in labels]
  count = next((m.group() for kind, text in zip(kinds, texts[1:])
                if kind == "k" and (m := re.match(r"\d+", text)) is not None), count)
  width = len(count) if count is not None else 1

  def number_at(text: str, end: bool, kind: str | None) -> int:
    """How many characters of gloo's number `text` starts (or ends) with."""
    digits = re.search(r"\d+\Z" if end else r"\A\d+", text)
    if digits is None:
      return 0
    if kind == "k" and count is not None:
      ends_with = digits.group().endswith if end else digits.group().startswith
      return len(count) if ends_with(count) else 0
    if count is None and digits.group() == text:
      return len(text)  # A number alone between two pieces: the whole of it.
    return min(len(digits.group()), width)

  owed: str | None = None  # The kind of number the text before a label ends with.
  for n, kind in enumerate(kinds, start=1):
    if owed is not None:
      texts[n - 1] = texts[n - 1][:len(texts[n - 1]) - number_at(texts[n - 1], True, owed)]
    owed = None
    if kind is not None:
      taken = number_at(texts[n], False, kind)
      texts[n] = texts[n][taken:]
      owed = kind if taken == 0 else None
  kept = "".join(texts)
  if owed is not None:
    texts[-1] = texts[-1][:len(texts[-1]) - number_at(texts[-1], True, owed)]
  return kept, "".join(texts)


# The longest piece of one line held for a client's stream: a longer line
# is passed on in pieces this long, so that the launcher's memory and time
# stay linear in the bytes, whatever the lines (a 100 MB line without a
# newline is 1,600 pieces, not one 100 MB string).
MAX_SEGMENT = 64 * 1024
_LINE_END = re.compile(rb"\r\n|\r|\n")


def _utf8_cut(buf: bytearray, start: int, end: int) -> int:
  """`end`, moved back to the start of a UTF-8 character cut by it (a piece
  of a long line decodes on its own)."""
  cut = end
  while cut > start + 1 and end - cut < 3 and buf[cut] & 0xC0 == 0x80:
    cut -= 1
  return cut if buf[cut] & 0xC0 != 0x80 else end


def segments(pipe: IO[bytes], max_segment: int = MAX_SEGMENT) -> Any:
  """A client's output as it comes: (text, end) for each line ended by a
  newline, and for each progress update ended by a carriage return
  (tqdm's ``\r``), which a terminal then draws over in place; a line longer
  than `max_segment` bytes comes in pieces, each but the last with end
  ``""``. Linear in the bytes: each byte is scanned once."""
  buf, after_cr = bytearray(), False
  while True:
    try:
      chunk = pipe.read1(65536)  # What has arrived, without waiting for more.
    except (OSError, ValueError):
      chunk = b""
    if not chunk:
      break
    scan = len(buf)  # Only the new bytes: what is held has no line end.
    buf += chunk
    start = 0
    while True:
      found = _LINE_END.search(buf, scan)
      if found is None:
        break
      text, mark = bytes(buf[start:found.start()]), found.group()[-1:]
      start = scan = found.end()
      if mark == b"\n" and not text and after_cr:
        after_cr = False  # The newline after a progress bar's last update.
        continue
      after_cr = mark == b"\r"
      yield text, mark.decode()
    while len(buf) - start > max_segment:
      cut = _utf8_cut(buf, start, start + max_segment)
      yield bytes(buf[start:cut]), ""
      start = cut
      after_cr = False
    del buf[:start]
  if buf:
    yield bytes(buf), "\n"
  pipe.close()


def say(stream: IO[str], text: str) -> None:
  """Writes one line of the launcher's own; a reader that is gone (a closed
  terminal after SIGHUP, a closed pipe) loses the line, and the launcher
  still stops its clients and cleans up."""
  try:
    stream.write(text + "\n")
    stream.flush()
  except (OSError, ValueError):
    pass


class ClientLog:
  """One client's log file (`jdtensor launch --log-dir`): its stdout and
  stderr as it wrote them, in the order they came; safe from both pumps.

  A write that fails (a full disk, a quota) loses the log, never the run:
  `failed` then says from when and why, `on_failure` is called once (the
  launcher says so on the console), and the pumps send what follows to the
  console.
  """

  def __init__(self, path: str, header: str,
               on_failure: Callable[[ClientLog], None] | None = None):
    self.path = path
    self._lock = threading.Lock()
    self.failed: str | None = None  # "from 12:00:01 (its error)" once a write failed.
    self._on_failure = on_failure
    self._file: IO[str] | None = None
    try:
      self._file = open(path, "a", encoding="utf-8", errors="replace")
    except OSError as e:
      self._fail(e)
      return
    self.write(header + "\n")

  def write(self, text: str) -> None:
    error = None
    with self._lock:
      if self._file is None:
        return
      try:
        self._file.write(text)
        self._file.flush()
      except OSError as e:
        error = e
        self._drop()
    if error is not None:
      self._fail(error)

  def _drop(self) -> None:
    file, self._file = self._file, None
    try:
      if file is not None:
        file.close()
    except OSError:
      pass  # What it still held is lost with the rest.

  def _fail(self, error: OSError) -> None:
    self.failed = (f"from {time.strftime('%H:%M:%S')} on "
                   f"({error.strerror or type(error).__name__})")
    if self._on_failure is not None:
      self._on_failure(self)

  def close(self) -> None:
    with self._lock:
      self._drop()


class Output:
  """Where every client's output goes: one lock for all, and whether the
  reader went away (`closed`)."""

  def __init__(self, out: IO[str], err: IO[str]):
    self.out, self.err = out, err
    self.write_lock = threading.Lock()
    self.last_output = 0.0  # Monotonic time of the last line written.
    self.closed = False  # Set when writing our output failed.

  def pump(self, client: int, pipe: IO[bytes], sink: IO[str] | None,
           log: ClientLog | None = None, fallback: IO[str] | None = None) -> None:
    """Copies one client's `pipe` to `sink` (None: nowhere), each line
    tagged with the client (a line longer than `MAX_SEGMENT` bytes as
    several), and to `log` as it came; once `log` cannot be written, to
    `fallback` where `sink` is None (``--log-only``: nothing is lost)."""
    prefix = f"[client {client}] "
    noise_until = 0.0  # Fragments of a gloo notice may follow it.
    # A repaired line (as it came, whether a notice came just before, its
    # end), written when the next line comes or after `_GLOO_NUMBER_SECONDS`
    # (gloo writes the rest of its notice at once): the next line may hold
    # the number its last label owes, or show k (the width of a number).
    held: list[tuple[str, bool, str, threading.Timer]] = []
    held_lock = threading.Lock()

    def release(next_line: str | None) -> None:
      with held_lock:  # Held while writing: the next line waits for it.
        if not held:
          return
        line, in_notice, end, timer = held.pop()
        timer.cancel()  # It would release the next held line early.
        rest = next_line if next_line is not None and is_gloo_noise(next_line) else ""
        number_was_next = next_line is not None and re.match(r"\d", next_line) is not None and (
            bool(rest) or _jaxlib_texts.GLOO_NOTICE_LEFTOVER.fullmatch(next_line) is not None)
        # The rest of the notice, if it came next, may show k (and so the
        # width of the numbers in this line), as may the number owed.
        count = re.search(r"(?:is connected to|is :) *(\d+)", rest) or (
            number_was_next and re.match(r"\s*(\d+)", next_line or ""))
        kept, stripped = without_gloo_pieces(line, in_notice,
                                             count.group(1) if count else None)
        self._write(sink, prefix + (kept if number_was_next else stripped) + end)

    try:
      for raw, end in segments(pipe):
        line = raw.decode(errors="replace")
        if log is not None:
          log.write(line + end)
          if sink is None and log.failed is not None:
            sink = fallback
        if sink is None:
          continue
        end = end or "\n"  # A piece of a long line: a tagged line of its own.
        release(line)
        if is_gloo_noise(line):
          noise_until = time.monotonic() + _GLOO_FRAGMENT_SECONDS
          continue
        in_notice = time.monotonic() < noise_until
        raw_line = line
        kept, stripped = without_gloo_pieces(line, in_notice)
        if kept != line or stripped != line:
          line = stripped
          noise_until = time.monotonic() + _GLOO_FRAGMENT_SECONDS
        # gloo's C++ threads write their notices piece by piece into the
        # same stream, so an empty line or a lone number right after one is
        # a fragment of it, not the program's output.
        if ((in_notice or line != raw_line)
            and _jaxlib_texts.GLOO_NOTICE_LEFTOVER.fullmatch(line)):
          continue
        if line != raw_line:  # Repaired: the next line may tell more.
          timer = threading.Timer(_GLOO_NUMBER_SECONDS, release, args=(None,))
          timer.daemon = True
          with held_lock:
            held.append((raw_line, in_notice, end, timer))
          timer.start()
          continue
        self._write(sink, prefix + line + end)
    finally:
      release(None)

  def _write(self, sink: IO[str], text: str) -> None:
    if self.closed:
      return  # Keep draining, so that no client blocks on a full pipe.
    with self.write_lock:
      try:
        sink.write(text)
        sink.flush()
      except (BrokenPipeError, ValueError, OSError):
        # Our reader is gone (`jdtensor launch ... | head -1`): the run is
        # stopped, as torchrun and mpirun do.
        self.closed = True
      self.last_output = time.monotonic()

  def line(self, text: str) -> None:
    """Writes one line of the launcher's own to `err` (see `say`)."""
    with self.write_lock:
      say(self.err, text)
