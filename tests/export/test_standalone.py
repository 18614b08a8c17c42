"""Standalone decoder: one graph == the Python pipeline (edge engine) on whole real sessions,
in onnxruntime, onnx.reference and tract; exact preprocessing matrix; Newton-Schulz EA; bad input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from edge.infer import InferenceEngine, StandaloneStep
from export.runtime import OnnxModel
from export.standalone import (
    HASH_WORDS,
    NS_ITERS,
    StandaloneDecoder,
    StandaloneModel,
    WindowRejected,
    eegmmidb_session_windows,
    export_standalone,
    newton_schulz_inv_sqrt,
    preprocess_matrix,
)
from trainer.data import PreprocessConfig
from trainer.data.preprocess import ea_inv_sqrt as inv_sqrt
from trainer.data.preprocess import preprocess_epochs
from trainer.errors import NeuroFedError

HELD_OUT = 3  # the fixture checkpoint trained on S001-S002


@pytest.fixture(scope="module")
def standalone(eegnet_bs, tmp_path_factory):
    ckpt, plain = eegnet_bs
    out = tmp_path_factory.mktemp("sa") / "m.standalone.onnx"
    export_standalone(ckpt, out, rate=160.0)
    return plain, out


@pytest.fixture(scope="module")
def sessions(standalone, data_dir):
    m = StandaloneModel(standalone[1])
    return eegmmidb_session_windows(HELD_OUT, list(m.meta.ch_names), list(m.meta.classes), 0.0, 4.0, data_dir)


@pytest.fixture(scope="module")
def pipeline(standalone, sessions):
    """The edge engine's probabilities window by window over the subject's three sessions."""
    om = OnnxModel(standalone[0])
    eng = InferenceEngine(om, om.meta.ch_names, 160.0)
    probs = [eng.process(w, 0.0).probabilities for _, ws, _, _ in sessions for w in ws]
    return np.array(probs)


def _replay(run, init, sessions):
    state, out = init, []
    for _, ws, _, _ in sessions:
        for w in ws:
            p, state = run(w.astype(np.float32), state)
            out.append(p)
    return np.array(out)


def test_graph_has_no_batchnorm_and_plain_ops(standalone):
    ops = {n.op_type for n in onnx.load(str(standalone[1])).graph.node}
    assert "BatchNormalization" not in ops and not ops & {"If", "Loop", "Scan"}
    assert {"MatMul", "ReduceSum", "Sqrt", "Div"} <= ops


def test_onnxruntime_equals_python_pipeline(standalone, sessions, pipeline):
    m = StandaloneModel(standalone[1])
    got = _replay(m.run, m.initial_state(), sessions)
    assert len(got) == 45  # three whole sessions of 15 cues
    assert np.abs(got - pipeline).max() <= 1e-4
    assert (got.argmax(1) == pipeline.argmax(1)).all()


def test_reference_evaluator_equals_python_pipeline(standalone, sessions, pipeline):
    from onnx.reference import ReferenceEvaluator

    m = StandaloneModel(standalone[1])
    ref = ReferenceEvaluator(onnx.load(str(standalone[1])))

    def run(w, s):
        p, nxt, _ = ref.run(None, {"window": w, "state": s})
        return p, nxt

    first = sessions[:1]  # one whole session (the interpreter is slow)
    got = _replay(run, m.initial_state(), first)
    want = pipeline[: len(got)]
    assert np.abs(got - want).max() <= 1e-4 and (got.argmax(1) == want.argmax(1)).all()


def test_tract_equals_python_pipeline(standalone, sessions, pipeline):
    import tract  # pinned in the dev extra: a missing tract fails the test, never skips it
    r = tract.onnx().load(str(standalone[1])).into_model().into_runnable()
    m = StandaloneModel(standalone[1])

    def run(w, s):
        p, nxt, _ = (t.to_numpy() for t in r.run([w, s]))
        return p, nxt

    got = _replay(run, m.initial_state(), sessions)
    assert np.abs(got - pipeline).max() <= 1e-4 and (got.argmax(1) == pipeline.argmax(1)).all()


def test_preprocess_matrix_equals_scipy(sessions):
    cfg = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
    p = preprocess_matrix(cfg, 160.0)
    x = sessions[0][1]
    want, _, _ = preprocess_epochs(x, 160.0, list(cfg.channels), cfg)
    assert p.shape == (640, 320)
    assert np.abs(x @ p - want).max() <= 1e-10 * np.abs(want).max()


def test_newton_schulz_equals_eigh(sessions):
    cfg = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
    y, _, _ = preprocess_epochs(sessions[0][1], 160.0, list(cfg.channels), cfg)
    cov = np.zeros((21, 21))
    for i, w in enumerate(y, 1):  # the running covariance after each window, as online EA sees it
        cov += w @ w.T / w.shape[1]
        want = inv_sqrt(cov / i)
        got = newton_schulz_inv_sqrt(torch.from_numpy(cov / i), NS_ITERS).numpy()
        assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max()


def test_bad_input_is_refused_clearly(standalone, sessions):
    m = StandaloneModel(standalone[1])
    s0 = m.initial_state()
    w = sessions[0][1][0].astype(np.float32)
    with pytest.raises(NeuroFedError, match=r"window shape \(21, 320\), expected \(21, 640\).*160 Hz"):
        m.run(w[:, :320], s0)
    other = s0.copy()
    other[:HASH_WORDS] += 1
    with pytest.raises(NeuroFedError, match="another model"):
        m.run(w, other)
    bad = w.copy()
    bad[3, 10] = np.nan
    with pytest.raises(WindowRejected, match="non-finite channel FCz"):
        m.run(bad, s0)
    flat = w.copy()
    flat[0] = 5.0
    with pytest.raises(WindowRejected, match="flat channel FC5"):
        m.run(flat, s0)
    sat = w.copy()
    sat[10, :100] = 4000.0
    with pytest.raises(WindowRejected, match="saturated channel Cz"):
        m.run(sat, s0)
    # a rejected window leaves the state untouched inside the graph too
    _, nxt, guard = m.session.run(None, {"window": bad, "state": s0})
    assert guard[0, 3] == 1 and np.array_equal(nxt, s0)
    # a foreign state fed to the bare graph gives NaN and is not advanced
    p, nxt, _ = m.session.run(None, {"window": w, "state": other})
    assert np.isnan(p).all() and np.array_equal(nxt, other)


@pytest.mark.parametrize(("model", "bn_mode"), [("shallow", "batch_specific"), ("deep", "batch_specific"),
                                                ("eegnet", "standard")])
def test_other_variants_equal_python_pipeline(model, bn_mode, tmp_path, data_dir, cache_env):
    """ShallowConvNet, Deep4 (160 Hz: band-pass only) and standard BN (no context in the state)."""
    from export.onnx_export import export_checkpoint
    from tests.export.conftest import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "m.safetensors", model, bn_mode, data_dir)
    export_checkpoint(ckpt, tmp_path / "m.onnx", verify=False)
    export_standalone(ckpt, tmp_path / "sa.onnx", rate=160.0)
    om, sm = OnnxModel(tmp_path / "m.onnx"), StandaloneModel(tmp_path / "sa.onnx")
    assert sm.info.context_windows == (0 if bn_mode == "standard" else 7)
    eng = InferenceEngine(om, om.meta.ch_names, 160.0)
    sess = eegmmidb_session_windows(HELD_OUT, list(om.meta.ch_names), list(om.meta.classes), 0.0, 4.0, data_dir)
    want = np.array([eng.process(w, 0.0).probabilities for w in sess[0][1]])
    got = _replay(sm.run, sm.initial_state(), sess[:1])
    assert np.abs(got - want).max() <= 1e-4 and (got.argmax(1) == want.argmax(1)).all()


def test_cli_standalone_in_volts_equals_microvolts(standalone, eegnet_bs, sessions, tmp_path):
    """`neurofed export --standalone --unit V`: the same decoding from samples in volts."""
    from typer.testing import CliRunner

    from neurofed.cli import app

    out = tmp_path / "v.onnx"
    r = CliRunner().invoke(app, ["export", str(eegnet_bs[0]), "--standalone", "--unit", "V", "-o", str(out)])
    assert r.exit_code == 0, r.output
    uv, v = StandaloneModel(standalone[1]), StandaloneModel(out)
    assert v.info.unit == "V" and v.info.unit_to_uv == 1e6 and v.meta.model_hash == uv.meta.model_hash
    ws = sessions[0][1][:9]
    want = _replay(uv.run, uv.initial_state(), [("", ws, None, 160.0)])
    got = _replay(v.run, v.initial_state(), [("", ws * 1e-6, None, 160.0)])
    assert np.abs(got - want).max() <= 1e-5


def test_plain_runtime_refuses_a_standalone_file(standalone):
    with pytest.raises(NeuroFedError, match="a standalone model"):
        OnnxModel(standalone[1])
    with pytest.raises(NeuroFedError, match="not a standalone export"):
        StandaloneModel(standalone[0])


def test_edge_engine_runs_the_standalone_graph(standalone, sessions, pipeline):
    """edge-client infer with a standalone export: the engine's guard + the graph == the Python decoder."""
    sm = StandaloneModel(standalone[1])
    eng = InferenceEngine(sm, sm.meta.ch_names, 160.0, decoder=StandaloneStep(sm, 160.0))
    got = [eng.process(w, 0.0) for _, ws, _, _ in sessions for w in ws]
    probs = np.array([g.probabilities for g in got])
    np.testing.assert_allclose(probs, pipeline, atol=1e-4)
    assert (probs.argmax(1) == pipeline.argmax(1)).all()
    assert got[-1].n_context == sm.info.context_windows and got[-1].ea_windows == len(got)
    with pytest.raises(NeuroFedError, match="export it again with --rate 250"):
        StandaloneStep(sm, 250.0)


def test_graph_guard_and_edge_guard_are_one_definition(standalone, sessions):
    """The graph's guard and edge.guard share trainer.data.guard (kinds, thresholds, reason) and flag the
    same channels on real windows with injected faults."""
    from dataclasses import asdict

    from edge.guard import GuardConfig, check_window
    from trainer.data import guard as rules

    m = StandaloneModel(standalone[1])
    assert GuardConfig is rules.GuardConfig
    assert m.info.guard == asdict(rules.GuardConfig()) and tuple(m.info.guard_kinds) == rules.GUARD_KINDS
    names = list(m.meta.ch_names)
    w = sessions[0][1][0].astype(np.float32)
    faults = []
    for ch, edit in [(3, lambda x: x.__setitem__((3, 7), np.inf)), (0, lambda x: x.__setitem__(0, 5.0)),
                     (10, lambda x: x.__setitem__((10, slice(0, 100)), 4000.0)),
                     (5, lambda x: x.__setitem__((5, slice(0, 64)), x[5].max()))]:  # a clipping plateau
        x = w.copy()
        edit(x)
        faults.append((ch, x))
    for ch, x in faults:
        want = check_window(x.astype(np.float64), names)
        with pytest.raises(WindowRejected) as exc:
            m.run(x, m.initial_state())
        assert not want.ok and exc.value.bad_channels == want.bad_channels and str(exc.value) == want.reason
        assert names[ch] in str(exc.value)


@pytest.mark.parametrize("ea", [True, False])
def test_eegnet_context_cache_equals_the_whole_batch(eegnet_bs, sessions, ea):
    """The cached decoder (per-window temporal moments in the state, A and BN folded into the spatial
    weights) == the whole batch through EEGNet, window by window from an empty context, with and without
    EA, and a rejected window in between leaves both states unchanged."""
    from dataclasses import replace

    from trainer.checkpoint import load_checkpoint

    model, cm = load_checkpoint(eegnet_bs[0])
    cm = replace(cm, preprocess={**cm.preprocess, "ea": ea})
    fast = StandaloneDecoder(model, cm, "ab" * 32, 160.0)
    slow = StandaloneDecoder(model, cm, "ab" * 32, 160.0, context_cache=False)
    assert fast.cache is not None and slow.cache is None and fast.state_size > slow.state_size
    names = [e["name"] for e in fast.layout]
    assert names[-2:] == ["context_temporal_sums", "context_temporal_grams"]
    ws = [w.astype(np.float32) for w in sessions[0][1][:12]]
    bad = ws[5].copy()
    bad[2, 3] = np.nan
    ws.insert(6, bad)
    sf, ss = (torch.from_numpy(d.initial_state()) for d in (fast, slow))
    with torch.no_grad():
        for i, w in enumerate(ws):
            pf, nf, _ = fast(torch.from_numpy(w), sf)
            ps, ns, _ = slow(torch.from_numpy(w), ss)
            if i == 6:
                assert torch.isnan(pf).all() and torch.equal(nf, sf) and torch.equal(ns, ss)
            else:
                assert (pf - ps).abs().max() <= 1e-6 and pf.argmax() == ps.argmax()
            sf, ss = nf, ns


def test_eegnet_cached_moments_give_the_first_bn_statistics(eegnet_bs, sessions):
    """The first BN's batch statistics from the cached per-window moments == those of EEGNet's temporal
    convolution run on the aligned batch. Checked directly: in the output, the second (batch-specific) BN
    cancels the first BN's shift exactly and its scale up to its eps, so errors here barely show there."""
    from trainer.checkpoint import load_checkpoint

    model, cm = load_checkpoint(eegnet_bs[0])
    dec = StandaloneDecoder(model, cm, "ab" * 32, 160.0)
    cfg = PreprocessConfig.from_dict(cm.preprocess)
    y, _, _ = preprocess_epochs(sessions[0][1][:8], 160.0, list(cfg.channels), cfg)
    batch = torch.from_numpy(y)  # (8, C, T) float64, unaligned
    a = newton_schulz_inv_sqrt(torch.einsum("nct,ndt->cd", batch, batch) / (8 * y.shape[-1]))
    sums, grams = zip(*(dec.cache.temporal_moments(w) for w in batch))
    mask = torch.tensor([0.0, 0.0, 1, 1, 1, 1, 1, 1])  # two empty context slots
    with torch.no_grad():
        for ea in (a, None):
            mean, var = dec.cache.temporal_bn_stats(torch.stack(sums), torch.stack(grams), mask, ea)
            x = (batch[2:] if ea is None else torch.matmul(ea, batch[2:])).to(torch.float64).unsqueeze(1)
            h = model.temporal.double()(x)  # (6, F1, C, T)
            want_mean, want_var = h.mean((0, 2, 3)), h.var((0, 2, 3), unbiased=False)
            assert torch.allclose(mean, want_mean, rtol=1e-6, atol=1e-7 * want_var.sqrt().max())
            assert torch.allclose(var, want_var, rtol=1e-6)
