"""``neurofed evaluate``: onnxruntime BCA per subject, attacks through a torch twin."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from neurofed.export.evaluate import evaluate, load_eegmmidb_for, load_files_for, torch_twin
from neurofed.export.metadata import read_onnx_meta
from neurofed.export.onnx_export import export_checkpoint
from neurofed.export.runtime import OnnxModel
from neurofed.trainer.checkpoint import load_checkpoint
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.evaluate import bca, predict
from tests.export.conftest import make_checkpoint

torch.set_num_threads(1)


def test_clean_bca_matches_torch_protocol(eegnet_bs, data_dir):
    ckpt, onnx_path = eegnet_bs
    meta = read_onnx_meta(onnx_path)
    data = load_eegmmidb_for(meta, [3, 4], data_dir)
    res = evaluate(onnx_path, data)
    net, _ = load_checkpoint(ckpt)
    assert list(res["per_subject"]) == ["S003", "S004"] and res["test_batch_size"] == 8
    for s, (X, y) in data.items():  # same numbers as the torch evaluation with test batch 8
        assert res["per_subject"][s]["n_trials"] == 45
        assert res["per_subject"][s]["bca"] == pytest.approx(bca(y, predict(net, X, 8)))
    assert res["summary"]["bca"]["mean"] == pytest.approx(
        np.mean([r["bca"] for r in res["per_subject"].values()])
    )


def test_fgsm_through_twin_from_onnx_initializers(eegnet_bs, data_dir):
    ckpt, onnx_path = eegnet_bs
    meta = read_onnx_meta(onnx_path)
    twin = torch_twin(meta, onnx_path)  # rebuilt from the ONNX file alone, hash-checked
    ref, _ = load_checkpoint(ckpt)
    for k, v in ref.state_dict().items():
        assert torch.equal(twin.state_dict()[k], v)
    data = load_eegmmidb_for(meta, [3], data_dir)
    res = evaluate(onnx_path, data, attack="fgsm", eps=0.05)
    assert res["attack"] == {"name": "fgsm", "eps": 0.05, "seed": 0}
    assert 0.0 <= res["per_subject"]["S003"]["bca_attacked"] <= 1.0
    # the attack really hurts the ONNX model: its loss on adversarial trials is higher
    from neurofed.export.evaluate import attack_batches

    X, y = data["S003"]
    om = OnnxModel(onnx_path)
    Xa = attack_batches(twin, X, y, "fgsm", 0.05, 8)

    def ce(logits: np.ndarray) -> float:
        return torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(y)).item()

    assert ce(om.logits(Xa)) > ce(om.logits(X))
    budget = 0.05 * X.std(axis=-1, ddof=1, keepdims=True)  # per trial and channel, as neurofed.trainer.attacks
    assert np.all(np.abs(Xa - X) <= budget * 1.001 + 1e-6)


def test_standard_bn_twin_needs_checkpoint(tmp_path, data_dir, cache_env):
    ckpt = make_checkpoint(tmp_path / "s.safetensors", "eegnet", "standard", data_dir, steps=1)
    out = tmp_path / "s.onnx"
    export_checkpoint(ckpt, out, data_dir, verify=False)
    meta = read_onnx_meta(out)
    with pytest.raises(NeuroFedError, match="pass --checkpoint"):
        torch_twin(meta, out)
    other = make_checkpoint(tmp_path / "o.safetensors", "eegnet", "standard", data_dir, steps=1, seed=1)
    with pytest.raises(NeuroFedError, match="model_hash mismatch"):
        torch_twin(meta, out, other)
    res = evaluate(out, load_eegmmidb_for(meta, [3], data_dir), attack="pgd", eps=0.03, checkpoint=ckpt)
    assert "bca_attacked" in res["per_subject"]["S003"]


def test_generic_recording_and_cli_json(eegnet_bs, data_dir, tmp_path):
    from typer.testing import CliRunner

    from neurofed.cli import app

    _, onnx_path = eegnet_bs
    meta = read_onnx_meta(onnx_path)
    edf = data_dir / "eegmmidb" / "S005" / "S005R04.edf"
    data = load_files_for(meta, [edf], {"T1": "left_fist", "T2": "right_fist"})
    X, y = data["S005R04"]
    assert X.shape == (15, 21, 320) and set(y) <= {0, 1}
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        app,
        [
            "evaluate",
            "--model",
            str(onnx_path),
            "--data-dir",
            str(data_dir),
            "--subjects",
            "5",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert list(d["per_subject"]) == ["S005"] and d["per_subject"]["S005"]["n_trials"] == 45
    assert "S005" in res.output and "mean" in res.output


def test_wrong_model_file_is_clear(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(NeuroFedError, match="not a readable ONNX model"):
        read_onnx_meta(bad)


def test_training_subjects_are_marked_and_summarised_apart(eegnet_bs, data_dir, tmp_path):
    """The fixture model trained on S001-S002 (its data hashes say so): S001 is a training-set score."""
    from typer.testing import CliRunner

    from neurofed.cli import app

    _, onnx_path = eegnet_bs
    meta = read_onnx_meta(onnx_path)
    res = evaluate(onnx_path, load_eegmmidb_for(meta, [1, 3, 4], data_dir))
    assert res["training_subjects"] == ["S001", "S002"]
    assert res["training_subjects_source"] == "model metadata (data_hashes)"
    assert [r["trained_on"] for r in res["per_subject"].values()] == [True, False, False]
    held = [res["per_subject"][s]["bca"] for s in ("S003", "S004")]
    assert res["summary"]["bca"]["n_subjects"] == 2 and res["summary"]["bca"]["mean"] == pytest.approx(np.mean(held))
    assert res["summary"]["bca"]["std_subjects"] == pytest.approx(np.std(held, ddof=1))
    assert res["summary_training"]["bca"] == {"mean": res["per_subject"]["S001"]["bca"], "std_subjects": 0.0,
                                              "n_subjects": 1}
    # --trained-on overrides the metadata (a federated model's coordinator never sees client data)
    out = tmp_path / "e.json"
    cli = CliRunner().invoke(app, ["evaluate", "--model", str(onnx_path), "--data-dir", str(data_dir),
                                   "--subjects", "1,3", "--trained-on", "3", "--json", str(out)],
                            env={"COLUMNS": "200"})
    assert cli.exit_code == 0, cli.output
    d = json.loads(out.read_text())
    assert d["training_subjects"] == ["S003"] and d["per_subject"]["S003"]["trained_on"]
    assert "training set" in cli.output and "held out" in cli.output and "not accuracy estimates" in cli.output


def test_black_box_attacks_query_the_onnx_graph_itself(eegnet_bs, data_dir, monkeypatch):
    """Square needs no checkpoint: it queries onnxruntime, and finds what it finds on the torch model."""
    pytest.importorskip("art")
    from neurofed.export.evaluate import query_attack_batches
    from neurofed.trainer import art_attacks
    from neurofed.trainer.evaluate import adversarial_batches

    monkeypatch.setitem(art_attacks.LIBRARY_BUDGETS, "square", {"queries": 30, "restarts": 1, "p_init": 0.8})
    ckpt, onnx_path = eegnet_bs
    meta = read_onnx_meta(onnx_path)
    data = load_eegmmidb_for(meta, [3], data_dir)
    X, y = data["S003"]
    X, y = X[:16], y[:16]
    om = OnnxModel(onnx_path)
    Xa = query_attack_batches(om, X, y, "square", 0.1, 8, seed=2)
    assert np.all(np.abs(Xa - X) <= 0.1 * X.std(axis=-1, ddof=1, keepdims=True) * 1.001 + 1e-6)
    net, _ = load_checkpoint(ckpt)
    ref = np.concatenate([xa.numpy() for xa in adversarial_batches(net.eval(), X, y, "square", 0.1, 8, seed=2)])
    # the same attack, seeds and wrapper on the same weights: the graph and torch agree up to float rounding
    assert np.mean(np.isclose(Xa, ref, atol=1e-4)) > 0.99
    assert np.array_equal(om.predict(Xa), om.predict(ref))
    res = evaluate(onnx_path, {"S003": (X, y)}, attack="square", eps=0.1)  # no checkpoint, no twin
    assert res["attack"]["queried"].startswith("onnxruntime")
    assert res["attack"]["budget"] == art_attacks.LIBRARY_BUDGETS["square"]
    assert 0.0 <= res["per_subject"]["S003"]["bca_attacked"] <= res["per_subject"]["S003"]["bca"] + 1e-9
    with pytest.raises(NeuroFedError, match="not a black-box attack"):
        query_attack_batches(om, X, y, "fgsm", 0.1, 8)


@pytest.mark.integration  # the CLI as a process: its exit code and its whole stderr
def test_graph_metadata_mismatch_is_one_line_through_the_cli(eegnet_bs, data_dir, tmp_path):
    """Issue 53/54 (D5): a model whose metadata declares 8 channels on a 21-channel graph is refused by
    `neurofed evaluate` in one line, exit 2 (it used to be a 58-line onnxruntime traceback)."""
    import subprocess
    import sys

    from tests.runtime.conftest import eight_channel_card

    bad = eight_channel_card(eegnet_bs[1], tmp_path / "bad.onnx")
    r = subprocess.run([sys.executable, "-m", "neurofed.cli", "evaluate", "--model", str(bad), "--data-dir",
                        str(data_dir), "--subjects", "3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "bad.onnx" in lines[0] and "metadata declares 8 channels" in lines[0], r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_fewer_trials_than_the_minimum_batch_is_one_log_line(eegnet_bs, data_dir, caplog):
    """The batch-1 trap in `neurofed evaluate`: a subject with fewer trials than the plain export's minimum batch
    (metadata min_batch 8), and --batch-size below it, are each said in one line."""
    import logging

    _, onnx_path = eegnet_bs
    meta = read_onnx_meta(onnx_path)
    assert meta.min_batch == 8 and meta.training_rate_hz == meta.input_rate_hz == 80.0
    X, y = load_eegmmidb_for(meta, [3], data_dir)["S003"]
    with caplog.at_level(logging.WARNING, logger="neurofed.export"):
        res = evaluate(onnx_path, {"S003": (X[:3], y[:3])}, batch_size=1)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("--batch-size 1 is below the model's minimum batch 8" in m for m in msgs)
    assert any(m.startswith("S003: 3 trials, fewer than the model's minimum batch 8") for m in msgs)
    assert all("\n" not in m for m in msgs) and res["per_subject"]["S003"]["n_trials"] == 3
