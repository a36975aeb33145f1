"""The compilation cache a run's attempts share, and the time to recovery
(`jdtensor.launcher.compile_cache`, `jdtensor.launcher.nodes.recovery_line`,
`jdtensor.step_done`): pure parts, no JAX."""

import os
import struct
import zlib

import pytest

from jdtensor import ConfigError
from jdtensor.launcher import compile_cache
from jdtensor.launcher.compile_cache import (CPU_REASON, MIN_COMPILE_SECONDS, CompileCache,
                                             entry_complete, new_entries, plan, receive)
from jdtensor.launcher.nodes import _Restart, recovery_line

ON = {"enabled": True, "max_restarts": 1, "device_type": "GPU"}


@pytest.mark.parametrize("kwargs,env,expect", [
    ({}, {}, "new"),
    ({"device_type": "TPU"}, {}, "new"),
    ({"max_restarts": 0}, {}, None),
    ({"enabled": False}, {}, None),
    ({}, {"JDTENSOR_COMPILE_CACHE": "false"}, None),
    ({}, {"JDTENSOR_COMPILE_CACHE": "1"}, "new"),
    ({}, {"JAX_ENABLE_COMPILATION_CACHE": "0"}, None),
    ({}, {"JAX_ENABLE_COMPILATION_CACHE": "off"}, None),
    ({}, {"JAX_ENABLE_COMPILATION_CACHE": "On"}, "new"),
    ({}, {"JAX_ENABLE_COMPILATION_CACHE": "maybe"}, "new"),
    ({}, {"JAX_COMPILATION_CACHE_DIR": "/users/own"}, "own"),
    ({}, {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2"}, "new-threshold-kept"),
    ({"device_type": "CPU"}, {}, "cpu"),
    ({"device_type": "cpu"}, {"JAX_COMPILATION_CACHE_DIR": "/users/own"}, "cpu-own"),
    ({"device_type": "CPU", "clients": 2}, {}, "cpu"),
    ({"device_type": "CPU", "clients": 1}, {}, "new"),
    ({"device_type": "CPU", "clients": 1}, {"JAX_COMPILATION_CACHE_DIR": "/users/own"},
     "own"),
    ({"device_type": "CPU", "clients": 1, "max_restarts": 0}, {}, None),
], ids=["gpu", "tpu", "no-restarts", "flag-off", "variable-off", "variable-on",
        "jax-off", "jax-off-its-word", "jax-on-its-word", "jax-refuses-not-us",
        "users-own", "users-threshold", "cpu", "cpu-users-own", "cpu-two-clients",
        "cpu-one-client", "cpu-one-client-users-own", "cpu-one-client-no-restarts"])
def test_who_gets_which_cache(kwargs, env, expect):
  cache, line = plan(**{**ON, **kwargs}, env=env)
  try:
    if expect is None:
      assert cache is None and line == ""
    elif expect == "own":
      assert cache == CompileCache("/users/own", owned=False, env={})
      assert line == ("jdtensor launch: restarts reuse compiled programs: JAX's "
                      "compilation cache in /users/own (your JAX_COMPILATION_CACHE_DIR, "
                      "left in place)")
    elif expect.startswith("cpu"):
      assert cache is None
      assert CPU_REASON in line
      if expect == "cpu-own":
        assert line.startswith("jdtensor launch: warning: your "
                               "JAX_COMPILATION_CACHE_DIR=/users/own is used on CPU")
      else:
        assert line.startswith("jdtensor launch: restarts compile every program "
                               "again on CPU: ")
    else:
      assert cache is not None and cache.owned and os.path.isdir(cache.folder)
      assert os.path.basename(cache.folder).startswith("jdtensor-compile-cache-")
      threshold = ({} if expect == "new-threshold-kept" else
                   {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": str(MIN_COMPILE_SECONDS)})
      assert cache.env == {"JAX_COMPILATION_CACHE_DIR": cache.folder, **threshold}
      assert line == (f"jdtensor launch: restarts reuse compiled programs: JAX's "
                      f"compilation cache in {cache.folder} (removed at the end; "
                      "--no-compile-cache or JDTENSOR_COMPILE_CACHE=false turns it off)")
      cache.remove()
      assert not os.path.exists(cache.folder)
  finally:
    if cache is not None and cache.owned:
      cache.remove()


def test_a_malformed_switch_names_itself():
  with pytest.raises(ConfigError, match="JDTENSOR_COMPILE_CACHE='maybe' is not a boolean"):
    plan(**ON, env={"JDTENSOR_COMPILE_CACHE": "maybe"})


def test_the_users_own_folder_is_never_removed(tmp_path):
  cache = CompileCache(str(tmp_path), owned=False)
  (tmp_path / "x-cache").write_bytes(b"kept")
  cache.remove()
  assert (tmp_path / "x-cache").read_bytes() == b"kept"


# -- entries: whole or cut short ------------------------------------------------

def zstd_frame(blocks, checksum=False, single=True):
  """A zstd frame by hand (RFC 8878): raw blocks (bytes) and RLE blocks
  (("rle", byte, count)); the content size field is one byte."""
  out = bytearray(b"\x28\xb5\x2f\xfd")
  descriptor = (0x20 if single else 0) | (0x04 if checksum else 0)
  out.append(descriptor)
  if not single:
    out.append(0x50)  # Window descriptor; no content size field.
  else:
    out.append(0)  # Frame content size (1 byte when single segment).
  for i, block in enumerate(blocks):
    last = int(i == len(blocks) - 1)
    if isinstance(block, tuple):
      _, byte, count = block
      out += struct.pack("<I", last | (1 << 1) | (count << 3))[:3] + bytes([byte])
    else:
      out += struct.pack("<I", last | (len(block) << 3))[:3] + block
  if checksum:
    out += b"\x01\x02\x03\x04"
  return bytes(out)


WHOLE = {
    "zlib": zlib.compress(os.urandom(300_000) + b"\0" * 100_000),
    "zstd-raw": zstd_frame([b"abc" * 1000, b"tail"]),
    "zstd-rle-checksum": zstd_frame([b"x" * 10, ("rle", 7, 5000)], checksum=True),
    "zstd-window": zstd_frame([b"only"], single=False),
}


@pytest.mark.parametrize("kind", sorted(WHOLE))
def test_an_entry_is_whole_or_cut_short_by_its_own_framing(kind, tmp_path):
  data = WHOLE[kind]
  path = tmp_path / "e-cache"
  path.write_bytes(data)
  assert entry_complete(str(path))
  for cut in (1, 2, len(data) // 2, len(data) - 1):
    path.write_bytes(data[:cut])
    assert not entry_complete(str(path)), cut
  path.write_bytes(data + b"more")
  assert not entry_complete(str(path))


def test_a_huge_stream_is_judged_a_chunk_at_a_time(tmp_path):
  """300 MiB of zeros compress to 300 KiB: reading it whole would hold it all."""
  import tracemalloc
  deflate, path = zlib.compressobj(), tmp_path / "zeros-cache"
  with open(path, "wb") as f:
    for _ in range(300):
      f.write(deflate.compress(bytes(1 << 20)))
    f.write(deflate.flush())
  tracemalloc.start()
  try:
    assert entry_complete(str(path))
    assert tracemalloc.get_traced_memory()[1] < 16 << 20
  finally:
    tracemalloc.stop()
  data = path.read_bytes()
  path.write_bytes(data[:-3])
  assert not entry_complete(str(path))


def test_only_entries_cut_short_since_the_attempt_began_are_dropped(tmp_path):
  whole, cut = WHOLE["zlib"], WHOLE["zlib"][:1000]
  for name, data in (("a-cache", whole), ("b-cache", cut), ("old-cache", cut),
                     ("c-atime", b"x"), (".d-cache.partial", b"x")):
    (tmp_path / name).write_bytes(data)
  os.utime(tmp_path / "old-cache", (1000.0, 1000.0))
  cache = CompileCache(str(tmp_path), owned=True)
  assert cache.drop_incomplete(since=2000.0) == ["b-cache"]
  assert sorted(os.listdir(tmp_path)) == [".d-cache.partial", "a-cache", "c-atime",
                                          "old-cache"]


# -- node 0's entries on the other nodes -------------------------------------------

@pytest.mark.parametrize("size", [0, 1, compile_cache.SHIP_CHUNK,
                                  3 * compile_cache.SHIP_CHUNK + 5])
def test_node_0s_entries_arrive_whole_on_another_node(size, tmp_path):
  source, dest = tmp_path / "node0", tmp_path / "node1"
  source.mkdir()
  dest.mkdir()
  data = os.urandom(size)
  (source / "jit_step-1-cache").write_bytes(data)
  (source / "jit_step-1-atime").write_bytes(b"not an entry")
  sender, receiver = CompileCache(str(source), True), CompileCache(str(dest), True)
  shipped = set()
  for name, frames in new_entries(sender, shipped):
    frames = list(frames)
    assert all(len(str(f)) < 64 * 1024 for f in frames)
    for frame in frames[:-1]:
      receive(receiver, frame)
      assert os.listdir(dest) == [".jit_step-1-cache.partial"]  # Never read half.
    receive(receiver, frames[-1])
    shipped.add(name)
  assert os.listdir(dest) == ["jit_step-1-cache"]
  assert (dest / "jit_step-1-cache").read_bytes() == data
  assert list(new_entries(sender, shipped)) == []  # Each entry is sent once.


@pytest.mark.parametrize("frame", [
    {"n": "../escape-cache", "o": 0, "d": "", "e": True},
    {"n": "sub/dir-cache", "o": 0, "d": "", "e": True},
    {"n": ".hidden-cache", "o": 0, "d": "", "e": True},
    {"n": "not-an-entry", "o": 0, "d": "", "e": True},
    {"n": "x-cache", "o": 0, "d": "not base64!", "e": True},
    {"n": "x-cache", "o": 5, "d": "", "e": True},  # A later part of nothing.
    {"n": "x-cache"},
])
def test_a_malformed_frame_writes_nothing(frame, tmp_path):
  receive(CompileCache(str(tmp_path), True), frame)
  assert os.listdir(tmp_path) == []
  assert not (tmp_path.parent / "escape-cache").exists()


# -- the time to recovery ----------------------------------------------------------

def test_the_recovery_line():
  assert recovery_line([]) == ""
  full = _Restart(1, 100.0, "client 2's failure", 100.4, 107.25)
  assert recovery_line([full]) == (
      "jdtensor launch: time to recovery: restart 1 after client 2's failure: 7.2 s "
      "(0.4 s to start again, 6.8 s to the first step)")
  unknown = _Restart(2, 200.0, "a failure", 201.0, None)
  assert recovery_line([full, unknown]) == (
      "jdtensor launch: time to recovery: restart 1 after client 2's failure: 7.2 s "
      "(0.4 s to start again, 6.8 s to the first step); restart 2 after a failure: "
      "1.0 s to start again (call jdtensor.step_done() after each step for the time "
      "to the first step)")


def test_step_done_tells_the_launcher_once(tmp_path, monkeypatch):
  import jdtensor
  from jdtensor import _report, steps
  monkeypatch.setattr(steps, "_told", False)
  monkeypatch.setenv("JDTENSOR_REPORT_DIR", str(tmp_path))
  monkeypatch.setenv("DTENSOR_CLIENT_ID", "3")
  assert _report.first_steps(str(tmp_path), [3]) is None
  jdtensor.step_done()
  first = _report.first_steps(str(tmp_path), [3])
  assert first is not None
  os.unlink(tmp_path / "client-3.first-step")
  jdtensor.step_done()  # Later steps cost a flag read.
  assert os.listdir(tmp_path) == []
  assert _report.first_steps(str(tmp_path), [3]) is None


def test_step_done_outside_the_launcher_does_nothing(tmp_path, monkeypatch):
  import jdtensor
  from jdtensor import steps
  monkeypatch.setattr(steps, "_told", False)
  monkeypatch.delenv("JDTENSOR_REPORT_DIR", raising=False)
  monkeypatch.chdir(tmp_path)
  jdtensor.step_done()
  assert os.listdir(tmp_path) == []


def test_the_launcher_waits_for_every_local_clients_first_step(tmp_path):
  from jdtensor import _report
  _report.mark_first_step(str(tmp_path), 4, 10.5)
  assert _report.first_steps(str(tmp_path), [4, 5]) is None
  _report.mark_first_step(str(tmp_path), 5, 9.0)
  assert _report.first_steps(str(tmp_path), [4, 5]) == 10.5
