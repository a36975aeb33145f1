"""Sphinx configuration: MyST Markdown pages, an API reference from the docstrings.

Build (warnings are errors, as in CI): ``bash tests/envs.sh docs``, or
``pip install -e '.[docs]' && sphinx-build -W --keep-going -b html docs docs/_build/html``.
"""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # Without installing jdtensor.

project = "jdtensor"
author = "the jdtensor authors"
copyright = "2026, the jdtensor authors"  # pylint: disable=redefined-builtin
release = version = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style docstrings.
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # `[text](page.md#a-heading)` links resolve.

# Documenting jdtensor imports its modules, none of which imports jax at
# module level (the architecture test checks it): no backend starts.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "jdtensor"
