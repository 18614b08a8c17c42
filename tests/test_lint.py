"""The pinned ruff rule set (pyproject's ``[tool.ruff.lint]``) holds on the whole tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "No module named ruff" not in r.stderr, "ruff is a dev dependency: pip install -e '.[dev]'"
    assert r.returncode == 0, f"ruff check . found:\n{r.stdout}{r.stderr}"
