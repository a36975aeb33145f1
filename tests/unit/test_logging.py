"""jdtensor's log lines: one format, whoever imported absl."""

import logging

import pytest

from jdtensor import _logging
from tests.helpers import run_python

# What a heartbeat verdict, a warning and an info line look like with no
# logging configured (Python's last-resort handler: WARNING and up, bare).
_SCRIPT = """
    import sys
    {imports}
    from jdtensor import _logging
    _logging.error("heartbeat: client %d missed beat %d; stopping this client", 1, 4)
    _logging.warning("jdtensor: %s", "a warning")
    _logging.info("an info line")
    import logging
    print(len(logging.root.handlers), "absl.logging" in sys.modules)
    """


@pytest.mark.parametrize("imports", [
    "",
    "import absl.logging",
    "import absl.logging, absl.flags, absl.app",
], ids=["no-absl", "absl-logging-imported", "absl-app-imported"])
def test_one_format_whoever_imported_absl(imports):
  res = run_python(_SCRIPT.format(imports=imports))
  assert res.returncode == 0, res.stderr
  assert res.stderr.splitlines() == [
      "heartbeat: client 1 missed beat 4; stopping this client",
      "jdtensor: a warning"]
  # jdtensor never configured the application's root logger (a call into
  # absl.logging before absl is initialised would have: logging.basicConfig).
  assert res.stdout.split() == ["0", str(bool(imports))]


def test_lines_follow_the_application_s_own_logging_configuration():
  # The application (here absl, logging before its initialisation, as orbax
  # does) configured the root logger: jdtensor's lines look like every other
  # standard logger's there, and jdtensor's and the app's share one format.
  res = run_python("""
      import logging
      from absl import logging as absl_logging
      absl_logging.warning("the app logs")
      from jdtensor import _logging
      _logging.error("heartbeat: client %d failed", 1)
      logging.getLogger("other").error("another library")
      """)
  assert res.returncode == 0, res.stderr
  assert res.stderr.splitlines() == ["WARNING:absl:the app logs",
                                     "ERROR:jdtensor:heartbeat: client 1 failed",
                                     "ERROR:other:another library"]


def test_under_absl_app_run_lines_take_absl_s_format():
  # The application chose absl's handler: jdtensor's lines are formatted by it.
  res = run_python("""
      from absl import app
      from jdtensor import _logging
      def main(argv):
        _logging.error("heartbeat: client %d failed", 1)
      app.run(main)
      """)
  assert res.returncode == 0, res.stderr
  line = [l for l in res.stderr.splitlines() if "heartbeat:" in l]
  assert len(line) == 1 and line[0].startswith("E") and line[0].endswith(
      "] heartbeat: client 1 failed"), res.stderr


def test_levels_map_to_standard_levels(caplog):
  with caplog.at_level(1, logger="jdtensor"):
    _logging.info("i")
    _logging.warning("w %s", "x")
    _logging.error("e")
    _logging.vlog(1, "v1")
    _logging.vlog(2, "v2")
  assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
      (logging.INFO, "i"), (logging.WARNING, "w x"), (logging.ERROR, "e"),
      (logging.DEBUG, "v1"), (logging.DEBUG - 1, "v2")]
  # The record names jdtensor's caller, not the logging module.
  assert {r.funcName for r in caplog.records} == {
      "test_levels_map_to_standard_levels"}
