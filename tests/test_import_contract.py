"""The import contract (pyproject.toml ``[tool.importlinter]``), enforced by import-linter in every test run.

trainer/ imports no transport (paho, pylsl, mne_lsl) and nothing of broker/edge/export/firmware_sim/neurofed;
firmware_sim/ imports nothing of broker/edge/export/neurofed and of trainer only ``neurofed.trainer.data``,
``neurofed.trainer.errors`` and ``neurofed.trainer.atomic``; export/ imports nothing of edge/, broker/ or neurofed/.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _contracts() -> dict[str, dict]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in cfg["contracts"]}


def test_import_contract_is_kept(monkeypatch):
    pytest.importorskip("importlinter")
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0, \
        "import contract broken: run `lint-imports` for the offending import chains"


def test_contract_covers_every_rule_and_trainer_module():
    c = _contracts()
    assert set(c["trainer-pure"]["forbidden_modules"]) >= {"broker", "edge", "export", "firmware_sim", "neurofed",
                                                           "paho", "pylsl"}
    assert set(c["export-no-edge"]["forbidden_modules"]) >= {"edge", "broker", "neurofed"}
    fw = set(c["firmware-sim-alone"]["forbidden_modules"])
    assert fw >= {"broker", "edge", "export", "neurofed"}
    # firmware_sim may use neurofed.trainer.data, neurofed.trainer.errors and neurofed.trainer.atomic (the data cache's atomic writer) only
    trainer_modules = {f"trainer.{p.stem if p.is_file() else p.name}" for p in (ROOT / "trainer").iterdir()
                       if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert trainer_modules - {"neurofed.trainer.data", "neurofed.trainer.errors", "neurofed.trainer.atomic"} == {m for m in fw if m.startswith("trainer.")}
