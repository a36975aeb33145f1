"""The documentation's examples run, as a reader runs them, so none can go stale.

Every Python example in the guides is a file under ``docs/examples/`` that
the pages include (`literalinclude`); its docstring says how to run it
(``Run:``), what its output must contain (``Expect:``), when it is not 0,
its exit code (``Exit:``), and the modules it needs beyond jdtensor's own
(``Needs:``; skipped where one is missing: the integration environment has
them). The README's example is one of those files,
word for word. The docs build itself (Sphinx, warnings as errors) runs in its
own environment: ``bash tests/envs.sh docs``.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

from jdtensor.launcher.processes import stop_process_groups
from tests.helpers import REPO, clean_env

DOCS = pathlib.Path(REPO) / "docs"
EXAMPLES = DOCS / "examples"
README = pathlib.Path(REPO) / "README.md"
PAGES = sorted(DOCS.rglob("*.md")) + [pathlib.Path(REPO) / "CONTRIBUTING.md"]
INCLUDE = re.compile(r"```\{literalinclude\} ([^\s`]+)\n((?::[\w-]+:.*\n)*)")


def _examples() -> list[pathlib.Path]:
  return sorted(EXAMPLES.glob("*.py"))


def _header(path: pathlib.Path) -> tuple[str, list[str], int]:
  text = path.read_text()
  run = re.findall(r"^Run: (.+)$", text, re.M)
  assert len(run) == 1, f"{path.name}: its docstring needs one 'Run: <command>' line"
  exit_code = re.findall(r"^Exit: (\d+)$", text, re.M)
  return run[0], re.findall(r"^Expect: (.+)$", text, re.M), int(exit_code[0]) if exit_code else 0


@pytest.mark.multiprocess
@pytest.mark.parametrize("example", [p.name for p in _examples()])
def test_every_example_runs_as_its_page_says(example, tmp_path):
  command, expected, exit_code = _header(EXAMPLES / example)
  for module in re.findall(r"^Needs: (.+)$", (EXAMPLES / example).read_text(), re.M):
    if importlib.util.find_spec(module.split(".")[0]) is None:
      pytest.skip(f"{example} needs {module} (pip install -e '.[integration]')")
  env = clean_env(CHECKPOINTS=str(tmp_path))
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
  proc = subprocess.Popen(["bash", "-c", command], cwd=EXAMPLES, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)
  try:
    out, _ = proc.communicate(timeout=300)
  except subprocess.TimeoutExpired:
    stop_process_groups([proc], grace=3)
    out, _ = proc.communicate(timeout=10)
    raise AssertionError(f"{command!r} exceeded 300 s:\n{out}")
  assert proc.returncode == exit_code, f"{command!r} exited {proc.returncode}:\n{out}"
  for line in expected:
    assert line in out, f"{command!r}: no {line!r} in its output:\n{out}"


def test_every_python_example_in_the_docs_is_an_included_file():
  """No inline Python in a page (it could go stale unseen): every example is
  a file that exists and that some page includes."""
  included = set()
  for page in PAGES:
    text = page.read_text()
    assert not re.search(r"^```(python|py|\{code-block\} python)\s*$", text, re.M), (
        f"{page.relative_to(REPO)}: put the example in docs/examples/ and "
        "include it with {literalinclude}")
    for target, options in INCLUDE.findall(text):
      path = (page.parent / target).resolve()
      assert path.is_file(), f"{page.relative_to(REPO)} includes {target}, which is missing"
      included.add(path)
      source = path.read_text()
      for option, value in re.findall(r"^:([\w-]+): (.*)$", options, re.M):
        marker = f"def {value}(" if option == "pyobject" else value
        assert option == "language" or marker in source, (
            f"{page.relative_to(REPO)}: {target} has no {marker!r} (:{option}:)")
  orphans = [p.name for p in _examples() if p.resolve() not in included]
  assert not orphans, f"examples no page shows: {orphans}"


def test_the_readmes_python_is_a_docs_example_word_for_word():
  """GitHub shows no includes: the README's example is a copy, kept equal."""
  blocks = re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.S | re.M)
  assert blocks, "the README shows a complete example"
  examples = {p.read_text(): p.name for p in _examples()}
  for block in blocks:
    assert block in examples, ("a Python block in the README is not a file of "
                               f"docs/examples/ word for word:\n{block}")


def test_every_page_is_in_a_table_of_contents():
  index = (DOCS / "index.md").read_text()
  for page in DOCS.rglob("*.md"):
    name = str(page.relative_to(DOCS).with_suffix(""))
    if name != "index":
      assert re.search(rf"^{re.escape(name)}$", index, re.M), f"{name} is in no toctree"


def test_the_readme_is_short_and_its_links_resolve():
  """A newcomer's five minutes: at most about 200 lines, every link a file."""
  text = README.read_text()
  assert len(text.splitlines()) <= 200
  for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
    assert (pathlib.Path(REPO) / target).is_file(), f"README links to {target}, missing"


REFERENCE_MODULES = re.findall(r"^\.\. automodule:: (\S+)$",
                               (DOCS / "reference" / "api.md").read_text(), re.M)


def test_every_public_name_in_the_reference_has_a_docstring():
  """The API reference is the docstrings: a public function, class or method
  without one would be an empty entry. Every module of jdtensor's public
  surface is in the reference."""
  import importlib  # pylint: disable=g-import-not-at-top
  import inspect  # pylint: disable=g-import-not-at-top
  import jdtensor  # pylint: disable=g-import-not-at-top
  missing = sorted({jdtensor._EXPORTS[n] for n in jdtensor.__all__  # pylint: disable=protected-access
                    if n in jdtensor._EXPORTS} - set(REFERENCE_MODULES))  # pylint: disable=protected-access
  assert not missing, f"modules of jdtensor.__all__ not in docs/reference/api.md: {missing}"
  bare = []
  for name in REFERENCE_MODULES:
    module = importlib.import_module(name)
    for attr in module.__all__:
      obj = getattr(module, attr)
      if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        continue
      members = [(attr, obj)] + [
          (f"{attr}.{k}", v) for k, v in vars(obj).items()
          if inspect.isclass(obj) and not k.startswith("_") and inspect.isfunction(v)]
      bare += [f"{name}.{n}" for n, o in members if not (o.__doc__ or "").strip()]
  assert not bare, f"public names without a docstring: {bare}"
