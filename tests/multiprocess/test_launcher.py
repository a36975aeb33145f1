"""`jdtensor launch`: environment, prefixes, kill-the-rest, signals, no orphans."""

import io
import os
import signal
import sys
import time

import pytest

from jdtensor import launcher
from tests.helpers import (CLIENT, pid_alive, run_python, sigterm_launcher,
                           start_launcher)

pytestmark = pytest.mark.multiprocess


def test_prefixes_and_success():
  out, err = io.StringIO(), io.StringIO()
  code = "import os; print('hi', os.environ['DTENSOR_CLIENT_ID']); print('e', file=__import__('sys').stderr)"
  res = launcher.launch(launcher.LaunchSpec(command=(sys.executable, "-c", code),
                                            num_clients=3, timeout=60),
                        out=out, err=err)
  assert res.exit_code == 0 and res.returncodes == [0, 0, 0] and not res.reason
  assert sorted(out.getvalue().splitlines()) == [
      "[client 0] hi 0", "[client 1] hi 1", "[client 2] hi 2"]
  assert sorted(err.getvalue().splitlines()) == [
      "[client 0] e", "[client 1] e", "[client 2] e"]


def test_the_root_cause_is_who_failed_first_by_its_own_account():
  """Client 0 reports its failure, then stays on its way out (as a jdtensor
  client 0 does, hosting the services) while client 1 fails and ends first:
  client 0 is the root cause and is left to end by itself."""
  code = """if True:
    import json, os, sys, time
    me = int(os.environ["DTENSOR_CLIENT_ID"])
    if me == 0:
      path = os.path.join(os.environ["JDTENSOR_REPORT_DIR"], "client-0.json")
      with open(path, "w") as f:
        json.dump({"client": 0, "culprits": [0], "why": "failed: boom",
                   "at": time.time(), "departure": True, "detail": "boom"}, f)
      time.sleep(1.0)
    else:
      time.sleep(0.3)
    sys.exit(1)
  """
  out, err = io.StringIO(), io.StringIO()
  res = launcher.launch(launcher.LaunchSpec(command=(sys.executable, "-c", code),
                                            num_clients=2, timeout=60),
                        out=out, err=err)
  assert res.returncodes == [1, 1], err.getvalue()
  assert res.first_failure == 0
  # With the reason its report gives (its "detail").
  assert res.reason == ("jdtensor launch: client 0 exited with code 1: boom; stopped "
                        "clients none (also: client 1 exited with code 1)")


def test_one_client_fails_the_rest_are_stopped():
  out, err = io.StringIO(), io.StringIO()
  start = time.monotonic()
  res = launcher.launch(launcher.LaunchSpec(
      command=(sys.executable, CLIENT, "exit_code"), num_clients=3, timeout=60,
      grace=2), out=out, err=err)
  elapsed = time.monotonic() - start
  assert res.exit_code == 3 and res.first_failure == 1
  assert res.reason == ("jdtensor launch: client 1 exited with code 3; stopped "
                        "clients 0, 2")
  assert err.getvalue().rstrip().endswith(res.reason)
  assert res.returncodes[1] == 3 and res.returncodes[0] == res.returncodes[2] == -15
  assert elapsed < 30
  assert len(res.pids) == 3 and not any(pid_alive(p) for p in res.pids)


def test_killed_client_is_reported():
  out, err = io.StringIO(), io.StringIO()
  code = ("import os, signal, time, sys\n"
          "if os.environ['DTENSOR_CLIENT_ID'] == '0': os.kill(os.getpid(), signal.SIGKILL)\n"
          "time.sleep(60)")
  res = launcher.launch(launcher.LaunchSpec(command=(sys.executable, "-c", code),
                                            num_clients=2, timeout=60, grace=1),
                        out=out, err=err)
  assert res.reason == ("jdtensor launch: client 0 was killed by SIGKILL; "
                        "stopped clients 1")
  assert res.exit_code == 128 + 9
  assert not any(pid_alive(p) for p in res.pids)


def test_clients_die_with_a_killed_launcher():
  """Even SIGKILL to the launcher (no cleanup possible) leaves no client."""
  proc, pids = start_launcher("sleep")
  try:
    assert len(pids) == 2
    proc.kill()
    proc.communicate(timeout=10)
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
      time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)


def test_timeout_stops_everyone():
  res = launcher.launch(launcher.LaunchSpec(
      command=(sys.executable, CLIENT, "sleep"), num_clients=2, timeout=1.5,
      grace=1), out=io.StringIO(), err=io.StringIO())
  assert res.exit_code == 124
  assert res.reason == "jdtensor launch: timed out after 1.5 s; stopped clients 0, 1"


def test_sigterm_to_launcher_stops_all_clients():
  proc, pids = start_launcher("sleep")
  returncode, err, _ = sigterm_launcher(proc, pids)
  assert returncode == 128 + signal.SIGTERM
  assert "jdtensor launch: received SIGTERM; stopped clients 0, 1" in err
  assert not any(pid_alive(p) for p in pids)


def test_cli_usage_errors_and_no_jax_in_parent():
  res = run_python("""
      import sys
      from jdtensor.cli import main
      code = main(["launch", "-n", "2"])
      assert "jax" not in sys.modules
      print("CODE", code)
      """)
  assert "CODE 2" in res.stdout
  assert "jdtensor launch: give the command each client runs" in res.stderr
  res = run_python("""
      from jdtensor.cli import main
      main(["launch", "-n", "0", "--", "true"])
      """)
  assert res.returncode == 2
  assert "argument -n/--num-clients: expected a positive integer, got '0'" in res.stderr
  res = run_python("""
      import sys
      from jdtensor.cli import main
      sys.exit(main(["launch", "-n", "1", "--", "/nonexistent/cmd"]))
      """)
  assert res.returncode == 127
  # Said once, by the launcher, before any client starts.
  assert res.stderr.splitlines()[-1] == (
      "jdtensor launch: cannot start '/nonexistent/cmd': no such file")
  assert "[client" not in res.stderr


@pytest.mark.parametrize("log_only", [False, True], ids=["tee", "log-only"])
def test_log_dir_writes_each_clients_output_to_its_own_file(tmp_path, log_only):
  """`--log-dir`: each client's stdout and stderr as written, after a header
  line an attempt (appended to across attempts), the console still tagged
  unless `--log-only`; the summary names the root cause's file."""
  code = ("import os, sys; me = os.environ['DTENSOR_CLIENT_ID']; print('out', me); "
          "print('err', me, file=sys.stderr, flush=True); sys.exit(3 if me == '1' else 0)")
  logs = tmp_path / "logs"
  argv = ["launch", "-n", "2", "--timeout", "60", "--grace", "2", "--max-restarts", "1",
          "--log-dir", str(logs)] + (["--log-only"] if log_only else []) + [
              "--", sys.executable, "-c", code]
  res = run_python(f"""
      import sys
      from jdtensor.cli import main
      sys.exit(main({argv!r}))
      """)
  assert res.returncode == 3, res.stderr
  assert sorted(os.listdir(logs)) == ["client-0.log", "client-1.log"]
  for client in (0, 1):
    lines = (logs / f"client-{client}.log").read_text().splitlines()
    headers = [line for line in lines if line.startswith("==== ")]
    assert [h.split(", pid")[0] for h in headers] == [
        f"==== jdtensor launch: client {client}, attempt {a}" for a in (1, 2)], lines
    assert sorted(set(lines) - set(headers)) == [f"err {client}", f"out {client}"], lines
    assert lines.count(f"out {client}") == 2, lines
  assert res.stderr.splitlines()[-1] == (
      f"jdtensor launch: client 1 exited with code 3 (its log: {logs}/client-1.log); "
      "stopped clients none"), res.stderr
  tagged = "[client 1] err 1" in res.stderr and "[client 0] out 0" in res.stdout
  assert tagged != log_only, (res.stdout, res.stderr)


def test_log_dir_that_cannot_be_written_is_refused_before_any_client(tmp_path):
  blocked = tmp_path / "file"
  blocked.write_text("")
  res = run_python(f"""
      import sys
      from jdtensor.cli import main
      sys.exit(main(["launch", "-n", "2", "--log-dir", {str(blocked / 'logs')!r},
                     "--", "true"]))
      """)
  assert res.returncode == 2
  assert res.stderr.strip() == (
      f"jdtensor launch: --log-dir {str(blocked / 'logs')!r}: cannot write there "
      "(Not a directory); give a folder this user can create and write")
  res = run_python("""
      import sys
      from jdtensor.cli import main
      sys.exit(main(["launch", "-n", "2", "--log-only", "--", "true"]))
      """)
  assert res.returncode == 2 and "--log-only needs --log-dir DIR" in res.stderr
