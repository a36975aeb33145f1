"""A client that starts a second runtime where it cannot:

* ``SCENARIO=jax-first``: ``jax.distributed.initialize`` by hand, then
  ``initialize_accelerator_system``;
* ``SCENARIO=spawn`` / ``SCENARIO=fork``: an initialised client starts a
  multiprocessing child (a data-loader worker) that calls
  ``initialize_accelerator_system`` with the DTENSOR_* it inherited.

Prints ``REFUSED <seconds> <error>`` for the error it got, and how long it took.
"""
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))


def second_start() -> None:
  import jdtensor  # pylint: disable=g-import-not-at-top
  start = time.monotonic()
  try:
    jdtensor.initialize_accelerator_system("CPU")
  except Exception as e:  # pylint: disable=broad-except
    print(f"REFUSED {time.monotonic() - start:.1f} {type(e).__name__}: {e}", flush=True)
    sys.exit(3)
  print("STARTED a second runtime", flush=True)


if __name__ == "__main__":
  mode = os.environ["SCENARIO"]
  if mode == "jax-first":
    import jax
    jax.distributed.initialize(os.environ["DTENSOR_JOBS"].split(",")[0],
                               int(os.environ["DTENSOR_NUM_CLIENTS"]),
                               int(os.environ["DTENSOR_CLIENT_ID"]))
    second_start()
  else:
    import jdtensor
    jdtensor.initialize_accelerator_system("CPU")
    child = multiprocessing.get_context(mode).Process(target=second_start)
    child.start()
    child.join(60)
    print(f"CHILD exit {child.exitcode}", flush=True)
    jdtensor.barrier(jdtensor.create_distributed_mesh([("x", jdtensor.num_clients())]),
                     "end", timeout_in_ms=30_000)
