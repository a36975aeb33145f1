"""The command line (`jdtensor.cli`): what it offers. Its commands run for
real in tests/multiprocess (launch, status, demo)."""

import os

from jdtensor import cli


def test_help_lists_only_public_commands(capsys):
  try:
    cli.main(["--help"])
  except SystemExit:
    pass
  text = capsys.readouterr().out
  assert "{launch,demo,env,status,trace}" in text
  assert "demo-client" not in text and "SUPPRESS" not in text


def _client_file(folder, client, pid, host):
  from jdtensor import _trace  # pylint: disable=g-import-not-at-top
  out = _trace.TraceFile(str(folder / f"client-{client}-{pid}.json"), pid,
                         f"client {client} ({host}, pid {pid})",
                         metadata={"client": client, "host": host, "pid": pid,
                                   "restart": 0, "clock_residual_s": 0.002})
  out.instant("verdict", 1.0)
  out.close()


def test_trace_merges_folders_and_files_into_one(tmp_path, capsys):
  """`jdtensor trace` of two nodes' folders (their clients both pid 1) and
  of a file: one trace, a track each, their residuals in its metadata."""
  import json  # pylint: disable=g-import-not-at-top
  for node in (0, 1):
    (tmp_path / f"node{node}").mkdir()
    _client_file(tmp_path / f"node{node}", node, 1, f"pod-{node}")
  _client_file(tmp_path, 2, 5, "pod-2")
  out = tmp_path / "run.json"
  assert cli.main(["trace", str(tmp_path / "node0"), str(tmp_path / "node1"),
                   str(tmp_path / "client-2-5.json"), "-o", str(out)]) == 0
  assert capsys.readouterr().out.startswith(f"jdtensor trace: {out} (")
  trace = json.loads(out.read_text())
  names = sorted(e["args"]["name"] for e in trace["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name")
  assert names == ["client 0 (pod-0, pid 1)", "client 1 (pod-1, pid 1)",
                   "client 2 (pod-2, pid 5)"]
  assert sorted(trace["metadata"]["jdtensor"]["residuals_s"]) == names
  assert cli.main(["trace", str(tmp_path / "node0")]) == 0  # One folder: its run.json.
  assert (tmp_path / "node0" / "run.json").exists()


def test_trace_refuses_what_it_cannot_merge_and_says_why(tmp_path, capsys):
  (tmp_path / "empty").mkdir()
  _client_file(tmp_path, 0, 1, "pod-0")
  cases = [
      ([str(tmp_path / "empty")], (
          f"jdtensor trace: no trace parts in {tmp_path / 'empty'} (client-<id>-<pid>"
          ".json, written by clients started with JDTENSOR_TRACE_DIR set, or "
          "launcher-<node>.json, by `jdtensor launch --trace`)")),
      ([str(tmp_path / "nowhere.json")], (
          f"jdtensor trace: {tmp_path / 'nowhere.json'} is neither a folder nor a file "
          "(give a JDTENSOR_TRACE_DIR, or a trace file that `jdtensor launch --trace` "
          "wrote)")),
      ([str(tmp_path / "client-0-1.json")], (
          f"jdtensor trace: say where the trace of {tmp_path / 'client-0-1.json'} goes: "
          "-o FILE"))]
  for args, said in cases:
    assert cli.main(["trace", *args]) == 2
    assert capsys.readouterr().err == said + "\n"



def test_trace_of_a_launchers_folder_merges_the_launchers_own_file_too(tmp_path, capsys):
  """The folder a `jdtensor launch --trace` keeps its parts in (left behind
  by a killed launcher): its own track, and each client's end on the
  client's track (one host: one pid space), not dropped."""
  import json  # pylint: disable=g-import-not-at-top

  from jdtensor import _trace  # pylint: disable=g-import-not-at-top
  for client, pid in ((0, 11), (1, 12)):
    _client_file(tmp_path, client, pid, "host")
  own = _trace.TraceFile(str(tmp_path / "launcher-0.json"), 10,
                         "jdtensor launch (node 0, pid 10)", sort_index=-1)
  own.instant("restarting (1 of 1)", 2.0, {"text": "jdtensor launch: restarting (1 of 1)"},
              scope="g")
  own.write({"ph": "i", "name": "client 1 killed by SIGKILL", "pid": 12, "tid": 1,
             "ts": 2e6, "s": "p", "args": {"code": -9}})
  own.close()
  (tmp_path / "client-2-13.json").write_text("")  # Killed as it created its file.
  assert cli.main(["trace", str(tmp_path)]) == 0
  assert capsys.readouterr().out == (f"jdtensor trace: {tmp_path / 'run.json'} (13 events "
                                     "from 3 file(s))\n")
  trace = json.loads((tmp_path / "run.json").read_text())
  assert _trace.problems(trace) == []
  names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
           if e["ph"] == "M" and e["name"] == "process_name"}
  assert names == {10: "jdtensor launch (node 0, pid 10)", 11: "client 0 (host, pid 11)",
                   12: "client 1 (host, pid 12)"}
  (end,) = [e for e in trace["traceEvents"] if e.get("name") == "client 1 killed by SIGKILL"]
  assert end["pid"] == 12
  assert cli.main(["trace", str(tmp_path)]) == 0  # Again: run.json is no part.
  assert "from 3 file(s)" in capsys.readouterr().out


def test_trace_refuses_a_file_that_is_not_a_trace_in_one_line_and_writes_nothing(
    tmp_path, capsys):
  """Exit 2 and one line naming the file and what is wrong; never an empty
  trace with exit 0, never a bad value passed through as an event."""
  _client_file(tmp_path, 0, 1, "pod-0")
  cases = {"not-json.json": ("not a trace\n", "not JSON (Expecting value, line 1), so not "
                             "a trace"),
           "empty.json": ("", "empty, not a trace"),
           "array.json": ("[1, 2, 3]", "event 0 is 1, not an object"),
           "no-events.json": ("[]", "no trace events in it"),
           "shape.json": ('{"events": 1}', 'a JSON object without traceEvents ({"events": '
                          '1})'),
           "string.json": ('{"traceEvents": "x"}', 'its traceEvents is "x", not a list of '
                           "events"),
           "strings.json": ('{"traceEvents": ["x"]}', 'event 0 is "x", not an object')}
  out = tmp_path / "out.json"
  for name, (content, said) in cases.items():
    (tmp_path / name).write_text(content)
    assert cli.main(["trace", str(tmp_path / "client-0-1.json"), str(tmp_path / name),
                     "-o", str(out)]) == 2, name
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"jdtensor trace: {tmp_path / name}: {said}; give what "
                            "jdtensor wrote (a JDTENSOR_TRACE_DIR, or the trace of "
                            "`jdtensor launch --trace` or `jdtensor trace`)\n"), name
    assert not out.exists() and not (tmp_path / "out.json.partial").exists()
  (tmp_path / "parts").mkdir()
  (tmp_path / "parts" / "client-0-5.json").write_text("[\n{\"ph\": 1}\n")
  assert cli.main(["trace", str(tmp_path / "parts")]) == 2
  assert capsys.readouterr().err.startswith(
      f"jdtensor trace: {tmp_path / 'parts' / 'client-0-5.json'}: line 2 is an object "
      "without a phase the trace format defines (ph 1); give ")
  assert os.listdir(tmp_path / "parts") == ["client-0-5.json"]


def test_trace_refuses_where_the_trace_cannot_go_before_reading(tmp_path, capsys):
  _client_file(tmp_path, 0, 1, "pod-0")
  part = str(tmp_path / "client-0-1.json")
  for out, why in [("", "the file name is empty; give the file the trace goes to (e.g. "
                    "run.json)"),
                   (str(tmp_path), f"{tmp_path} is a directory; give a file name (e.g. "
                    f"{tmp_path}/run.json)"),
                   (str(tmp_path / "no" / "run.json"), f"its folder {tmp_path / 'no'} does "
                    "not exist; create it first")]:
    assert cli.main(["trace", part, "-o", out]) == 2
    assert capsys.readouterr().err == (f"jdtensor trace: cannot write the trace to {out!r}: "
                                       f"{why}\n")
