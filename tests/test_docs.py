"""The documentation site's generated pages (docs/_ext/neurofed_docs.py), without building the site.

The build itself (Sphinx, -W, the executed examples) runs in CI after the tests: ``bash scripts/docs.sh``.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def nd():
    """docs/_ext/neurofed_docs.py, imported by path (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("neurofed_docs", ROOT / "docs" / "_ext" / "neurofed_docs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("neurofed_docs", mod)
    spec.loader.exec_module(mod)
    return mod


def test_cli_reference_lists_every_command_of_every_console_script(nd):
    """Every command reachable from each [project.scripts] app has a section and a directive on the reference
    page, and a help text: a new command without a docstring fails here."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    apps = nd.script_apps(ROOT)
    assert set(apps) == set(scripts)
    rst, objects = nd.cli_reference(apps)
    paths = [p for name, app in apps.items() for p, _ in nd.walk_commands(app, (name,))]
    assert len(paths) > len(scripts)  # the walk reaches the subcommands (and nested groups: neurofed bench e2e)
    assert ("neurofed", "bench", "e2e") in paths and ("edge-client", "join") in paths
    for path in paths:
        assert f"   :prog: {' '.join(path)}\n" in rst, f"{' '.join(path)} missing from the CLI reference"
    assert len(objects) == len(paths) == rst.count(".. typer:: neurofed_docs.")
    assert nd.undocumented_commands(apps) == [], "commands without a help text (give them a docstring)"


def test_federation_reference_has_every_key_with_a_meaning(nd):
    from neurofed.broker.config import FederationConfig

    rows = {r[0].strip("`"): r for r in nd.federation_rows()}
    for name, field in FederationConfig.model_fields.items():
        section = field.alias or name  # the TOML name (``[async]`` is the field ``async_``)
        sub = getattr(field.annotation, "model_fields", None)
        if sub is None:  # [preprocess] and [local]: the dataclasses' fields
            assert any(k.startswith(f"{section}.") for k in rows), section
            continue
        for key in sub:
            assert f"{section}.{key}" in rows, f"{section}.{key} missing"
            assert rows[f"{section}.{key}"][4], f"{section}.{key} has no description (Field(description=...))"
    assert rows["federation.rounds"][2] == "``3``" and rows["preprocess.resample"][2] == "``80.0``"
    assert "lr" in {k.split(".")[1] for k in rows if k.startswith("local.")}
    page = nd.federation_reference()
    for key in rows:
        assert f"\n``{key}`` (" in page, key
    assert "```toml" in page  # and the docstring's example
    assert "``federation.fraction`` (float, default ``0.5``, > ``0``, ≤ ``1``)\n: clients per round" in page


def test_onnx_metadata_reference_covers_the_model_card(nd):
    from neurofed.export.decoder import StandaloneInfo
    from neurofed.export.runtime import OnnxModelMeta

    page = nd.onnx_metadata_reference()
    for key in [*OnnxModelMeta.model_fields, *(f[0] for f in nd.model_fields(StandaloneInfo))]:
        assert f"\n``{key}`` (" in page, key
    assert "Class names in logit order." in page  # ModelMeta's numpy docstring reaches the table
    assert "``state_size`` (integer, required)" in page


def test_studies_index_with_and_without_studies(nd, tmp_path):
    assert "No study is published" in nd.studies_index(tmp_path)
    for name in ("b_second", "a_first"):
        (tmp_path / "studies" / name).mkdir(parents=True)
        (tmp_path / "studies" / name / "README.md").write_text(f"# {name}\n")
    (tmp_path / "studies" / "no_readme").mkdir()
    page = nd.studies_index(tmp_path)
    assert "/studies/a_first/README\n/studies/b_second/README\n" in page and "no_readme" not in page


def test_repository_links_work_as_on_github(nd, tmp_path):
    (tmp_path / "study" / "sub").mkdir(parents=True)
    (tmp_path / "study" / "README.md").write_text("# s\n")
    (tmp_path / "outside.md").write_text("x\n")
    text = ("[s](study) [s2](study/#verdict) [folder](study/sub) [o](outside.md) [gone](missing.md) "
            "[web](https://example.org) ![img](study)\n```\n[s](study)\n```\n")
    out = nd.rewrite_links(text, tmp_path, lambda p: p.name == "README.md")
    assert out == ("[s](study/README.md) [s2](study/README.md#verdict) folder [o](path:outside.md) "
                   "[gone](missing.md) [web](https://example.org) ![img](study)\n```\n[s](study)\n```\n")


def test_pages_in_no_toctree_are_found(nd, tmp_path):
    docs = tmp_path / "docs"
    (docs / "guide").mkdir(parents=True)
    (docs / "index.md").write_text("# i\n\n```{toctree}\n:glob:\n\nlisted\nguide/*\n```\n")
    for page in ("listed.md", "guide/one.md", "new_page.md", "_generated/cli.rst", "results/old.md"):
        (docs / page).parent.mkdir(parents=True, exist_ok=True)
        (docs / page).write_text("# p\n")
    assert nd.uncovered_pages(tmp_path) == ["docs/new_page"]
    assert "/docs/new_page" in nd.more_pages(tmp_path)


def test_orphans_are_the_pages_reached_by_links_only(nd):
    orphan = nd.ORPHANS.fullmatch
    assert orphan("README") and orphan("studies/README") and orphan("studies/table46/report/report")
    assert orphan("studies/fleeg/table") and orphan("docs/results/x/report")
    assert not orphan("studies/fleeg/README") and not orphan("docs/methods")


def test_optional_toctree_entries_appear_once_their_page_exists(nd, tmp_path):
    (tmp_path / "there.md").write_text("# t\n")
    text = "```{toctree}\n:maxdepth: 1\n\nfirst\n?there\n?not_yet\n```\n?not_a_toctree_line\n"
    out = nd.optional_entries(text, tmp_path, lambda p: p.with_suffix(".md").is_file())
    assert out == "```{toctree}\n:maxdepth: 1\n\nfirst\nthere\n```\n?not_a_toctree_line\n"
