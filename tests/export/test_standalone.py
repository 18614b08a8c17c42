"""Standalone decoder: one graph == the Python pipeline (edge engine) on whole real sessions,
in onnxruntime, onnx.reference and tract; exact preprocessing matrix; Newton-Schulz EA; bad input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from neurofed.edge.infer import InferenceEngine, StandaloneStep
from neurofed.export.decoder import HASH_WORDS, StandaloneModel, WindowRejected
from neurofed.export.runtime import OnnxModel
from neurofed.export.standalone import (
    NS_ALPHAS,
    NS_FLOOR,
    NS_ITERS,
    StandaloneDecoder,
    eegmmidb_session_windows,
    export_standalone,
    newton_schulz_inv_sqrt,
    ns_schedule,
    preprocess_matrix,
    raw_threshold,
)
from neurofed.trainer.data import PreprocessConfig
from neurofed.trainer.data.preprocess import ea_inv_sqrt as inv_sqrt
from neurofed.trainer.data.preprocess import preprocess_epochs
from neurofed.trainer.errors import NeuroFedError

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
        got = newton_schulz_inv_sqrt(torch.from_numpy(cov / i)).numpy()
        assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max()


def test_newton_schulz_schedule_covers_its_floor():
    """The scaled iteration's scalars: in (1, 3) then 1; 16 steps bring every eigenvalue in [NS_FLOOR, 1] to 1
    (the scalar map, exactly as the schedule assumes), where plain steps would need 31."""
    assert NS_ITERS == len(NS_ALPHAS) == 16 and NS_FLOOR == 1e-9
    assert all(1.0 <= a < 3.0 for a in NS_ALPHAS) and NS_ALPHAS[-1] == 1.0
    for p0 in np.geomspace(NS_FLOOR, 1.0, 200):
        p = p0
        for a in NS_ALPHAS:
            p = a * p * (3.0 - a * p) ** 2 / 4.0
        assert abs(p - 1.0) <= 1e-14
    assert len(ns_schedule(1e-8)) == 15 and ns_schedule(0.5)[-1] == 1.0
    with pytest.raises(ValueError, match="floor"):
        ns_schedule(0.0)


@pytest.mark.parametrize("cond", [1e2, 1e5, 1e7, 1e8])
@pytest.mark.parametrize("n", [21, 64])
def test_newton_schulz_ill_conditioned_to_the_design_cap(cond, n):
    """Frobenius scaling + the scaled schedule on SPD matrices with condition numbers up to 1e8 (the floor 1e-9
    covers 1e9 / sqrt(C), 1.2e8 at 64 channels): two spectra (log-spaced; one tiny eigenvalue under a flat bulk).
    The earlier trace scaling with plain steps fails at 1e6 even with 24 iterations."""
    rng = np.random.default_rng(int(np.log10(cond)) + n)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    for ev in (np.logspace(0, -np.log10(cond), n), np.r_[1.0, np.full(n - 2, 0.5), 1.0 / cond]):
        r = (q * ev) @ q.T
        r = (r + r.T) / 2
        want = inv_sqrt(r)
        got = newton_schulz_inv_sqrt(torch.from_numpy(r)).numpy()
        # the reference itself moves by ~eps * cond (forming R in float64): 1e-9 plus that
        assert np.abs(got - want).max() <= (1e-9 + 1e-15 * cond) * np.abs(want).max(), cond
        if cond >= 1e7:  # the earlier scheme's failure, for the record
            old = newton_schulz_inv_sqrt(torch.from_numpy(r), 24, "trace").numpy()
            assert np.abs(old - want).max() > 1e-6 * np.abs(want).max()


def test_raw_threshold_is_exact():
    """|w| >= raw_threshold(limit, scale) for a float32 w exactly when float64(w) * scale >= limit."""
    for scale in (1.0, 1e6, 1e3, 1e-3, 1.0 / 44.7035457, 0.02235174):
        t = np.float32(raw_threshold(3000.0, scale))
        below = np.nextafter(t, np.float32(0))
        assert float(t) * scale >= 3000.0 > float(below) * scale


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
    from neurofed.export.onnx_export import export_checkpoint
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
    """The graph's guard and neurofed.edge.guard share neurofed.trainer.data.guard (kinds, thresholds, reason) and flag the
    same channels on real windows with injected faults."""
    from dataclasses import asdict

    from neurofed.edge.guard import GuardConfig, check_window
    from neurofed.trainer.data import guard as rules

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


@pytest.mark.parametrize(("model_name", "ea"), [("eegnet", True), ("eegnet", False), ("eegnet_crop", True)])
def test_eegnet_context_cache_equals_the_whole_batch(eegnet_bs, sessions, model_name, ea, tmp_path, data_dir):
    """The cached decoder (per-window temporal moments in the state, A and BN folded into the spatial
    weights) == the whole batch through EEGNet, window by window from an empty context, with and without
    EA, and a rejected window in between leaves both states unchanged; the same for cropped EEGNet (the
    cache feeds its crops' head)."""
    from dataclasses import replace

    from neurofed.trainer.checkpoint import load_checkpoint
    from tests.export.conftest import make_checkpoint

    ckpt = eegnet_bs[0] if model_name == "eegnet" else make_checkpoint(tmp_path / "c.safetensors", model_name,
                                                                       "batch_specific", data_dir)
    model, cm = load_checkpoint(ckpt)
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
    from neurofed.trainer.checkpoint import load_checkpoint

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


@pytest.mark.parametrize(("model", "bn_mode"), [("eegnet", "standard")])
def test_fused_standard_bn_eegnet_equals_the_network(model, bn_mode, tmp_path, data_dir, cache_env, sessions):
    """EEGNet with standard BN: EA and both BNs folded into the spatial weights, the temporal filter on the 16
    mixed rows (EEGNetStandardFused) == the network on the aligned window, with and without EA."""
    from dataclasses import replace

    from neurofed.trainer.checkpoint import load_checkpoint
    from tests.export.conftest import make_checkpoint

    model_, cm = load_checkpoint(make_checkpoint(tmp_path / "m.safetensors", model, bn_mode, data_dir))
    for ea in (True, False):
        c = replace(cm, preprocess={**cm.preprocess, "ea": ea})
        fast, slow = (StandaloneDecoder(model_, c, "ab" * 32, 160.0, fuse=f) for f in (True, False))
        assert fast.fused is not None and slow.fused is None and fast.state_size == slow.state_size
        sf, ss = (torch.from_numpy(d.initial_state()) for d in (fast, slow))
        with torch.no_grad():
            for w in sessions[0][1][:10]:
                pf, sf, _ = fast(torch.from_numpy(w.astype(np.float32)), sf)
                ps, ss, _ = slow(torch.from_numpy(w.astype(np.float32)), ss)
                assert (pf - ps).abs().max() <= 1e-6 and pf.argmax() == ps.argmax()
        assert torch.equal(sf, ss)


@pytest.mark.parametrize("scale", [1.0, 1e6, 1.0 / 0.02235174])
def test_float32_graph_guard_flags_equal_the_float64_rules(eegnet_bs, sessions, scale):
    """The graph's guard runs on the raw float32 window; its flags == neurofed.edge.guard.check_window on the window in
    microvolts (float64(w) * scale) for faults of every kind, including samples exactly at the saturation
    threshold and one float32 step below it, and plateaus one sample either side of the clip fraction."""
    from neurofed.edge.guard import check_window
    from neurofed.trainer.checkpoint import load_checkpoint
    from neurofed.trainer.data.guard import GUARD_KINDS

    model, cm = load_checkpoint(eegnet_bs[0])
    dec = StandaloneDecoder(model, cm, "ab" * 32, 160.0, unit="x", unit_to_uv=scale)
    names = list(cm.ch_names)
    base = (sessions[0][1][0] / scale).astype(np.float32)
    t = np.float32(dec.sat_raw)
    n_clip = int(dec.g.clip_fraction * base.shape[1])  # more than this many samples at an extreme: clipped

    def plateau(x, ch, k, at_min=False):
        v = x[ch].min() if at_min else x[ch].max()
        x[ch, :k] = v

    edits = [
        lambda x: x.__setitem__((3, 7), np.nan), lambda x: x.__setitem__((4, 0), -np.inf),
        lambda x: x.__setitem__(0, np.float32(5.0 / scale)),
        lambda x: x.__setitem__((10, 5), t), lambda x: x.__setitem__((11, 5), -t),
        lambda x: x.__setitem__((12, 5), np.nextafter(t, np.float32(0))),
        lambda x: plateau(x, 5, n_clip + 1), lambda x: plateau(x, 6, n_clip),
        lambda x: plateau(x, 7, n_clip + 1, at_min=True), lambda x: plateau(x, 8, n_clip, at_min=True),
        lambda x: (x.__setitem__((2, 3), np.inf), x.__setitem__(2, x[2])),
    ]
    checked = 0
    for edit in [None, *edits]:
        x = base.copy()
        if edit is not None:
            edit(x)
        want = check_window(x.astype(np.float64) * scale, names)
        with torch.no_grad():
            flags, _, ok = dec._guard(torch.from_numpy(x))
        got = {k: [names[i] for i in np.flatnonzero(row > 0)] for k, row in zip(GUARD_KINDS, flags.numpy())}
        got = {k: v for k, v in got.items() if v}
        assert got == want.bad_channels and bool(ok) == want.ok, (edit, got, want)
        checked += not want.ok
    assert checked >= 8
