"""``neurofed bench train``: the step-cost benchmark writes its JSON with wall and CPU ratios."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from neurofed.cli import app


def test_bench_train_writes_step_cost_ratios(tmp_path):
    res = CliRunner().invoke(app, ["bench", "train", "--steps", "2", "--batch-size", "8", "--models", "eegnet",
                                   "--out-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "train.json").read_text())
    assert [r["model"] for r in out["rows"]] == ["eegnet", "eegnet"]  # both input shapes
    for r in out["rows"]:
        # what the cost ratios track, counted (timings themselves are the benchmark's, not a test's, to judge):
        # SAM takes two forward/backward passes per step and SAFE three (FGSM, first pass, perturbed pass)
        assert r["forward_passes_per_step"] == {"sgd": 1, "sam": 2, "safe": 3}
        assert r["sgd_step_ms"] > 0 and r["sgd_step_cpu_ms"] > 0
        assert all(r[k] > 0 for k in ("sam_over_sgd", "safe_over_sgd", "sam_over_sgd_cpu", "safe_over_sgd_cpu"))
    assert "--models eegnet" in out["command"]
