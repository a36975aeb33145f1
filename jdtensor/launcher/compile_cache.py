"""One JAX persistent compilation cache for all the attempts of a run.

PURE of JAX: the launcher only makes a folder and names it in the clients'
environment; JAX in each client does the caching. Under ``jdtensor launch
--max-restarts K`` an attempt after a failure would otherwise compile every
program again (minutes on real models, for every failure): with the cache,
the next attempt reads what the last one compiled.

What JAX does, and what that means here (jax 0.9 to 0.12):

* Only the client whose JAX process id is 0 writes entries; on GPU and TPU
  every client reads them (JAX's documented multi-process use). A node's
  clients share its folder; the other nodes' launchers have their own, which
  node 0's launcher fills before each restart (`new_entries`, `receive`), so
  that every node's clients find client 0's programs (a client that
  compiles while the others load would hold them all up at the step's first
  collective).
* On CPU, JAX keys a program by its process: only client 0 would ever load
  one, and with jax 0.12 one loaded beside the others' fresh compilations
  hangs in its first collective (`CPU_REASON`). A CPU run of several
  clients shares no cache between its attempts, and the launcher says so;
  a CPU run of one client does share it.
* An entry is written in place, not renamed into place: a client killed
  while it writes leaves a truncated file, which JAX then fails to read on
  every later attempt (a warning each time) and never writes again (it
  exists). `CompileCache.drop_incomplete` removes such entries from the
  launcher's own folder between attempts (a folder of the user's is left as
  it is): an entry is one compressed stream (zlib, or zstd where JAX has
  it), complete or not by its own framing.
* JAX writes only programs that took at least
  ``jax_persistent_cache_min_compile_time_secs`` to compile (1 s by default):
  `MIN_COMPILE_SECONDS` here, so that a training step's programs are kept,
  unless the user set their own.
"""

from __future__ import annotations

import base64
import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jdtensor import _env, _status

__all__ = ["CompileCache", "plan", "entry_complete", "new_entries", "receive",
           "MIN_COMPILE_SECONDS"]

# Programs that take longer than this to compile are kept. JAX's default (1 s)
# leaves out the step of a small model, whose recompilation still costs every
# client its first step after a restart; writing an entry costs the writer a
# few milliseconds, once.
MIN_COMPILE_SECONDS = 0.1
ENTRY_SUFFIX = "-cache"  # JAX's `lru_cache._CACHE_SUFFIX`.
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_READ_CHUNK = 1 << 20
# Why the attempts of a CPU run share no cache (measured with jax 0.9.2 and
# 0.12.1, raw jax.distributed and gloo: benchmarks/RESULTS.md, "Time to
# recovery after a failure"):
# JAX keys a CPU program by its process (its local devices and compile
# options differ), and only process 0 writes; so only client 0 ever loads
# one, and with jax 0.12 a program loaded from the cache beside the others'
# fresh compilations never completes its first cross-client collective.
CPU_REASON = ("JAX caches a CPU program for its own process only (only client 0 "
              "would load one, and with jax 0.12 one loaded beside the others' fresh "
              "compilations hangs in its first collective)")
# Bytes of an entry in one frame between launchers (base64 in a JSON frame
# of at most `jdtensor._wire.MAX_FRAME`).
SHIP_CHUNK = 32 * 1024


@dataclass
class CompileCache:
  """The cache a run's attempts share.

  Attributes:
    folder: Where the entries are.
    owned: Whether the launcher made `folder` (and removes it at the end);
      False for the user's own ``JAX_COMPILATION_CACHE_DIR``, left in place.
    env: What the clients' environment gets (nothing for the user's own).
    record: Where the launcher's own folder is recorded while it exists
      (`jdtensor._status.track_folder`: a later launch removes it if this
      launcher is killed before it does).
  """
  folder: str
  owned: bool
  env: dict[str, str] = field(default_factory=dict)
  record: str | None = None

  def line(self) -> str:
    """The launcher's one line about it."""
    if not self.owned:
      return (f"jdtensor launch: restarts reuse compiled programs: JAX's compilation "
              f"cache in {self.folder} (your {_env.JAX_COMPILATION_CACHE_DIR}, left "
              "in place)")
    return (f"jdtensor launch: restarts reuse compiled programs: JAX's compilation "
            f"cache in {self.folder} (removed at the end; --no-compile-cache or "
            f"{_env.JDTENSOR_COMPILE_CACHE}=false turns it off)")

  def drop_incomplete(self, since: float) -> list[str]:
    """Removes the entries written since `since` (``time.time()``) that are
    cut short (their writer was killed); returns their names. Run between
    attempts, when no client writes."""
    dropped = []
    try:
      names = os.listdir(self.folder)
    except OSError:
      return dropped
    for name in names:
      if not name.endswith(ENTRY_SUFFIX):
        continue
      path = os.path.join(self.folder, name)
      try:
        if os.stat(path).st_mtime < since - 1.0:
          continue  # Checked after the attempt that wrote it.
        if entry_complete(path):
          continue
        os.unlink(path)
      except OSError:
        continue
      dropped.append(name)
    return dropped

  def remove(self) -> None:
    """The end of the run: the launcher's own folder goes."""
    if self.owned:
      shutil.rmtree(self.folder, ignore_errors=True)
      _status.forget_folder(self.record)
      self.record = None


def new_entries(cache: CompileCache, shipped: set[str]
                ) -> Iterator[tuple[str, Iterator[dict[str, Any]]]]:
  """Node 0: the entries not yet in `shipped`, each as (name, the frames
  that carry it to the other nodes' launchers: `receive`)."""
  try:
    names = sorted(n for n in os.listdir(cache.folder)
                   if n.endswith(ENTRY_SUFFIX) and n not in shipped)
  except OSError:
    return
  for name in names:
    yield name, _frames(os.path.join(cache.folder, name), name)


def _frames(path: str, name: str) -> Iterator[dict[str, Any]]:
  try:
    with open(path, "rb") as f:
      offset = 0
      while True:
        chunk = f.read(SHIP_CHUNK)
        last = len(chunk) < SHIP_CHUNK
        yield {"n": name, "o": offset, "d": base64.b64encode(chunk).decode(), "e": last}
        offset += len(chunk)
        if last:
          return
  except OSError:
    return  # Gone (removed as incomplete): the receiver keeps no part of it.


def receive(cache: CompileCache, frame: dict[str, Any]) -> None:
  """Node R: one frame of an entry node 0 ships (`new_entries`), written
  beside the entries and renamed into place whole, so that a client never
  reads part of one. A malformed frame is ignored (the entry is then
  compiled, as without the cache)."""
  try:
    name, offset, data, last = (str(frame["n"]), int(frame["o"]),
                                base64.b64decode(frame["d"]), bool(frame["e"]))
  except (KeyError, TypeError, ValueError):
    return
  if (not name.endswith(ENTRY_SUFFIX) or os.sep in name or name.startswith(".")
      or (os.altsep and os.altsep in name)):
    return
  partial = os.path.join(cache.folder, f".{name}.partial")
  try:
    with open(partial, "r+b" if offset else "wb") as f:
      f.seek(offset)
      f.write(data)
    if last:
      os.replace(partial, os.path.join(cache.folder, name))
  except OSError:
    try:
      os.unlink(partial)
    except OSError:
      pass


def plan(enabled: bool, max_restarts: int, device_type: str,
         env: Mapping[str, str], clients: int | None = None
         ) -> tuple[CompileCache | None, str]:
  """The run's cache, and the launcher's one line about it ('' for none).

  None where there is nothing to reuse (no restarts), where it is off
  (`enabled` False: --no-compile-cache; ``JDTENSOR_COMPILE_CACHE`` false;
  JAX's own ``JAX_ENABLE_COMPILATION_CACHE`` false), and on CPU with
  several clients (see `CPU_REASON`; `clients` is the run's client count,
  None for not known here); the user's own ``JAX_COMPILATION_CACHE_DIR``
  where set; else a new folder. A CPU run of one client shares the cache:
  its one process writes the entries and reads them.

  Raises:
    ConfigError: ``JDTENSOR_COMPILE_CACHE`` is not a boolean (JAX's own
      ``JAX_ENABLE_COMPILATION_CACHE`` is read as JAX reads it).
  """
  asked = _env.read_bool(_env.JDTENSOR_COMPILE_CACHE, True, env)
  jax_on = _jax_bool(env.get(_env.JAX_ENABLE_COMPILATION_CACHE), True)
  if not enabled or max_restarts <= 0 or not asked or not jax_on:
    return None, ""
  own = env.get(_env.JAX_COMPILATION_CACHE_DIR, "")
  if device_type.upper() == "CPU" and clients != 1:
    if own:
      return None, (f"jdtensor launch: warning: your {_env.JAX_COMPILATION_CACHE_DIR}"
                    f"={own} is used on CPU, where {CPU_REASON}")
    return None, (f"jdtensor launch: restarts compile every program again on CPU: "
                  f"{CPU_REASON}")
  cache = (CompileCache(own, owned=False) if own else
           CompileCache(tempfile.mkdtemp(prefix="jdtensor-compile-cache-"), owned=True))
  if cache.owned:
    cache.record = _status.track_folder(cache.folder)
    cache.env[_env.JAX_COMPILATION_CACHE_DIR] = cache.folder
    if _env.JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS not in env:
      cache.env[_env.JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS] = str(MIN_COMPILE_SECONDS)
  return cache, cache.line()


def _jax_bool(raw: str | None, default: bool) -> bool:
  """A boolean variable of JAX's, read as JAX reads it (`jax._src.config.
  bool_env`'s words); a value JAX refuses is left for JAX to name, in the
  clients, and counts as the default here (never a refusal of jdtensor's)."""
  value = (raw or "").strip().lower()
  if value in ("y", "yes", "t", "true", "on", "1"):
    return True
  if value in ("n", "no", "f", "false", "off", "0"):
    return False
  return default


def entry_complete(path: str) -> bool:
  """Whether the cache entry at `path` is one whole compressed stream (zstd
  by its frame's blocks, read without decompressing; zlib by decompressing
  it to its end, a chunk at a time)."""
  with open(path, "rb") as f:
    head = f.read(4)
    if head == _ZSTD_MAGIC:
      return _zstd_frame_complete(f, os.fstat(f.fileno()).st_size)
    f.seek(0)
    inflate = zlib.decompressobj()
    try:
      while True:
        data = f.read(_READ_CHUNK)
        if not data:
          return False
        # A chunk at most of output at a time, not kept: only where the
        # stream ends matters (a compressed MiB can inflate to a GiB).
        while data and not inflate.eof:
          inflate.decompress(data, _READ_CHUNK)
          data = inflate.unconsumed_tail
        if inflate.eof:
          return not inflate.unused_data and not data and not f.read(1)
    except zlib.error:
      return False


def _zstd_frame_complete(f, size: int) -> bool:
  """A zstd frame (RFC 8878) whose magic was read: walks its block headers
  to the last block and the optional checksum, and checks the file ends
  there."""
  descriptor = f.read(1)
  if not descriptor:
    return False
  d = descriptor[0]
  fcs_flag, single, checksum, dict_flag = d >> 6, (d >> 5) & 1, (d >> 2) & 1, d & 3
  pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
  pos += (1 if single else 0, 2, 4, 8)[fcs_flag]
  while True:
    if pos + 3 > size:
      return False
    f.seek(pos)
    header = struct.unpack("<I", f.read(3) + b"\0")[0]
    last, kind, block_size = header & 1, (header >> 1) & 3, header >> 3
    if kind == 3:
      return False  # Reserved: not a frame JAX wrote.
    pos += 3 + (1 if kind == 1 else block_size)
    if last:
      break
  pos += 4 if checksum else 0
  return pos == size
