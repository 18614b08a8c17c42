"""Sphinx configuration of NeuroFed's documentation site (how and why: docs/README.md).

The source directory is the repository root (``sphinx-build -c docs . OUT``) so that the Markdown pages link to
each other by their paths in the repository (``docs/protocol.md`` <-> ``studies/<name>/README.md``) exactly as
GitHub shows them; only ``docs/`` and ``studies/*/README.md`` are read. Build it with ``neurofed docs`` or
``bash scripts/docs.sh`` (warnings are errors).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "_ext"))

import neurofed  # noqa: E402  (after the path: the installed package documents itself)

project = "NeuroFed"
author = "NeuroFed contributors"
copyright = "2026, NeuroFed contributors"
release = version = neurofed.__version__

root_doc = "docs/index"
smartquotes = False  # command lines stay as typed: --seeds, not an en dash
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
# Read only the documentation: README.md, docs/ (minus the build, the extension, the examples' sources and the
# benchmarks' JSON) and the studies' Markdown. Every other top-level folder is pruned: code, node_modules and run
# outputs are never walked. Pages reached only through links (the README, the studies' reports, docs/results/
# while it exists) are read as orphans, and repository links are made to work as on GitHub (a folder -> its
# README): docs/_ext/neurofed_docs.py, read_source.
include_patterns = ["README.md", "docs/**", "studies/**/*.md"]
exclude_patterns = sorted(
    [p.name for p in ROOT.iterdir() if p.name not in ("README.md", "docs", "studies")]
    + ["docs/_build", "docs/_ext", "docs/_root", "docs/_static", "docs/examples", "docs/bench"]
)

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx.ext.intersphinx",
    "sphinxcontrib.typer",
    "sphinx_gallery.gen_gallery",
    "neurofed_docs",  # docs/_ext: the CLI, federation.toml, ONNX metadata and studies pages, generated
]

# ---- Markdown (MyST) -------------------------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 4  # GitHub-style anchors: the pages' links such as protocol.md#bytes-on-the-wire resolve
suppress_warnings: list[str] = []

# ---- API reference (autodoc, numpy docstrings) -------------------------------------------------------------------
# each object documented where it is defined: a name a module re-exports in __all__ is not documented again there
autodoc_default_options = {"members": True, "member-order": "bysource", "ignore-module-all": True}
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_attr_annotations = True
intersphinx_mapping: dict[str, tuple[str, None]] = {}  # offline builds: no inventories fetched

# ---- executed examples (sphinx-gallery) --------------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": str(HERE / "examples"),
    "gallery_dirs": str(HERE / "auto_examples"),
    "filename_pattern": r"/plot_",  # every plot_*.py is executed during the build, on the real EEG
    "download_all_examples": False,
    "write_computation_times": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
    "reset_modules": ("matplotlib",),
    "within_subsection_order": "FileNameSortKey",
    "matplotlib_animations": False,
    "image_scrapers": ("matplotlib",),
}
# the examples read $NEUROFED_DATA (the 46-subject EEGMMIDB folder) and share one fresh run directory per build
# (the second reuses the first's trained model); one torch thread, as everywhere on CI
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NEUROFED_DOCS_RUNS", tempfile.mkdtemp(prefix="neurofed-docs-"))

# ---- HTML -----------------------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"NeuroFed {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "navbar_align": "left",
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_sidebars = {"**": ["sidebar-nav-bs"]}
html_static_path = ["_static"]
html_css_files = ["neurofed.css"]  # a wider article: the reference's tables and --help boxes
html_extra_path = [str(HERE / "_root")]  # index.html at the site's root -> docs/index.html
html_show_sourcelink = False
html_copy_source = False
