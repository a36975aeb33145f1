"""`jdtensor demo`'s report, pure: what a client prints at the end."""

import contextlib
import io

from jdtensor import demo


def report_lines(result):
  sink = io.StringIO()
  with contextlib.redirect_stdout(sink):
    ok = demo.report(result, "[client 0] ")
  return ok, sink.getvalue().splitlines()


def test_nothing_left_to_train_is_a_success():
  ok, lines = report_lines(demo.DemoResult("|x=1|0|0|CPU:0", [], [], 0.5, 0.0, 30))
  assert ok
  assert lines == ["[client 0] mesh: |x=1|0|0|CPU:0",
                   "[client 0] nothing left to train (resumed at step 30)"]
  assert demo.DemoResult("m", [], [], 0, 0).max_loss_difference == 0.0


def test_a_mismatch_is_reported_and_fails():
  ok, lines = report_lines(demo.DemoResult("m", [1.0, 0.5], [1.0, 0.4], 0.25,
                                           0.002, 3))
  assert not ok
  assert lines[1:] == [
      "[client 0] init: 250 ms, step: 2.00 ms, loss 1.0000 -> 0.5000 over 2 "
      "steps (resumed at step 3)",
      "[client 0] max |loss - single-device loss| = 1.00e-01 (tolerance 1e-05): "
      "MISMATCH"]
