"""The command line (`jdtensor.cli`): what it offers. Its commands run for
real in tests/multiprocess (launch, status, demo)."""

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
          f"jdtensor trace: no client trace in {tmp_path / 'empty'} (client-<id>-<pid>"
          ".json, written by clients started with JDTENSOR_TRACE_DIR set)")),
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
