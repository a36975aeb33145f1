"""The jaxlib texts jdtensor reads (`jdtensor._jaxlib_texts`), produced for
real on the installed JAX. The other texts are probed where their behaviour is
tested (`_jaxlib_texts.PROBES`); this file holds gloo's connection notice,
which the launcher drops from the clients' output."""

import pytest

from jdtensor import _jaxlib_texts
from jdtensor.launcher.output import is_gloo_noise
from jdtensor.launcher.output import without_gloo_pieces
from tests.helpers import cluster_env, finish, free_port, start_clients

pytestmark = pytest.mark.multiprocess


def test_gloo_s_connection_notice_is_still_printed_and_recognised():
  """Two clients started by hand (no launcher to filter their output) run a
  cross-client psum: gloo prints its notice, and every line of it is one the
  launcher recognises as noise. If this jaxlib no longer prints it, the filter
  is dead code; if it rewords it, the launcher would show it."""
  jobs = [f"localhost:{free_port()}" for _ in range(2)]
  results = finish(start_clients("basic", [cluster_env(jobs, c, devices=2)
                                           for c in range(2)]), timeout=120)
  assert all(r.returncode == 0 for r in results), results
  text = "\n".join(r.stdout + r.stderr for r in results)
  notice = [line for line in text.splitlines()
            if _jaxlib_texts.GLOO_NOTICE_MARKERS.search(line)]
  assert notice, "gloo printed no connection notice: " + text[-2000:]
  assert [line for line in notice if not is_gloo_noise(line)] == []
  # Every piece is known, so one that lands in a line of the program's own
  # is taken out of it.
  assert [line for line in notice if not _jaxlib_texts.GLOO_NOTICE_LEFTOVER.fullmatch(
      without_gloo_pieces(line)[1])] == []
