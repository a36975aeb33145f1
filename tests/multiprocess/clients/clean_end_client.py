"""The simplest program, ended each way a script ends: SCENARIO picks how,
END_AFTER (seconds) when, after the result is printed.

    SCENARIO=return|barrier|sys_exit|daemon   END_AFTER=<seconds>

Every client initialises, takes one jitted sum over a distributed mesh of
every device, prints it (``RESULT sum=``) and then, END_AFTER seconds
later (a moment of a beat: the heartbeat beats on its own schedule):

* return: the script just ends (no final barrier);
* barrier: ``jdtensor.barrier`` first, as the README's example does;
* sys_exit: ``sys.exit(0)``;
* daemon: leaves a daemon thread sleeping (still alive at the end).
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

from tests.client_common import result, scenario_name  # pylint: disable=wrong-import-position


def main():
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import jdtensor  # pylint: disable=g-import-not-at-top
  jdtensor.initialize_accelerator_system("CPU")
  n = jax.device_count()
  mesh = jdtensor.create_distributed_mesh([("batch", n)])
  x = jdtensor.call_with_layout(jnp.ones, jdtensor.Layout.batch_sharded(mesh, "batch", rank=1),
                                (2 * n,))
  result("sum", float(jax.jit(jnp.sum)(x)))
  time.sleep(float(os.environ.get("END_AFTER", "0")))
  how = scenario_name()
  if how == "barrier":
    jdtensor.barrier(mesh, "done", timeout_in_ms=60_000)
  elif how == "sys_exit":
    sys.exit(0)
  elif how == "daemon":
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()


main()
