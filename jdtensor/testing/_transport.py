"""Functions and values sent to a test's client processes.

PURE: standard library only.

A test body must reach fresh processes that import its module again. Module-
level functions and classes travel by reference (pickle's way); the test body
itself, lambdas and nested functions travel by value: their compiled code
(``marshal``: the clients run the same interpreter), defaults and closure
values, re-bound to the module's globals in the client. Sending the body's
code, not its name, keeps pytest's assertion rewriting: the body the clients
run is the one pytest rewrote in the parent, so a failing ``assert a == b``
says what ``a`` and ``b`` were (pytest's helpers load only then).
"""

from __future__ import annotations

import builtins
import importlib
import io
import marshal
import pickle
import sys
import types
from typing import Any

__all__ = ["dumps", "loads", "MAIN_ALIAS"]

# The name a client gives the parent's `__main__` script when it loads it
# (its `if __name__ == "__main__":` block does not run again).
MAIN_ALIAS = "__jdtensor_main__"

# Globals pytest's rewritten asserts use (``@py_builtins``, ``@pytest_ar``).
_PYTEST_REWRITE_GLOBALS = ("@py_builtins", "@pytest_ar")


class _EmptyCell:
  """Stands for a closure cell not yet assigned (one instance, `_EMPTY`)."""

  def __reduce__(self) -> str:
    return "_EMPTY"  # Pickled as the module's singleton.


_EMPTY = _EmptyCell()


class _LazyModule(types.ModuleType):
  """A module imported on first attribute access (pytest's assertion helpers
  are needed only when an assert fails)."""

  def __init__(self, name: str):
    super().__init__(name)
    self.__dict__["_target"] = name

  def __getattr__(self, attr: str) -> Any:
    return getattr(importlib.import_module(self.__dict__["_target"]), attr)


def _names(code: types.CodeType) -> set[str]:
  out = set(code.co_names)
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      out |= _names(const)
  return out


def _module_globals(module_name: str) -> dict[str, Any]:
  if module_name == "__main__":
    # In a client, the parent's script is loaded under MAIN_ALIAS (an empty
    # module for python -c or a REPL); in the parent, it is __main__.
    module = sys.modules.get(MAIN_ALIAS) or sys.modules["__main__"]
  else:
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
  return module.__dict__


def _rebuild_function(module_name: str, code_bytes: bytes, name: str,
                      qualname: str, defaults: Any, kwdefaults: Any,
                      cells: tuple[Any, ...] | None) -> types.FunctionType:
  code = marshal.loads(code_bytes)
  scope = _module_globals(module_name)
  if "@pytest_ar" in _names(code):  # Rewritten by pytest in the parent.
    scope.setdefault("@py_builtins", builtins)
    scope.setdefault("@pytest_ar", _LazyModule("_pytest.assertion.rewrite"))
  closure = None if cells is None else tuple(
      types.CellType() if v is _EMPTY else types.CellType(v) for v in cells)
  fn = types.FunctionType(code, scope, name, defaults, closure)
  fn.__kwdefaults__ = kwdefaults
  fn.__qualname__ = qualname
  return fn


def _importable(fn: types.FunctionType) -> bool:
  """Whether pickle can send `fn` by reference: its module and qualified name
  find this very function."""
  if fn.__module__ in (None, "__main__") or "<" in fn.__qualname__:
    return False
  target: Any = sys.modules.get(fn.__module__)
  for part in fn.__qualname__.split("."):
    target = getattr(target, part, None)
  return target is fn


def _cell_value(cell: types.CellType) -> Any:
  try:
    return cell.cell_contents
  except ValueError:
    return _EMPTY


class _Pickler(pickle.Pickler):
  """Sends `by_value` and every function pickle could not find by name by
  value; modules by name."""

  def __init__(self, file: io.BytesIO, by_value: tuple[Any, ...]):
    super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
    self._by_value = {id(f) for f in by_value}

  def reducer_override(self, obj: Any) -> Any:  # pylint: disable=invalid-name
    if isinstance(obj, types.FunctionType) and (
        id(obj) in self._by_value or not _importable(obj)):
      cells = (None if obj.__closure__ is None else
               tuple(_cell_value(c) for c in obj.__closure__))
      return _rebuild_function, (obj.__module__, marshal.dumps(obj.__code__),
                                 obj.__name__, obj.__qualname__, obj.__defaults__,
                                 obj.__kwdefaults__, cells)
    if isinstance(obj, types.ModuleType):
      return importlib.import_module, (obj.__name__,)
    return NotImplemented


def dumps(value: Any, by_value: tuple[Any, ...] = ()) -> bytes:
  """`value` pickled; the functions in `by_value` always by value.

  Raises:
    TypeError: For a value that cannot be sent (the message says which and
      why), e.g. a lock, an open file, or a nested function that refers to
      itself.
  """
  buffer = io.BytesIO()
  try:
    _Pickler(buffer, by_value).dump(value)
  except RecursionError:
    raise TypeError("a nested function that refers to itself (or a cycle of "
                    "them) cannot be sent to the clients; define it at module "
                    "level.") from None
  except (pickle.PicklingError, TypeError, AttributeError) as e:
    raise TypeError(f"cannot be sent to the clients (pickle: {e}).") from None
  return buffer.getvalue()


def loads(data: bytes) -> Any:
  """The inverse of `dumps`, in a client or in the parent."""
  return pickle.loads(data)
