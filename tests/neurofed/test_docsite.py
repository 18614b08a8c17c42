"""``neurofed docs`` (neurofed/docsite.py): where it builds from, what it runs, and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from neurofed.cli import app
from neurofed.docsite import build_docs, find_checkout, sphinx_command
from neurofed.trainer.errors import NeuroFedError

ROOT = Path(__file__).resolve().parents[2]


def test_finds_the_checkout_from_inside_it():
    assert find_checkout(ROOT / "docs" / "tutorials") == ROOT


def test_sphinx_runs_with_warnings_as_errors_from_the_checkout():
    cmd = sphinx_command(ROOT, ROOT / "out", fresh=True)
    assert cmd[1:3] == ["-m", "sphinx"] and "-W" in cmd and "--keep-going" in cmd and "-E" in cmd
    assert cmd[cmd.index("-c") + 1] == str(ROOT / "docs") and cmd[-2:] == [str(ROOT), str(ROOT / "out")]
    assert "-E" not in sphinx_command(ROOT, ROOT / "out")


def test_missing_docs_extra_is_one_line(monkeypatch):
    monkeypatch.setattr("neurofed.docsite.missing_modules", lambda: ["sphinx"])
    with pytest.raises(NeuroFedError, match=r"docs extra is not installed \(sphinx missing\).*scripts/docs.sh"):
        build_docs(ROOT)


def test_cli_outside_a_checkout_is_one_clear_error(tmp_path, monkeypatch):
    """Outside a clone (and installed from none): the NeuroFedError that ``run_cli`` prints as one line, exit 2."""
    import neurofed.docsite

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(neurofed.docsite, "__file__", str(tmp_path / "site-packages" / "neurofed" / "docsite.py"))
    res = CliRunner().invoke(app, ["docs"])
    assert res.exit_code != 0 and isinstance(res.exception, NeuroFedError)
    assert "no NeuroFed checkout with docs/conf.py" in str(res.exception)
