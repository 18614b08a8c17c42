"""``neurofed sweep``: attacks on the models a run saved reproduce the run's own inline attacks, resume, refuse."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from neurofed.trainer.data import PreprocessConfig
from neurofed.trainer.data.config import SENSORIMOTOR_21
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments import sweep as sweep_mod
from neurofed.trainer.experiments.simulate import SimConfig, run_simulation
from neurofed.trainer.fl.local import LocalConfig


def _cfg(data_dir, **kw) -> SimConfig:
    base = {"algorithm": "fedbs", "subjects": [1, 2, 3, 4], "protocol": "kfold:2", "rounds": 1, "fraction": 1.0,
            "local": LocalConfig(local_epochs=1).to_dict(), "eval_every": 0, "data_dir": str(data_dir), "folds": [0],
            "preprocess": PreprocessConfig(channels=SENSORIMOTOR_21, resample=80.0).to_dict(),
            "attacks": [["fgsm", 0.03]]}
    return SimConfig(**{**base, **kw})


@pytest.fixture
def saved_run(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("NEUROFED_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    res = run_simulation(_cfg(data_dir, save_models=True), run)
    return run, res


def test_sweep_of_saved_models_equals_the_runs_inline_attack(saved_run, monkeypatch):
    run, _ = saved_run
    (job,) = sorted((run / "jobs").glob("*.json"))
    assert job.with_suffix(".safetensors").exists()
    out = sweep_mod.sweep_run(run, [("fgsm", 0.03), ("fgsm", 0.1)])
    inline = json.loads(job.read_text())["per_subject"]
    assert 0 < json.loads(job.read_text())["eval_seconds"] < 600  # the final evaluation, timed apart from training
    assert set(out["per_subject"]) == set(inline)
    for s, row in inline.items():  # same model, same held-out trials, same seed: the same numbers exactly
        assert out["per_subject"][s]["bca"] == row["bca"]
        assert out["per_subject"][s]["fgsm@0.03"] == row["fgsm@0.03"]
        assert out["per_subject"][s]["fgsm@0.1"] <= row["bca"]
    assert out["summary"]["fgsm@0.1"]["mean"] <= out["summary"]["fgsm@0.03"]["mean"] + 0.05
    assert json.loads((run / "sweep.json").read_text())["summary"] == out["summary"]

    def no_eval(*a, **k):
        raise AssertionError("a finished sweep was computed again")

    monkeypatch.setattr("neurofed.trainer.experiments.runner.evaluate_subjects", no_eval)
    again = sweep_mod.sweep_run(run, [("fgsm", 0.1)])  # a subset of what is kept: nothing to compute
    assert again["per_subject"] == {s: {k: r[k] for k in ("bca", "fgsm@0.1")} for s, r in out["per_subject"].items()}
    # the file still summarises every budget the jobs hold, not only the last command's
    kept = json.loads((run / "sweep.json").read_text())
    assert kept["summary"] == out["summary"] and kept["attacks"] == [["fgsm", 0.1], ["fgsm", 0.03]]
    # a fresh clone has the kept results (git) but not the models (*.safetensors are not committed): kept results
    # still read; anything new needs the model and says so
    job.with_suffix(".safetensors").unlink()
    assert sweep_mod.sweep_run(run, [("fgsm", 0.03)])["summary"]["fgsm@0.03"] == out["summary"]["fgsm@0.03"]
    with pytest.raises(NeuroFedError, match="is missing"):
        sweep_mod.sweep_run(run, [("fgsm", 0.05)])


def test_sweep_cli_prints_a_table_and_draws_the_plot(saved_run, tmp_path):
    from neurofed.cli import app

    run, _ = saved_run
    png = tmp_path / "new" / "eps.png"  # a folder that does not exist yet is made
    r = CliRunner().invoke(app, ["sweep", str(run), str(run), "--names", "a,b", "--attack", "fgsm:0.03,pgd:0.03",
                                 "--plot", str(png)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "| fgsm@0.03 |" in r.output and "| pgd@0.03 |" in r.output and "p b vs a" in r.output
    assert png.stat().st_size > 1000


def test_run_without_saved_models_is_refused_by_name(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("NEUROFED_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "plain"
    run_simulation(_cfg(data_dir), run)
    with pytest.raises(NeuroFedError, match="without --save-models"):
        sweep_mod.sweep_run(run, [("fgsm", 0.03)])
    with pytest.raises(NeuroFedError, match="no config.json"):
        sweep_mod.sweep_run(tmp_path, [("fgsm", 0.03)])


def test_save_models_does_not_change_the_run(data_dir):
    """--save-models is output only: a run may be resumed with it on, and trains the same."""
    from dataclasses import asdict

    from neurofed.trainer.experiments.simulate import run_differences

    a, b = asdict(_cfg(data_dir)), asdict(_cfg(data_dir, save_models=True))
    assert run_differences(a, b) == [] and run_differences(b, a) == []


@pytest.mark.integration
def test_workers_and_seeds_give_the_same_numbers(data_dir, tmp_path, monkeypatch):
    """Two seeds' jobs attacked by two processes equal the one-at-a-time sweep; --seeds keeps only its jobs."""
    monkeypatch.setenv("NEUROFED_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a", tmp_path / "b"
    for run in (a, b):
        run_simulation(_cfg(data_dir, save_models=True, seeds=[0, 1]), run)
    seq = sweep_mod.sweep_runs([a], [("fgsm", 0.05)])[str(a)]
    par = sweep_mod.sweep_runs([b], [("fgsm", 0.05)], workers=2)[str(b)]
    assert seq["jobs"] == par["jobs"] == 2 and seq["seeds"] == par["seeds"] == [0, 1]
    assert seq["per_subject"] == par["per_subject"] and seq["summary"] == par["summary"]
    one = sweep_mod.sweep_runs([a], [("fgsm", 0.05)], seeds=[1])[str(a)]
    assert one["jobs"] == 1 and one["seeds"] == [1]
    # a sweep of some seeds has its own file: the summary of all seeds stays
    assert json.loads((a / "sweep_seeds1.json").read_text())["seeds"] == [1]
    assert json.loads((a / "sweep.json").read_text())["seeds"] == [0, 1]
    with pytest.raises(NeuroFedError, match="no finished job of seeds"):
        sweep_mod.sweep_runs([a], [("fgsm", 0.05)], seeds=[5])


def test_default_threads_follow_omp_num_threads(monkeypatch):
    """A job's torch threads: $OMP_NUM_THREADS when it is a positive integer, else cores / workers."""
    import os

    from neurofed.trainer.experiments.simulate import default_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_threads(1) == default_threads(4) == 3
    for bad in ("0", "", "two"):
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        assert default_threads(1) == max(1, os.cpu_count() or 1) and default_threads(10_000) == 1
