"""Classical references on real subjects: they run on NeuroFed's fold split, leave chance, and report as rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from neurofed.trainer.data import PreprocessConfig
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments.classical import (
    METHOD_EA,
    METHODS,
    ClassicalConfig,
    recentred_covariances,
    run_classical,
)
from neurofed.trainer.experiments.protocol import make_folds

SUBJECTS = [1, 2, 3, 4]


@pytest.mark.parametrize("method", METHODS)
def test_pipeline_on_fold_split_leaves_chance(method, data_dir, tmp_path):
    pre = PreprocessConfig.from_preset("sensorimotor21", resample=80.0, ea=METHOD_EA[method])
    cfg = ClassicalConfig(method=method, subjects=SUBJECTS, protocol="kfold:2", seeds=[0],
                          preprocess=pre.to_dict(), data_dir=str(data_dir))
    res = run_classical(cfg, tmp_path / method)
    folds = make_folds(SUBJECTS, "kfold:2", 0)
    jobs = [json.loads((tmp_path / method / "jobs" / f"seed0_fold{k:02d}.json").read_text()) for k in range(2)]
    assert [j["test_subjects"] for j in jobs] == [[f"S{s:03d}" for s in f] for f in folds]
    assert sorted(res["per_subject"]) == [f"S{s:03d}" for s in SUBJECTS]
    # measured: csp-lda 0.72, riemann 0.68 mean BCA on S001-S004 (2 training subjects per fold)
    assert res["summary"]["bca"]["mean"] > 0.6
    assert (tmp_path / method / "results.json").is_file()


def test_recentring_makes_each_subject_mean_identity(subjects4):
    from pyriemann.utils.mean import mean_riemann

    covs = recentred_covariances(subjects4[:2])
    for c in covs:
        np.testing.assert_allclose(mean_riemann(c), np.eye(c.shape[1]), atol=1e-4)


def test_report_shows_classical_rows_next_to_deep_runs(data_dir, tmp_path):
    from neurofed.cli import app

    pre = PreprocessConfig.from_preset("sensorimotor21", resample=80.0, ea=True)
    run_classical(ClassicalConfig(method="csp-lda", subjects=SUBJECTS, protocol="kfold:2", seeds=[0, 1],
                                  preprocess=pre.to_dict(), data_dir=str(data_dir)), tmp_path / "csp-lda")
    res = CliRunner().invoke(app, ["report", str(tmp_path / "csp-lda"), "--refs", "csp-lda",
                                   "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert "| csp-lda | 4 | 2 |" in (tmp_path / "rep" / "report.md").read_text()


def test_bad_method_is_one_clear_error():
    with pytest.raises(NeuroFedError, match="--method"):
        ClassicalConfig(method="svm")


@pytest.mark.parametrize("method", METHODS)
def test_black_box_attack_on_classical_stays_in_budget(method, subjects4, monkeypatch):
    from neurofed.trainer import art_attacks
    from neurofed.trainer.art_attacks import blackbox_on_scores
    from neurofed.trainer.attacks import channel_budget
    from neurofed.trainer.experiments.classical import build_pipeline, scorer

    monkeypatch.setitem(art_attacks.LIBRARY_BUDGETS, "square", {"queries": 30, "restarts": 1, "p_init": 0.8})
    train, sd = subjects4[:3], subjects4[3]
    from neurofed.trainer.experiments.classical import _features

    pipe = build_pipeline(method).fit(np.concatenate(_features(method, train)), np.concatenate([s.y for s in train]))
    score = scorer(method, pipe, sd)
    xb, yb = sd.X[:8], sd.y[:8]
    xa = blackbox_on_scores("square", score, xb, yb, 0.1, seed=0)
    import torch

    assert np.all(np.abs(xa - xb) <= channel_budget(torch.as_tensor(xb), 0.1).numpy() * (1 + 1e-4) + 1e-6)
    clean_loss = -np.log(score(xb)[np.arange(8), yb]).mean()
    assert -np.log(score(xa)[np.arange(8), yb]).mean() >= clean_loss - 1e-9  # Square only accepts improvements


def test_rerun_resumes_finished_folds(data_dir, tmp_path):
    pre = PreprocessConfig.from_preset("sensorimotor21", resample=80.0, ea=True)
    cfg = ClassicalConfig(method="csp-lda", subjects=SUBJECTS, protocol="kfold:2", seeds=[0],
                          preprocess=pre.to_dict(), data_dir=str(data_dir))
    first = run_classical(cfg, tmp_path / "r")
    job = tmp_path / "r" / "jobs" / "seed0_fold00.json"
    marked = json.loads(job.read_text())
    marked["per_subject"] = {s: {"bca": 0.0} for s in marked["per_subject"]}  # a finished job is not recomputed
    job.write_text(json.dumps(marked))
    again = run_classical(cfg, tmp_path / "r")
    assert all(again["per_subject"][s]["bca"] == 0.0 for s in marked["per_subject"])
    assert again["per_subject"] != first["per_subject"]
    with pytest.raises(NeuroFedError, match="different configuration"):
        run_classical(ClassicalConfig(**{**cfg.__dict__, "n_components": 4}), tmp_path / "r")
