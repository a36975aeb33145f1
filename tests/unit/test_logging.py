"""jdtensor's log routing: absl when the application uses it, safely."""

import logging
import sys
import types

import pytest

from jdtensor import _logging


@pytest.fixture
def half_imported_absl(monkeypatch):
  """absl.logging as another thread sees it while the main thread imports it:
  in sys.modules, half-built (no ABSLLogger yet), its spec initialising."""
  module = types.ModuleType("absl.logging")
  module.__spec__ = types.SimpleNamespace(_initializing=True)
  monkeypatch.setitem(sys.modules, "absl.logging", module)
  return module


def test_a_half_imported_absl_is_not_touched(half_imported_absl, caplog):
  with caplog.at_level(logging.INFO, logger="jdtensor"):
    _logging.info("beat %d", 7)  # Raised AttributeError before the fix.
  assert [r.getMessage() for r in caplog.records] == ["beat 7"]


def test_a_half_built_absl_without_the_spec_flag_falls_back(half_imported_absl,
                                                            caplog):
  half_imported_absl.__spec__ = types.SimpleNamespace(_initializing=False)
  with caplog.at_level(logging.WARNING, logger="jdtensor"):
    _logging.warning("no %s yet", "ABSLLogger")
  assert [r.getMessage() for r in caplog.records] == ["no ABSLLogger yet"]


def test_a_loaded_absl_gets_the_line(monkeypatch):
  calls = []
  module = types.ModuleType("absl.logging")
  module.__spec__ = types.SimpleNamespace(_initializing=False)
  module.ABSLLogger = types.SimpleNamespace(register_frame_to_skip=lambda *a: None)
  module.log = lambda level, msg, *args: calls.append((level, msg % args))
  monkeypatch.setitem(sys.modules, "absl.logging", module)
  _logging.error("client %d", 2)
  assert calls == [(-2, "client 2")]
