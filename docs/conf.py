"""Sphinx configuration of the kelr_dist documentation.

Build (from the repository root, after ``pip install ".[docs]"``)::

    sphinx-build -W -b html docs docs/_build/html
"""

from __future__ import annotations

from importlib.metadata import version as _version

project = "kelr_dist"
author = "kelr_dist authors"
copyright = "2026, kelr_dist authors"
release = _version("kelr_dist")
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]

# every cross-reference must resolve: a broken one fails the build (with -W)
nitpicky = True

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# the tables under benchmarks/ and figures/ are written by the scripts that measure them and
# included by benchmarks.md, not pages of their own
exclude_patterns = ["_build", "benchmarks/*", "figures/*"]

# MyST: $...$ and $$...$$ math, ::: fences, heading anchors for cross-page links
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# numpydoc: the package's docstrings are numpy-style; class members are listed by autodoc,
# not by numpydoc's tables, and the docstrings are not validated against numpydoc's rules
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks: set[str] = set()
numpydoc_xref_param_type = False

autosummary_generate = True
autodoc_typehints = "none"  # the signatures and the docstrings' types say it
autodoc_member_order = "bysource"

# the examples run when the docs are built: small trajectories (1e5 samples) on an embedded
# cluster of one worker, a few minutes on 2 cores in all
sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "matplotlib_animations": False,
    "within_subsection_order": "FileNameSortKey",
}

html_theme = "pydata_sphinx_theme"
html_title = "kelr_dist"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_show_sourcelink = False
