"""The clients' output: read as it comes, tagged with its client, gloo's
notices dropped.

PURE of JAX: standard library only.
"""

from __future__ import annotations

import threading
import time
from typing import IO, Any

from jdtensor import _jaxlib_texts

__all__ = ["Output", "segments", "is_gloo_noise"]

_GLOO_FRAGMENT_SECONDS = 0.5


def is_gloo_noise(line: str) -> bool:
  """Whether `line` holds nothing but fragments of gloo's connection notice
  (`jdtensor._jaxlib_texts.GLOO_NOTICE`)."""
  return (bool(_jaxlib_texts.GLOO_NOTICE_MARKERS.search(line))
          and not _jaxlib_texts.GLOO_NOTICE_FRAGMENTS.sub("", line))


def segments(pipe: IO[bytes]) -> Any:
  """A client's output as it comes: (text, end) for each line ended by a
  newline, and for each progress update ended by a carriage return
  (tqdm's ``\r``), which a terminal then draws over in place."""
  buf, after_cr = b"", False
  while True:
    try:
      chunk = pipe.read1(65536)  # What has arrived, without waiting for more.
    except (OSError, ValueError):
      chunk = b""
    if not chunk:
      break
    buf += chunk
    while True:
      cut = min((i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0), default=-1)
      if cut < 0:
        break
      text, mark, buf = buf[:cut], buf[cut:cut + 1], buf[cut + 1:]
      if mark == b"\r" and buf.startswith(b"\n"):
        mark, buf = b"\n", buf[1:]  # CRLF: one line.
      if mark == b"\n" and not text and after_cr:
        after_cr = False  # The newline after a progress bar's last update.
        continue
      after_cr = mark == b"\r"
      yield text, mark.decode()
  if buf:
    yield buf, "\n"
  pipe.close()


class Output:
  """Where every client's output goes: one lock for all, and whether the
  reader went away (`closed`)."""

  def __init__(self, out: IO[str], err: IO[str]):
    self.out, self.err = out, err
    self.write_lock = threading.Lock()
    self.last_output = 0.0  # Monotonic time of the last line written.
    self.closed = False  # Set when writing our output failed.

  def pump(self, client: int, pipe: IO[bytes], sink: IO[str]) -> None:
    """Copies one client's `pipe` to `sink`, each line tagged with the client."""
    prefix = f"[client {client}] "
    noise_until = 0.0  # Fragments of a gloo notice may follow it.
    for raw, end in segments(pipe):
      line = raw.decode(errors="replace")
      if is_gloo_noise(line):
        noise_until = time.monotonic() + _GLOO_FRAGMENT_SECONDS
        continue
      # gloo's C++ threads write their notices byte by byte into the same
      # stream, so an empty line or a lone number right after one is a
      # fragment of it, not the program's output.
      if (time.monotonic() < noise_until
          and _jaxlib_texts.GLOO_NOTICE_LEFTOVER.fullmatch(line)):
        continue
      if self.closed:
        continue  # Keep draining, so that no client blocks on a full pipe.
      with self.write_lock:
        try:
          sink.write(prefix + line + end)
          sink.flush()
        except (BrokenPipeError, ValueError, OSError):
          # Our reader is gone (`jdtensor launch ... | head -1`): the run is
          # stopped, as torchrun and mpirun do.
          self.closed = True
        self.last_output = time.monotonic()

  def line(self, text: str) -> None:
    """Writes one line of the launcher's own to `err`."""
    with self.write_lock:
      self.err.write(text + "\n")
      self.err.flush()
