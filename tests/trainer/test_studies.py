"""studies/headline.json, the README's headline table and the studies' summaries agree (all from the raw results)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments import studies

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "studies"


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads((STUDIES / "headline.json").read_text())


def test_headline_json_is_what_the_raw_results_give(committed):
    assert studies.compute_headline(STUDIES) == committed


def test_readme_table_is_generated_from_the_headline(committed):
    readme = (ROOT / "README.md").read_text()
    assert studies.readme_block(committed) in readme
    assert readme.count(studies.BEGIN) == 1 and readme.count(studies.END) == 1


def test_headline_rows_match_their_studies_summaries(committed):
    """Each row's mean and subject count equal its study's committed report table (``| run | n | seeds | m ± sd``)."""
    spec = {r["id"]: r for r in studies.load_rows(STUDIES)["row"]}
    for row in committed["rows"]:
        summary = (STUDIES / spec[row["id"]]["summary"]).read_text()
        label = row["run"].rsplit("/", 1)[1]
        m = re.search(rf"^\| {re.escape(label)} \| (\d+) \| (\d+) \| ([\d.]+) ± ", summary, re.M)
        assert m, f"{row['id']}: no row {label!r} in {spec[row['id']]['summary']}"
        assert int(m.group(1)) == row["n_subjects"]
        assert float(m.group(3)) == round(100 * row["bca_mean"], 1), row["id"]
        lo, hi = row["bca_ci95"]
        assert lo < row["bca_mean"] < hi and row["command"]
    best = [r for r in committed["rows"] if r["p_vs_best_reference"] is None]
    assert [r["id"] for r in best] == [committed["best_reference"]] and best[0]["kind"] == "reference"


def test_replace_block_needs_the_markers():
    with pytest.raises(NeuroFedError, match="no headline block"):
        studies.replace_block("# README without the table\n", "x")
    text = f"a\n{studies.BEGIN}\nold\n{studies.END}\nb\n"
    assert studies.replace_block(text, "NEW") == "a\nNEW\nb\n"
