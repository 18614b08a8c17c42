"""export/ imports nothing of edge/, broker/, firmware_sim/ or the CLIs and lab in neurofed/ (the house import
rule, also in pyproject's import-linter contracts), checked on the AST: of NeuroFed only neurofed.trainer and
neurofed.export."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

OLD_ROOTS = ("trainer", "edge", "broker", "export", "firmware_sim")  # before the one import root
EXPORT = Path(__file__).resolve().parents[2] / "export"


def _imports(path: Path) -> list[str]:
    mods = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            mods += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.append(node.module)
    return mods


@pytest.mark.parametrize("path", sorted(EXPORT.glob("*.py")), ids=lambda p: p.name)
def test_export_imports_no_edge_broker_neurofed(path):
    bad = [m for m in _imports(path) if m.split(".")[0] in OLD_ROOTS
           or m.split(".")[0] == "neurofed" and m.split(".")[:2] not in (["neurofed", "trainer"], ["neurofed", "export"])]
    assert not bad, f"{path.name} imports {bad}"


def test_onnx_metadata_is_the_checkpoint_card(eegnet_bs):
    from neurofed.export.metadata import read_onnx_meta
    from neurofed.trainer.checkpoint import read_meta

    ckpt, onnx_path = eegnet_bs
    assert read_onnx_meta(onnx_path).model_meta() == read_meta(ckpt)
