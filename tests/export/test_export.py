"""ONNX export of every model variant x BN mode, verified against torch on real held-out trials."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

from neurofed import __version__
from neurofed.export.metadata import model_hash, read_onnx_meta
from neurofed.export.onnx_export import (
    VerifyReport,
    check_graph,
    export_checkpoint,
    held_out_data,
    to_onnx,
    verify_against_torch,
)
from neurofed.export.runtime import OnnxModel
from neurofed.trainer.checkpoint import load_checkpoint
from neurofed.trainer.errors import NeuroFedError
from tests.export.conftest import make_checkpoint

torch.set_num_threads(1)


@pytest.mark.parametrize(("model", "bn_mode"), [(m, b) for m in ("eegnet", "shallow", "deep")
                                                 for b in ("batch_specific", "standard")]
                         + [("itnet", "batch_specific"), ("eegnet_crop", "batch_specific")])
def test_export_variant(model, bn_mode, tmp_path, data_dir, cache_env):
    ckpt = make_checkpoint(tmp_path / "m.safetensors", model, bn_mode, data_dir)
    out = tmp_path / "m.onnx"
    _meta, rep = export_checkpoint(ckpt, out, data_dir)
    # verified on a real subject the checkpoint was not trained on, at batch 1/4/8
    assert rep.held_out and rep.subjects == ["S003"] and rep.n_trials == 45
    assert set(rep.max_abs_diff) == {"1", "4", "8"}
    assert max(rep.max_abs_diff.values()) <= 1e-4 and not any(rep.class_mismatches.values())
    assert "no training-mode BatchNormalization" in rep.checks
    proto = onnx.load(str(out))
    assert not any(
        n.op_type == "BatchNormalization" and any(a.name == "training_mode" and a.i == 1 for a in n.attribute)
        for n in proto.graph.node
    )
    # metadata round trip
    net, cmeta = load_checkpoint(ckpt)
    m = read_onnx_meta(out)
    assert (
        m.ch_names == cmeta.ch_names and m.sfreq == cmeta.sfreq and m.classes == ["left_fist", "right_fist"]
    )
    assert m.bandpass == (8.0, 30.0) and m.window == (0.0, 4.0) and m.test_batch_size == 8
    assert m.preprocess["ea"] is True and m.ea_policy["online"] != "none"
    assert m.model_hash == model_hash(net.state_dict()) and m.neurofed_version == __version__
    assert set(m.data_hashes) == {f"S00{s}R{r:02d}.edf" for s in (1, 2) for r in (4, 8, 12)}
    assert m.strategy == "fedbs" and m.bn_mode == bn_mode
    assert (
        m.model_extra["verification"]["subjects"] == ["S003"] and m.model_extra["verification"]["opset"] == 18
    )
    # batch-specific BN: a trial's output depends on its batch companions; standard BN: it does not
    X, _, _, _ = held_out_data(cmeta, data_dir)
    om = OnnxModel(out)
    alone = om.forward(X[:1])[0]
    in_batch = om.forward(X[:8])[0]
    if bn_mode == "batch_specific":
        assert np.abs(alone - in_batch).max() > 1e-4
    else:
        assert np.abs(alone - in_batch).max() < 1e-4


def test_verification_fails_loudly_on_mismatch(eegnet_bs, data_dir):
    ckpt, onnx_path = eegnet_bs
    net, cmeta = load_checkpoint(ckpt)
    X, _, ids, _ = held_out_data(cmeta, data_dir)
    with torch.no_grad():  # a torch model that no longer matches the exported graph
        net.classifier.bias += 0.5
    with pytest.raises(NeuroFedError, match="differ by .* at batch size 1"):
        verify_against_torch(net, onnx_path.read_bytes(), X[:8], VerifyReport(ids, True, 0))


def test_graph_checks_reject_training_bn_and_fixed_batch(eegnet_bs):
    _ckpt, onnx_path = eegnet_bs
    proto = onnx.load(str(onnx_path))
    bn = next(n for n in proto.graph.node if n.op_type == "BatchNormalization")
    bn.attribute.append(helper.make_attribute("training_mode", 1))
    with pytest.raises(NeuroFedError, match="training-mode BatchNormalization"):
        check_graph(proto, "batch_specific")
    proto = onnx.load(str(onnx_path))
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 8
    with pytest.raises(NeuroFedError, match="fixed batch size 8"):
        check_graph(proto, "batch_specific")


def test_export_cli_with_int8(eegnet_bs, tmp_path, data_dir):
    from typer.testing import CliRunner

    from neurofed.cli import app

    ckpt, _ = eegnet_bs
    out, rep = tmp_path / "cli.onnx", tmp_path / "report.json"
    res = CliRunner().invoke(
        app, ["export", str(ckpt), "-o", str(out), "--int8", "--json", str(rep), "--data-dir", str(data_dir)]
    )
    assert res.exit_code == 0, res.output
    d = json.loads(rep.read_text())
    assert d["held_out"] and max(d["max_abs_diff"].values()) <= 1e-4
    q = d["int8"]
    assert (tmp_path / "cli.int8.onnx").is_file() and q["n_trials"] == 45
    assert abs(q["bca_delta"] - (q["bca_int8"] - q["bca_fp32"])) < 1e-12
    assert q["size_int8_bytes"] < q["size_fp32_bytes"]
    qm = read_onnx_meta(tmp_path / "cli.int8.onnx")
    assert qm.quantized == "dynamic int8 (all)" and qm.model_hash == read_onnx_meta(out).model_hash
    ops = {n.op_type for n in onnx.load(str(tmp_path / "cli.int8.onnx")).graph.node}
    assert "ConvInteger" in ops and "MatMulInteger" in ops


@pytest.mark.integration
def test_export_missing_checkpoint_is_one_clear_error(tmp_path):
    import subprocess

    r = subprocess.run(
        ["neurofed", "export", str(tmp_path / "nope.safetensors"), "-o", str(tmp_path / "x.onnx")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 2 and "checkpoint file not found" in r.stderr and "Traceback" not in r.stderr


def test_static_export_matches_dynamic_shape_contract():
    """The exporter gives a symbolic batch dim; a batch of 3 (never seen at export) runs."""
    from neurofed.trainer.models import build_model

    net = build_model("eegnet", 21, 2, 320, 80.0, "batch_specific").eval()
    proto = to_onnx(net, 21, 320)
    from neurofed.export.runtime import make_session

    s = make_session(proto.SerializeToString())
    x = np.random.default_rng(0).standard_normal((3, 21, 320)).astype(np.float32)
    with torch.no_grad():
        ref = net(torch.from_numpy(x)).numpy()
    assert np.abs(s.run(None, {"x": x})[0] - ref).max() <= 1e-4


def test_ensemble_checkpoint_exports_as_one_verified_graph(tmp_path, data_dir, cache_env):
    """`neurofed combine` of a batch-specific and a standard-BN EEGNet, then `neurofed export` and `--standalone`:
    one graph, verified against torch; its softmax is the mean of the two members' own exported softmax outputs;
    the standalone graph decodes a held-out session like the edge engine running the plain ensemble graph."""
    from scipy.special import softmax
    from typer.testing import CliRunner

    from neurofed.cli import app
    from neurofed.edge.infer import InferenceEngine
    from neurofed.export.decoder import StandaloneModel
    from neurofed.export.standalone import eegmmidb_session_windows

    a = make_checkpoint(tmp_path / "a.safetensors", "eegnet", "batch_specific", data_dir, seed=0)
    b = make_checkpoint(tmp_path / "b.safetensors", "eegnet", "standard", data_dir, seed=1)
    run = CliRunner()
    r = run.invoke(app, ["combine", str(a), str(b), "-o", str(tmp_path / "ens.safetensors")], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for src, out in ((a, "a.onnx"), (b, "b.onnx"), (tmp_path / "ens.safetensors", "ens.onnx")):
        r = run.invoke(app, ["export", str(src), "-o", str(tmp_path / out), "--json", str(tmp_path / f"{out}.json")],
                       env={"COLUMNS": "200"})
        assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "ens.onnx.json").read_text())
    assert rep["model"] == "ensemble" and rep["bn_mode"] == "batch_specific" and rep["subjects"] == ["S003"]
    assert max(rep["max_abs_diff"].values()) <= 1e-4 and not any(rep["class_mismatches"].values())
    X, _, _, _ = held_out_data(read_onnx_meta(tmp_path / "ens.onnx").model_meta(), data_dir)
    p = {n: softmax(OnnxModel(tmp_path / f"{n}.onnx").logits(X, 8), axis=1) for n in ("a", "b", "ens")}
    assert np.abs(p["ens"] - (p["a"] + p["b"]) / 2).max() < 1e-5
    assert not np.array_equal(p["a"].argmax(1), p["b"].argmax(1)) or np.abs(p["a"] - p["b"]).max() > 1e-3

    r = run.invoke(app, ["export", str(tmp_path / "ens.safetensors"), "--standalone", "-o", str(tmp_path / "sa.onnx")],
                   env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    om, sm = OnnxModel(tmp_path / "ens.onnx"), StandaloneModel(tmp_path / "sa.onnx")
    eng = InferenceEngine(om, om.meta.ch_names, 160.0)
    sess = eegmmidb_session_windows(3, list(om.meta.ch_names), list(om.meta.classes), 0.0, 4.0, data_dir)
    want = np.array([eng.process(w, 0.0).probabilities for w in sess[0][1]])
    state, got = sm.initial_state(), []
    for w in sess[0][1]:
        prob, state = sm.run(w.astype(np.float32), state)
        got.append(prob)
    assert np.abs(np.array(got) - want).max() <= 1e-4
