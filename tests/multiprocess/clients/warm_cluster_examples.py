"""Tests that share warm clusters, written as a user writes them.

Not collected by the suite itself: `test_warm_clusters.py` runs this file in
a pytest subprocess (in file order) and checks each outcome. Every body
prints ``WARM <test> <pid>`` on each client, so that the checker sees which
tests shared client processes; some tests fail on purpose.
"""

import os
import signal
import sys
import tempfile
import threading
import time

import pytest

from jdtensor.testing import MultiClientTestError, multi_client, run_in_multi_client

SHAPE = {"num_clients": 2, "devices_per_client": 2}


def mark(name):
  print(f"WARM {name} {os.getpid()}", flush=True)


@multi_client(**SHAPE)
def test_changes_everything_it_can():
  import jax

  import jdtensor
  mark("changes")
  jax.config.update("jax_enable_x64", True)
  os.environ["WARM_CLUSTER_VARIABLE"] = "set by a test"
  os.environ.pop("HOME", None)
  os.chdir(tempfile.gettempdir())
  signal.signal(signal.SIGUSR2, lambda *a: None)
  assert jdtensor.runtime.next_auto_mesh_name() == "mesh_0"


@multi_client(**SHAPE)
def test_sees_none_of_it():
  import jax

  import jdtensor
  mark("sees-none")
  assert not jax.config.jax_enable_x64
  assert "WARM_CLUSTER_VARIABLE" not in os.environ and "HOME" in os.environ
  assert os.getcwd() != tempfile.gettempdir()
  assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
  assert jdtensor.runtime.next_auto_mesh_name() == "mesh_0"
  assert jdtensor.get_default_mesh() is None


@multi_client(**SHAPE)
def test_leaves_a_thread_running():
  mark("thread")
  threading.Thread(target=time.sleep, args=(30,), daemon=True,
                   name="left-behind").start()


@multi_client(**SHAPE)
def test_after_the_thread():
  mark("after-thread")


@multi_client(**SHAPE)
def test_leaves_a_process_running():
  import subprocess
  mark("process")
  test_leaves_a_process_running.child = subprocess.Popen(["sleep", "30"])


@multi_client(**SHAPE)
def test_after_the_process():
  mark("after-process")


@multi_client(**SHAPE)
def test_leaves_a_file_open():
  mark("file")
  test_leaves_a_file_open.kept = open(__file__, "rb")  # noqa: SIM115


@multi_client(**SHAPE)
def test_after_the_file():
  mark("after-file")


@multi_client(**SHAPE)
def test_leaves_a_default_mesh_open():
  import jdtensor
  mark("mesh")
  mesh = jdtensor.create_distributed_mesh([("x", 4)], device_type="CPU")
  test_leaves_a_default_mesh_open.scope = jdtensor.default_mesh(mesh)
  test_leaves_a_default_mesh_open.scope.__enter__()


@multi_client(**SHAPE)
def test_after_the_mesh():
  import jdtensor
  mark("after-mesh")
  assert jdtensor.get_default_mesh() is None


@multi_client(**SHAPE)
def test_stops_the_heartbeat():
  from jdtensor import heartbeat
  mark("heartbeat")
  beat = heartbeat.current()
  beat.event.set()  # The agreed stop, on every client.
  assert beat.stopped.wait(30)


@multi_client(**SHAPE)
def test_after_the_heartbeat():
  from jdtensor import heartbeat
  mark("after-heartbeat")
  assert heartbeat.current() is not None and not heartbeat.current().stopped.is_set()


@multi_client(**SHAPE)
def test_client_1_fails_while_client_0_waits():
  from jax.experimental import multihost_utils

  import jdtensor
  mark("fails")
  if jdtensor.client_id() == 1:
    raise ValueError("wrong on purpose in client 1")
  multihost_utils.sync_global_devices("client 1 never comes")


@multi_client(**SHAPE)
def test_after_the_failure():
  mark("after-failure")


@multi_client(**SHAPE, timeout=4)
def test_times_out():
  mark("times-out")
  time.sleep(60)


@multi_client(**SHAPE)
def test_after_the_time_out():
  mark("after-time-out")


@multi_client(**SHAPE)
def test_kills_client_1():
  import jdtensor
  mark("kills")
  if jdtensor.client_id() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
  time.sleep(60)


@multi_client(**SHAPE)
def test_after_the_kill():
  mark("after-kill")


@multi_client(**SHAPE)
def test_exits_on_client_0():
  import jdtensor
  mark("exits")
  if jdtensor.client_id() == 0:
    sys.exit(0)


@multi_client(**SHAPE)
def test_after_the_exit():
  mark("after-exit")


@multi_client(**SHAPE, fresh=True)
def test_fresh():
  mark("fresh")


@multi_client(**SHAPE)
def test_after_fresh():
  mark("after-fresh")


@pytest.mark.multi_client(num_clients=2, devices_per_client=2)
def test_the_marker_form():
  mark("marker")


def test_run_in_multi_client_shares_it_too():
  def body():
    mark("plain")
    return os.getpid()
  assert len(set(run_in_multi_client(body, **SHAPE))) == 2


def test_a_failure_is_the_callers_to_catch():
  def body():
    raise KeyError("caught by the test")
  with pytest.raises(MultiClientTestError, match="KeyError"):
    run_in_multi_client(body, **SHAPE)


@multi_client(**SHAPE)
def test_after_a_caught_failure():
  mark("after-caught")


@multi_client(num_clients=1, devices_per_client=1)
def test_shape_b():
  mark("shape-b")


@multi_client(num_clients=1, devices_per_client=2)
def test_shape_c():
  mark("shape-c")


@multi_client(num_clients=1, devices_per_client=3)
def test_shape_d():
  mark("shape-d")


@multi_client(**SHAPE)
def test_back_to_the_first_shape():
  mark("back")
