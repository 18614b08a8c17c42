"""Inference engine on plain arrays: a real recording streamed in chunks, cue-locked and sliding, through the
edge's one ring buffer and windower (the ones recording uses)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neurofed.edge.buffer import RingBuffer
from neurofed.edge.infer import (
    DecoderStep,
    InferenceEngine,
    Prediction,
    PythonDecoder,
    PythonState,
    Rejection,
    check_stream,
)
from neurofed.edge.windowing import CueWindower, SlidingWindower
from neurofed.export.runtime import OnnxModel
from neurofed.trainer.data.io import epochs_from_raw, read_raw
from neurofed.trainer.data.preprocess import apply_ea, ea_matrix, preprocess_epochs
from neurofed.trainer.errors import NeuroFedError
from tests.export.conftest import exported_eegnet

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def eegnet_bs(tmp_path_factory, data_dir):
    """A real batch-specific EEGNet checkpoint and its verified ONNX export (shared per session)."""
    return exported_eegnet(tmp_path_factory, data_dir)


LABELS = {"T1": "left_fist", "T2": "right_fist"}


@pytest.fixture(scope="module")
def recording(data_dir):
    raw = read_raw(data_dir / "eegmmidb" / "S003" / "S003R04.edf")
    data = raw.get_data() * 1e6
    onsets = [float(o) for o, d in zip(raw.annotations.onset, raw.annotations.description) if d in LABELS]
    return raw, data, list(raw.ch_names), float(raw.info["sfreq"]), onsets


def _stream(engine, data, sfreq, onsets, chunk=32):
    """Push the recording chunk by chunk; cues are announced when stream time reaches them."""
    ring = RingBuffer(data.shape[0], int(10 * sfreq), np.float64)
    cw = CueWindower(engine.window_samples, sfreq, engine.cfg.tmin)
    pending = list(onsets)
    windows, results = [], []
    for i in range(0, data.shape[1], chunk):
        ts = np.arange(i, min(i + chunk, data.shape[1])) / sfreq
        ring.append(data[:, i : i + chunk].T, ts, arrival=float(ts[-1]))
        while pending and pending[0] <= ts[-1]:
            cw.add_cue(pending.pop(0))
        for w in cw.poll(ring):
            windows.append(w.data.T)
            results.append(engine.process_window(w))
    return windows, results


def test_online_ea_converges_to_offline_ea(recording, eegnet_bs):
    raw, _, _, _, _ = recording
    x, _ = epochs_from_raw(raw, LABELS, 0.0, 4.0)
    om = OnnxModel(eegnet_bs[1])
    cfg = PythonDecoder(om, 160.0, 8).cfg
    xp, _, _ = preprocess_epochs(x, 160.0, raw.ch_names, cfg)
    dec = PythonDecoder(om, 160.0, 8, ea_min_windows=3)
    assert isinstance(dec, DecoderStep)
    state = dec.init_state()
    assert np.allclose(dec.ea_matrix(state), np.eye(21))
    raw_w = x[:, [list(raw.ch_names).index(c) for c in om.meta.ch_names]]
    for w in raw_w:
        before = state
        _, state = dec.step(w, state)
        assert before.seen == state.seen - 1  # the step returned a new state, the old one is untouched
    assert state.ea_count == len(x) and dec.describe(state) == (7, len(x))
    assert np.allclose(dec.ea_matrix(state), ea_matrix(xp), atol=1e-8)
    ref = np.cov(xp[0])
    m = PythonDecoder(om, 160.0, 8, ref, ea_min_windows=2).ea_matrix(PythonState(state.ea_sum, 1, state.context))
    assert np.allclose(m @ ref @ m, np.eye(21), atol=1e-6)


def test_cue_locked_stream_matches_offline_pipeline(recording, eegnet_bs):
    raw, data, names, sfreq, onsets = recording
    om = OnnxModel(eegnet_bs[1])
    engine = InferenceEngine(om, names, sfreq)
    windows, results = _stream(engine, data, sfreq, onsets)
    x, _ = epochs_from_raw(raw, LABELS, 0.0, 4.0)
    assert len(results) == len(x) == 15 and all(isinstance(r, Prediction) for r in results)
    assert np.array_equal(np.stack(windows), x)  # cue-locked windows == offline epochs, sample for sample
    assert [r.n_context for r in results] == [0, 1, 2, 3, 4, 5, 6] + [7] * 8
    assert results[-1].t_end == pytest.approx(onsets[-1] + 4.0 - 1 / sfreq)
    # after all trials: online EA == offline per-subject EA, and the last decision equals the offline
    # protocol (EA over all trials, test batch of the last 8 trials)
    xp, _, _ = preprocess_epochs(x, sfreq, names, engine.cfg)
    assert np.allclose(engine.decoder.ea_matrix(engine.state), ea_matrix(xp), atol=1e-8)
    logits = om.forward(apply_ea(xp[-8:], ea_matrix(xp)).astype(np.float32))[-1]
    p = np.exp(logits - logits.max())
    p /= p.sum()
    assert np.allclose(results[-1].probabilities, p, atol=1e-4)
    assert results[-1].label == om.meta.classes[int(p.argmax())]


def test_bad_window_rejected_without_touching_state(recording, eegnet_bs):
    _, data, names, sfreq, onsets = recording
    engine = InferenceEngine(OnnxModel(eegnet_bs[1]), names, sfreq)
    start = int(onsets[0] * sfreq)
    w = data[:, start : start + engine.window_samples].copy()
    assert isinstance(engine.process(w, 1.0), Prediction)
    w[names.index("C3"), 5] = np.nan
    r = engine.process(w, 2.0)
    assert isinstance(r, Rejection) and "C3" in r.reason and r.t_end == 2.0
    assert engine.state.ea_count == 1 and len(engine.state.context) == 1
    w[names.index("Fz"), 5] = np.nan  # not a model channel: ignored
    w[names.index("C3"), 5] = 0.0
    assert isinstance(engine.process(w, 3.0), Prediction)


@pytest.mark.parametrize("chunk", [16, 160])  # 0.1 s and 1 s chunks: several windows per poll
def test_sliding_windows(recording, eegnet_bs, chunk):
    _, data, names, sfreq, _ = recording
    engine = InferenceEngine(OnnxModel(eegnet_bs[1]), names, sfreq)
    n = engine.window_samples
    ring, sw = RingBuffer(len(names), 1000, np.float64), SlidingWindower(n, 0.5, sfreq)
    ends = []
    for i in range(0, int(10 * sfreq), chunk):  # 10 s of the recording
        ring.append(data[:, i : i + chunk].T, np.arange(i, i + chunk) / sfreq)
        for w in sw.poll(ring):
            k = round(w.t_end * sfreq)  # index of the window's last sample
            assert np.array_equal(w.data.T, data[:, k - n + 1 : k + 1]) and w.first_index == k - n + 1
            ends.append(engine.process_window(w).t_end)
    assert ends[0] == pytest.approx((n - 1) / sfreq)
    assert np.allclose(np.diff(ends), 0.5, atol=1e-9) and len(ends) == 13


def test_stream_mismatch_errors(recording, eegnet_bs):
    _, _, names, _, _ = recording
    om = OnnxModel(eegnet_bs[1])
    with pytest.raises(NeuroFedError, match=r"missing channels \['C3'\]"):
        InferenceEngine(om, [c for c in names if c != "C3"], 160.0)
    with pytest.raises(NeuroFedError, match="too low"):
        InferenceEngine(om, names, 50.0)
    fixed = om.meta.model_copy(update={"preprocess": {**om.meta.preprocess, "resample": None}})
    with pytest.raises(NeuroFedError, match="differs from the model's 80.0 Hz"):
        check_stream(fixed, names, 160.0)
    with pytest.raises(NeuroFedError, match="window shape"):
        InferenceEngine(om, names, 160.0).process(np.zeros((64, 10)), 0.0)


def test_plain_batch_specific_export_is_said_once(recording, eegnet_bs, caplog):
    """The batch-1 trap: decoding with a plain batch-specific-BN export logs one line naming the minimum batch
    and the standalone graph (with --context 1: every window is decoded with too few)."""
    import logging
    import warnings

    from neurofed_runtime.errors import SmallBatchWarning

    _, data, ch_names, sfreq, _ = recording
    om = OnnxModel(eegnet_bs[1])
    assert om.min_windows == om.meta.min_batch == 8
    with caplog.at_level(logging.WARNING, logger="neurofed.edge"):
        eng = InferenceEngine(om, ch_names, sfreq, context=1)
    (rec,) = [r for r in caplog.records if "minimum batch" in r.getMessage()]
    msg = rec.getMessage()
    assert "--context 1 is below its minimum batch 8" in msg and "--standalone" in msg and "\n" not in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBatchWarning)  # said once above, not once per window
        eng.process(data[:, 1000 : 1000 + eng.window_samples], 0.0)
