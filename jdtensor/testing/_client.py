"""One client of a multi-client test: ``python -m jdtensor.testing._client SPEC``.

Started by `jdtensor.testing.run_in_multi_client` through the launcher (which
sets the DTENSOR_* variables). In order: import the test's module by its path
(with the parent's ``sys.path``), receive the body and its arguments,
``initialize_accelerator_system``, run the body, and write what happened to
``client-<k>.pkl`` in the run's directory: the return value, or where it
failed (import, arguments, initialize, body, result) with the exception and
its traceback. A failure is then raised again, so the client exits non-zero
and jdtensor tells the other clients at once.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import sys
import traceback
import types
from typing import Any

from jdtensor import _env
from jdtensor.testing import _transport

__all__ = ["main"]


def _write(directory: str, client: int, record: dict[str, Any]) -> None:
  path = os.path.join(directory, f"client-{client}.pkl")
  with open(path + ".tmp", "wb") as f:
    pickle.dump(record, f)
  os.replace(path + ".tmp", path)  # The parent never reads half a record.


def _traceback_text(error: BaseException) -> str:
  """The traceback without this module's frames."""
  tb = error.__traceback__
  while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
    tb = tb.tb_next
  return "".join(traceback.format_exception(type(error), error, tb))


def _import_test_module(name: str, file: str | None) -> None:
  """Imports the module that defines the body, by name where that finds the
  same file, else from its path."""
  if name == "__main__":
    if file is None:  # python -c, a REPL: no globals to bring back.
      sys.modules[_transport.MAIN_ALIAS] = types.ModuleType(_transport.MAIN_ALIAS)
      return
    name = _transport.MAIN_ALIAS
  elif name in sys.modules:
    return
  elif file is not None:
    try:
      found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
      found = None
    if found is not None and found.origin and os.path.exists(found.origin) and (
        os.path.samefile(found.origin, file)):
      importlib.import_module(name)
      return
  if file is None:
    importlib.import_module(name)
    return
  spec = importlib.util.spec_from_file_location(name, file)
  if spec is None or spec.loader is None:
    raise ImportError(f"cannot load {file!r} as a Python module")
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise


def _to_host(value: Any, client: int) -> Any:
  """`value` with every ``jax.Array`` made a NumPy array (the parent must not
  start JAX); one that spans other clients cannot leave this process."""
  if "jax" not in sys.modules:
    return value
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  def host(leaf: Any) -> Any:
    if not isinstance(leaf, jax.Array):
      return leaf
    if not leaf.is_fully_addressable:
      raise TypeError(
          f"client {client} returned a jax.Array of shape {leaf.shape} that "
          f"spans other clients ({leaf.sharding}); return this client's part "
          "(jdtensor.unpack(x), x.addressable_data(0)) or a value every client "
          "has (jax.experimental.multihost_utils.process_allgather(x)).")
    return np.asarray(leaf)
  return jax.tree_util.tree_map(host, value)


def main(argv: list[str]) -> int:
  with open(argv[1], "rb") as f:
    header = pickle.load(f)
    payload = f.read()
  sys.path[:] = header["sys_path"] + [p for p in sys.path
                                      if p not in header["sys_path"]]
  client = _env.client_id()
  stage = "import"
  try:
    _import_test_module(header["module"], header["file"])
    stage = "arguments"
    fn, args, kwargs = _transport.loads(payload)
    stage = "initialize"
    import jdtensor  # pylint: disable=g-import-not-at-top
    jdtensor.initialize_accelerator_system(header["device_type"])
    stage = "body"
    value = fn(*args, **kwargs)
    stage = "result"
    data = _transport.dumps(_to_host(value, client))
  except BaseException as e:
    _write(header["result_dir"], client, {
        "status": "error", "stage": stage, "type": type(e).__name__,
        "message": str(e), "traceback": _traceback_text(e)})
    raise
  _write(header["result_dir"], client, {"status": "ok", "value": data})
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
