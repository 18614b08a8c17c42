"""``neurofed ensemble``: a one-member ensemble is its member; averaging follows the softmax mean; bad runs refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from neurofed.trainer.data import PreprocessConfig
from neurofed.trainer.data.config import SENSORIMOTOR_21
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments import ensemble as ens
from neurofed.trainer.experiments.simulate import SimConfig, run_simulation
from neurofed.trainer.fl.local import LocalConfig


def _cfg(data_dir, **kw) -> SimConfig:
    base = {"algorithm": "fedavg", "subjects": [1, 2, 3, 4], "protocol": "kfold:2", "rounds": 1, "fraction": 1.0,
            "local": LocalConfig(local_epochs=1).to_dict(), "eval_every": 0, "data_dir": str(data_dir),
            "preprocess": PreprocessConfig(channels=SENSORIMOTOR_21, resample=80.0).to_dict(), "save_models": True}
    return SimConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    """Two seeds of FedAvg (2 folds each) and one seed of FedBS, all with saved models."""
    root = tmp_path_factory.mktemp("ens")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEUROFED_CACHE", str(root / "cache"))
        run_simulation(_cfg(data_dir, seeds=[0, 1]), root / "fedavg")
        run_simulation(_cfg(data_dir, algorithm="fedbs", seeds=[0]), root / "fedbs")
    return root


def test_softmax_rows_sum_to_one_and_keep_the_argmax():
    z = np.array([[1000.0, 999.0], [-3.0, 2.0]])
    p = ens.softmax(z)
    assert np.allclose(p.sum(1), 1) and np.array_equal(p.argmax(1), z.argmax(1))
    assert np.isclose(p[0, 0], 1 / (1 + np.exp(-1.0)))


def test_one_member_ensemble_is_the_member(runs):
    """Seed 0 alone: each subject's ensemble BCA equals the job's own benign BCA (the same model, trials, batches)."""
    res = ens.ensemble_runs([runs / "fedavg"], seeds=[0])
    jobs = {s: r["bca"] for jp in (runs / "fedavg" / "jobs").glob("seed0_fold*.json")
            for s, r in json.loads(jp.read_text())["per_subject"].items()}
    assert set(res["per_subject"]) == set(jobs) == {"S001", "S002", "S003", "S004"}
    for s, row in res["per_subject"].items():
        assert row["bca"] == row["member_bca"] == jobs[s] and row["members"] == 1


def test_ensemble_averages_softmax_of_every_member(runs, monkeypatch):
    """Three members per fold (FedAvg seeds 0, 1 and FedBS seed 0): the ensemble's prediction is the arg-max of
    their mean softmax, checked against a hand computation from each member's logits."""
    from neurofed.trainer.checkpoint import load_checkpoint
    from neurofed.trainer.evaluate import bca, logits
    from neurofed.trainer.experiments.sweep import held_out_subjects, run_config

    res = ens.ensemble_runs([runs / "fedavg", runs / "fedbs"])
    assert res["ensemble"]["seeds"] is None and len(res["ensemble"]["members"]) == 6
    assert res["algorithm"] == "ensemble(fedavg+fedbs)" and set(res["per_seed"]) == {"0"}
    cfg = run_config(runs / "fedavg")
    for fold in (0, 1):
        members = [runs / "fedavg" / "jobs" / f"seed{sd}_fold{fold:02d}" for sd in (0, 1)]
        members.append(runs / "fedbs" / "jobs" / f"seed0_fold{fold:02d}")
        job = json.loads(members[0].with_suffix(".json").read_text())
        for sd in held_out_subjects(cfg, job):
            probs = [ens.softmax(logits(load_checkpoint(m.with_suffix(".safetensors"))[0], sd.X, 8)) for m in members]
            assert res["per_subject"][sd.subject]["bca"] == bca(sd.y, np.mean(probs, 0).argmax(1))
            assert np.isclose(res["per_subject"][sd.subject]["member_bca"],
                              np.mean([bca(sd.y, p.argmax(1)) for p in probs]))


def test_cli_writes_a_results_json_that_report_reads(runs, tmp_path):
    from neurofed.cli import app

    out = tmp_path / "ens"
    r = CliRunner().invoke(app, ["ensemble", str(runs / "fedavg"), "--seeds", "0,1", "--out", str(out)],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "2 members" not in r.output and "4 members" in r.output and "members alone" in r.output
    rep = CliRunner().invoke(app, ["report", str(runs / "fedavg"), str(out), "--out", str(tmp_path / "rep")],
                             env={"COLUMNS": "200"})
    assert rep.exit_code == 0, rep.output
    assert "ens" in (tmp_path / "rep" / "report.md").read_text()


def test_refuses_runs_split_differently_or_without_models(runs, data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("NEUROFED_CACHE", str(tmp_path / "cache"))
    other = tmp_path / "other"
    run_simulation(_cfg(data_dir, subjects=[1, 2, 3, 5], folds=[0]), other)
    with pytest.raises(NeuroFedError, match="subjects or test batch differ"):
        ens.ensemble_runs([runs / "fedavg", other])
    plain = tmp_path / "plain"
    run_simulation(_cfg(data_dir, save_models=False, folds=[0]), plain)
    with pytest.raises(NeuroFedError, match="without --save-models"):
        ens.ensemble_runs([plain])
    with pytest.raises(NeuroFedError, match="no finished job of seeds"):
        ens.ensemble_runs([runs / "fedavg"], seeds=[7])


def test_test_batch_override_changes_batch_specific_bn_only(runs):
    """FedAvg (running BN statistics) gives the same predictions in any batch size; FedBS (batch-specific BN)
    normalises over the batch, so a whole-subject batch may differ from batches of 8; bad sizes are refused."""
    a = ens.ensemble_runs([runs / "fedavg"], seeds=[0])
    b = ens.ensemble_runs([runs / "fedavg"], seeds=[0], test_batch=64)
    assert {s: r["bca"] for s, r in a["per_subject"].items()} == {s: r["bca"] for s, r in b["per_subject"].items()}
    assert b["ensemble"]["test_batch"] == 64 and a["ensemble"]["test_batch"] == 8
    with pytest.raises(NeuroFedError, match="test batch must be >= 1"):
        ens.ensemble_runs([runs / "fedavg"], test_batch=-1)


# ------------------------------------------------------------------ one checkpoint: `neurofed combine`
def test_softmax_ensemble_is_the_log_of_the_mean_probability():
    """Hand case: two fixed 'members' with known logits; one member gives its own log-softmax."""
    import torch

    from neurofed.trainer.models.ensemble import SoftmaxEnsemble

    class Fixed(torch.nn.Module):
        def __init__(self, z):
            super().__init__()
            self.z = torch.tensor(z)

        def forward(self, x):
            return self.z.expand(len(x), -1)

    x = torch.zeros(3, 1)
    a, b = [2.0, 0.0], [0.0, 1.0]
    pa = np.exp(a) / np.exp(a).sum()
    pb = np.exp(b) / np.exp(b).sum()
    out = SoftmaxEnsemble([Fixed(a), Fixed(b)])(x).numpy()
    assert out.shape == (3, 2) and np.allclose(np.exp(out), (pa + pb) / 2, atol=1e-7)
    assert np.allclose(SoftmaxEnsemble([Fixed(a)])(x).numpy(), np.log(pa), atol=1e-6)
    with pytest.raises(ValueError, match="at least one member"):
        SoftmaxEnsemble([])


def test_combined_checkpoint_decides_like_neurofed_ensemble(runs, tmp_path):
    """`neurofed combine` of a fold's three saved models (FedAvg seeds 0, 1 and FedBS seed 0) is one model whose
    held-out BCA equals `neurofed ensemble`'s for every subject of that fold; it loads like any checkpoint."""
    from neurofed.cli import app
    from neurofed.trainer.checkpoint import load_checkpoint, read_meta
    from neurofed.trainer.evaluate import bca, logits
    from neurofed.trainer.experiments.sweep import held_out_subjects, run_config

    res = ens.ensemble_runs([runs / "fedavg", runs / "fedbs"])
    cfg = run_config(runs / "fedavg")
    for fold in (0, 1):
        members = [runs / "fedavg" / "jobs" / f"seed{sd}_fold{fold:02d}.safetensors" for sd in (0, 1)]
        members.append(runs / "fedbs" / "jobs" / f"seed0_fold{fold:02d}.safetensors")
        out = tmp_path / f"ens{fold}.safetensors"
        r = CliRunner().invoke(app, ["combine", *map(str, members), "-o", str(out)], env={"COLUMNS": "200"})
        assert r.exit_code == 0, r.output
        assert "3 members" in r.output
        meta = read_meta(out)
        assert meta.model == "ensemble" and meta.bn_mode == "batch_specific"  # FedBS is batch-specific
        assert meta.strategy == "ensemble(fedavg+fedavg+fedbs)" and len(meta.extra["members"]) == 3
        assert set(meta.data_hashes) == set().union(*(read_meta(m).data_hashes for m in members))
        model, _ = load_checkpoint(out)
        job = json.loads((runs / "fedavg" / "jobs" / f"seed0_fold{fold:02d}.json").read_text())
        for sd in held_out_subjects(cfg, job):
            assert bca(sd.y, logits(model, sd.X, 8).argmax(1)) == res["per_subject"][sd.subject]["bca"]


def test_combine_refuses_what_cannot_be_one_model(runs, data_dir, tmp_path):
    from dataclasses import replace

    import torch
    from safetensors.torch import load_file

    from neurofed.trainer.checkpoint import combine_checkpoints, read_meta, save_checkpoint

    a = runs / "fedavg" / "jobs" / "seed0_fold00.safetensors"
    b = runs / "fedavg" / "jobs" / "seed1_fold00.safetensors"
    with pytest.raises(NeuroFedError, match="at least two checkpoints"):
        combine_checkpoints([a], tmp_path / "x.safetensors")
    with pytest.raises(NeuroFedError, match="checkpoint file not found"):
        combine_checkpoints([a, tmp_path / "nope.safetensors"], tmp_path / "x.safetensors")
    meta = read_meta(b)
    other = save_checkpoint(tmp_path / "other.safetensors", load_file(str(b)),
                            replace(meta, classes=list(reversed(meta.classes))))
    with pytest.raises(NeuroFedError, match="its classes .* differs"):
        combine_checkpoints([a, other], tmp_path / "x.safetensors")
    batch = save_checkpoint(tmp_path / "batch.safetensors", load_file(str(b)), replace(meta, test_batch_size=4))
    with pytest.raises(NeuroFedError, match="test_batch_size"):
        combine_checkpoints([a, batch], tmp_path / "x.safetensors")
    ens2 = tmp_path / "ens.safetensors"
    combine_checkpoints([a, b], ens2)
    with pytest.raises(NeuroFedError, match="already an ensemble"):
        combine_checkpoints([ens2, a], tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()
    assert torch.equal(load_file(str(ens2))["members.1.classifier.weight"], load_file(str(b))["classifier.weight"])


def test_members_of_other_preprocessings_decode_their_own_view(runs, data_dir, tmp_path, monkeypatch):
    """A 64-channel member beside 21-channel ones: each decodes the held-out trials through its own run's
    preprocessing; the mean softmax is checked by hand."""
    from neurofed.trainer.checkpoint import load_checkpoint
    from neurofed.trainer.evaluate import bca, logits
    from neurofed.trainer.experiments.sweep import held_out_subjects, run_config

    monkeypatch.setenv("NEUROFED_CACHE", str(tmp_path / "cache"))
    wide = tmp_path / "wide"
    run_simulation(_cfg(data_dir, preprocess=PreprocessConfig(channels=None, resample=80.0).to_dict(), folds=[0]), wide)
    res = ens.ensemble_runs([runs / "fedavg", wide], seeds=[0])
    job = json.loads((wide / "jobs" / "seed0_fold00.json").read_text())
    narrow = held_out_subjects(run_config(runs / "fedavg"), job)
    broad = held_out_subjects(run_config(wide), job)
    m21 = load_checkpoint(runs / "fedavg" / "jobs" / "seed0_fold00.safetensors")[0]
    m64 = load_checkpoint(wide / "jobs" / "seed0_fold00.safetensors")[0]
    for a, b in zip(narrow, broad):
        assert a.X.shape[1] == 21 and b.X.shape[1] == 64
        p = (ens.softmax(logits(m21, a.X, 8)) + ens.softmax(logits(m64, b.X, 8))) / 2
        assert res["per_subject"][a.subject]["bca"] == bca(a.y, p.argmax(1))
