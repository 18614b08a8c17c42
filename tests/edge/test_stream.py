"""The edge's shared live-path pieces: stream normalisation, ring buffer, windowers, and
"a stream ``edge-client record`` accepts, ``edge-client infer`` accepts"."""

from __future__ import annotations

import numpy as np
import pytest

from neurofed.edge.buffer import RingBuffer
from neurofed.edge.capture import CaptureConfig, TrialCutter, check_stream
from neurofed.edge.infer import InferenceEngine, Prediction
from neurofed.edge.stream import match_stream, stream_profile
from neurofed.edge.windowing import CueWindower, SlidingWindower
from neurofed.export.runtime import OnnxModel
from neurofed.trainer.data.preprocess import ea_inv_sqrt, ea_matrix, pick_channels
from neurofed.trainer.data.profiles import ProfileError, get_profile, to_microvolts
from neurofed.trainer.data.units import norm_label, unit_scale
from neurofed.trainer.errors import DataError, NeuroFedError
from tests.export.conftest import exported_eegnet


@pytest.fixture(scope="module")
def eegnet_bs(tmp_path_factory, data_dir):
    return exported_eegnet(tmp_path_factory, data_dir)


def test_units_and_labels():
    assert [unit_scale(u) for u in ("", "uV", "µV", "microvolts", "0", "-6", "-3", "volts", "mV", "nV")] == \
        [1.0, 1.0, 1.0, 1.0, 1e6, 1.0, 1e3, 1e6, 1e3, 1e-3]
    assert unit_scale("furlongs") is None and unit_scale("1.5") is None
    assert norm_label(" Fc5. ") == norm_label("FC5") == "fc5" and norm_label("C3..") == "c3"
    x = np.arange(3)[None, :, None]
    assert pick_channels(x, ["Fc5.", "C3..", "Cz.."], ["CZ", "FC5"])[0, :, 0].tolist() == [2, 0]  # same rule


def test_match_stream_layout_and_errors():
    lay = match_stream(160.0, ["Samples", "Cz..", "C4.", "C3"], ["samples", "0", "-6", "uV"], ["C3", "CZ", "C4"])
    assert lay.idx == [3, 1, 2] and lay.names == ["C3", "CZ", "C4"] and list(lay.scale) == [1.0, 1e6, 1.0]
    x = np.array([[7.0, 1e-6, 2.0, 3.0]])  # one sample, stream layout
    assert np.array_equal(lay.select(x), [[3.0], [1.0], [2.0]])
    assert match_stream(160.0, ["Samples", "C3"], ["samples", "uV"]).names == ["C3"]  # counter never EEG
    with pytest.raises(DataError, match=r"s1: missing channels \['C4', 'Fz'\]"):
        match_stream(160.0, ["C3"], None, ["C3", "C4"], also_needed=["Fz"], source="s1")
    with pytest.raises(DataError, match=r"units must be .*\('C3', 'kelvin'\)"):
        match_stream(160.0, ["C3"], ["kelvin"])
    with pytest.raises(DataError, match="too low for a 40 Hz"):
        match_stream(60.0, ["C3"], fmax=40.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layout_select_is_the_columns_in_microvolts_as_a_float64_copy(dtype):
    """``select`` (a slice when the wanted channels are the stream's first columns in order, else one gather)
    == picking the columns, scaling to microvolts, channel-major float64; never a view of the input."""
    from neurofed.edge.stream import StreamLayout

    x = np.random.default_rng(0).standard_normal((640, 66)).astype(dtype)
    for idx, scale in [(list(range(66)), np.ones(66)), (list(range(64)), np.ones(64)), ([2, 0, 5], np.ones(3)),
                       ([3, 1], np.array([1e6, 1e-3]))]:
        got = StreamLayout(idx, [f"c{i}" for i in idx], scale).select(x)
        want = x[:, idx].T.astype(np.float64) * scale[:, None]
        assert got.dtype == np.float64 and np.array_equal(got, want) and not np.shares_memory(got, x)


@pytest.mark.parametrize("labels,units,factor", [
    (None, None, 1.0),  # the model's own spelling, no units
    ("dotted", ["0"], 1e-6),  # EEGMMIDB labels, mne-lsl's code for volts
    ("upper", ["millivolts"], 1e-3),
    ("dotted", ["-6"], 1.0),
])
def test_record_accepts_implies_infer_accepts(eegnet_bs, data_dir, labels, units, factor):
    """Same stream description: capture's check accepts it -> the engine accepts it and decodes the same."""
    om = OnnxModel(eegnet_bs[1])
    chans = list(om.meta.ch_names) + ["Fz", "Samples"]
    names = {None: chans, "dotted": [c.capitalize().ljust(4, ".") for c in chans[:-1]] + ["Samples"],
             "upper": [c.upper() for c in chans]}[labels]
    u = [""] * len(names) if units is None else units * (len(names) - 1) + ["samples"]
    check_stream(160.0, names, u, CaptureConfig())  # edge-client record accepts
    engine = InferenceEngine(om, names, 160.0, stream_units=u)  # so does edge-client infer
    ref = InferenceEngine(om, chans, 160.0)
    rng = np.random.default_rng(0)
    for _ in range(3):
        w_uv = rng.standard_normal((len(chans), ref.window_samples)) * 20.0
        got, want = engine.process(w_uv * factor, 0.0), ref.process(w_uv, 0.0)
        assert isinstance(got, Prediction) and np.allclose(got.probabilities, want.probabilities, atol=1e-6)


def test_infer_refuses_what_record_refuses(eegnet_bs):
    om = OnnxModel(eegnet_bs[1])
    names = list(om.meta.ch_names)
    for units in (["kelvin"] * len(names),):
        with pytest.raises(DataError):
            check_stream(160.0, names, units, CaptureConfig())
        with pytest.raises(NeuroFedError, match="units must be"):
            InferenceEngine(om, names, 160.0, stream_units=units)


def test_ring_buffer_is_vectorised_wraps_and_keeps_arrival():
    buf = RingBuffer(2, 10, np.float64)
    for k in range(4):  # 4 chunks of 4 samples: wraps, keeps the newest 10
        idx = np.arange(4 * k, 4 * k + 4)
        buf.append(np.stack([idx, -idx], 1).astype(float), idx / 100.0, arrival=1000.0 + k)
    assert (buf.first, buf.total, len(buf)) == (6, 16, 10)
    d, t = buf.get(6, 16)
    assert np.array_equal(d[:, 0], np.arange(6, 16)) and np.allclose(t, np.arange(6, 16) / 100)
    assert buf.arrival_of(15) == 1003.0 and buf.arrival_of(7) == 1001.0
    buf.append(np.zeros((25, 2)), np.arange(16, 41) / 100.0)  # larger than the buffer: newest 10 kept
    assert buf.first == 31 and np.isnan(buf.arrival_of(40))
    with pytest.raises(DataError, match="not in the buffer"):
        buf.get(20, 25)


def test_cue_windower_with_lag_and_gap_and_sliding_windower():
    sf = 100.0
    buf = RingBuffer(1, 1000, np.float64)
    cw = CueWindower(50, sf, tmin=0.5, lag_samples=1, marker_timeout=2.0)
    cw.add_cue(1.004, "a", now=0.0)  # nearest sample 100 -> window [151, 201)
    buf.append(np.arange(150.0)[:, None], np.arange(150) / sf, arrival=5.0)
    assert cw.poll(buf, now=0.1) == [] and len(cw.pending) == 1
    buf.append(np.arange(150.0, 300.0)[:, None], np.arange(150, 300) / sf, arrival=6.0)
    (w,) = cw.poll(buf, now=0.2)
    assert w.first_index == 151 and np.array_equal(w.data[:, 0], np.arange(151, 201))
    assert (w.label, w.onset, w.t_end, w.t_arrival) == ("a", 1.004, 2.0, 6.0)
    cw.add_cue(9.0, "never", now=0.2)
    assert cw.poll(buf, now=3.0) == [] and "no EEG data for it after 2 s" in cw.skipped[-1]
    # samples 300..309 lost: a sliding window over the gap is skipped, the next ones are cut
    buf.append(np.arange(310.0, 400.0)[:, None], np.arange(310, 400) / sf, arrival=7.0)
    sw = SlidingWindower(50, 0.5, sf)
    ends = [w.t_end for w in sw.poll(buf)]
    assert ends == [pytest.approx(0.49 + 0.5 * k) for k in range(8) if k != 6]  # 3.49 spans the gap
    assert "samples lost inside the window" in sw.skipped[-1]


def test_trial_cutter_uses_the_shared_windower():
    cut = TrialCutter(100.0, ["C3.", "C4"], ["0", "uV"], CaptureConfig(channels=("C4", "C3"),
                                                                        preprocess=_pcfg()))
    buf = RingBuffer(2, 1000, np.float32)
    cut.add_marker(1.0, "left_fist", now=0.0)
    buf.append(np.stack([np.full(300, 2e-6), np.full(300, 5.0)], 1).astype(np.float32), np.arange(300) / 100.0)
    (tr,) = cut.poll(buf, now=0.0)
    assert tr.ch_names == ["C4", "C3"] and np.allclose(tr.data[0], 5.0) and np.allclose(tr.data[1], 2.0)
    assert cut.skipped is cut.windower.skipped


def _pcfg():
    from neurofed.trainer.data.config import PreprocessConfig

    return PreprocessConfig(tmin=0.0, tmax=1.0)


def test_one_ea_inverse_square_root():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4, 100))
    r = np.einsum("nct,ndt->cd", x, x) / (5 * 100)
    m = ea_inv_sqrt(r)
    assert np.allclose(m @ r @ m, np.eye(4), atol=1e-10) and np.array_equal(m, ea_matrix(x))
    with pytest.raises(DataError, match="not positive"):
        ea_inv_sqrt(np.zeros((3, 3)))


def test_counts_are_read_with_the_matched_profiles_gain():
    """A stream in raw counts (issue 19): recording reads it with the gain of the shipped profile its channels and
    rate match (the same conversion as :func:`neurofed.trainer.data.profiles.to_microvolts`); anything else is one line."""
    cyton, uni = get_profile("cyton_daisy16"), get_profile("unicorn8")
    ch = list(cyton.channels)
    assert stream_profile(125.0, ch, ["microvolts"] * 16) is None  # a physical unit needs no profile
    assert stream_profile(125.0, ["Samples"] + ch, ["samples"] + ["counts"] * 16) == cyton  # counter ignored
    x_uv = np.random.default_rng(0).standard_normal((16, 50)) * 30
    counts = (x_uv * cyton.scale).astype(np.float32)  # what the headset streams
    cut = TrialCutter(125.0, ch, ["counts"] * 16, CaptureConfig())
    assert cut.profile == cyton
    np.testing.assert_allclose(cut.layout.select(counts.T), to_microvolts(counts, cyton), rtol=1e-15)
    np.testing.assert_allclose(cut.layout.select(counts.T), x_uv, rtol=0, atol=1e-5 * np.abs(x_uv).max())
    with pytest.raises(ProfileError) as e:  # Cyton channels at another rate: no profile
        TrialCutter(250.0, ch, ["counts"] * 16, CaptureConfig(), source="s")
    assert str(e.value).startswith("s: raw counts need the gain of a device profile, but the stream with 16 "
                                   "channels at 250 Hz (Fp1, Fp2, F7, F3, F4, F8, C3, C4, ...) matches no device profile")
    with pytest.raises(ProfileError, match="^s: raw counts need the gain of a device profile in counts, but the "
                                           "stream matches unicorn8, whose unit is uV$"):
        check_stream(250.0, list(uni.channels), ["counts"] * 8, CaptureConfig(), source="s")
    with pytest.raises(DataError, match=r"^s: channels \['Fp1'\] are in raw counts, but no device profile"):
        match_stream(125.0, ch, ["counts"] + ["uV"] * 15, source="s")  # the decoding path without a counts profile
