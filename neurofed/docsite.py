"""Build the documentation site (``neurofed docs``, ``scripts/docs.sh``): Sphinx with warnings as errors.

The site's sources live in the checkout (``docs/``, ``studies/*/README.md``; ``docs/README.md`` says how it is
built), so this needs a checkout and the ``docs`` extra (``pip install -e '.[docs]'``). The executed examples
read the real EEG (``$NEUROFED_DATA``) and cache preprocessing in ``$NEUROFED_CACHE``, as every command does.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

from neurofed.trainer.data.eegmmidb import resolve_data_dir
from neurofed.trainer.errors import NeuroFedError

logger = logging.getLogger("neurofed")

#: What the build imports (the ``docs`` extra of pyproject.toml), by import name.
DOCS_MODULES = ("sphinx", "myst_parser", "sphinx_gallery", "sphinxcontrib.typer", "pydata_sphinx_theme")


def find_checkout(start: str | os.PathLike | None = None) -> Path:
    """The checkout whose ``docs/conf.py`` builds the site: ``start`` (default the working directory) or a
    parent of it, else the checkout this package is installed from (editable install)."""
    here = Path(start or Path.cwd()).resolve()
    for p in (here, *here.parents, Path(__file__).resolve().parents[1]):
        if (p / "docs" / "conf.py").is_file() and (p / "pyproject.toml").is_file():
            return p
    raise NeuroFedError(f"no NeuroFed checkout with docs/conf.py at or above {here}: the site is built from a "
                        "clone of the repository (git clone ..., then run this inside it)")


def missing_modules() -> list[str]:
    """The ``docs`` extra's modules that are not installed."""
    out = []
    for name in DOCS_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a namespace parent (sphinxcontrib) is itself missing
            found = False
        if not found:
            out.append(name)
    return out


def sphinx_command(root: Path, out: Path, fresh: bool = False) -> list[str]:
    """The sphinx-build command line: the checkout is the source (``-c docs``), every warning is an error
    (``-W``, ``--keep-going`` so all of them are listed before it fails)."""
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-c", str(root / "docs")]
    if fresh:
        cmd.append("-E")  # a fresh environment: every page read again (the examples re-run when they changed)
    return [*cmd, str(root), str(out)]


def build_docs(root: str | os.PathLike | None = None, out: str | os.PathLike | None = None,
               fresh: bool = False) -> Path:
    """Build the site with warnings as errors; returns the path of its ``index.html``.

    Parameters
    ----------
    root : path, optional
        The checkout (default: found from the working directory, see :func:`find_checkout`).
    out : path, optional
        Output folder (default ``docs/_build/html`` in the checkout).
    fresh : bool
        Read every page again (``sphinx-build -E``) rather than only those that changed.

    Raises
    ------
    NeuroFedError
        No checkout, the ``docs`` extra missing, no EEG data for the examples, or a build with a warning.
    """
    root = find_checkout(root)
    missing = missing_modules()
    if missing:
        raise NeuroFedError(f"the docs extra is not installed ({', '.join(missing)} missing): run "
                            f"`pip install -e '{root}[docs]'` or `bash scripts/docs.sh`")
    resolve_data_dir(None)  # the executed examples need the EEG: one clear line now, not a traceback mid-build
    out = Path(out) if out is not None else root / "docs" / "_build" / "html"
    cmd = sphinx_command(root, out, fresh)
    logger.info("building the docs: %s", " ".join(cmd))
    rc = subprocess.run(cmd, cwd=root).returncode
    if rc != 0:
        raise NeuroFedError(f"the docs build failed (sphinx-build exit {rc}; warnings are errors): the lines "
                            "above name each problem")
    index = out / "docs" / "index.html"
    if not index.is_file():
        raise NeuroFedError(f"the docs build wrote no {index}")
    return index
