"""Trial capture: a live epoch equals trainer's offline epoch; reordering, missing channels, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from neurofed.edge.buffer import RingBuffer
from neurofed.edge.capture import (
    CaptureConfig,
    LiveCapture,
    RawTrial,
    TrialCutter,
    check_stream,
    preprocess_trials,
)
from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
from neurofed.firmware_sim.recording import Recording, load_recording
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS
from neurofed.trainer.data.io import epochs_from_raw, read_raw
from neurofed.trainer.data.preprocess import preprocess_epochs
from neurofed.trainer.errors import DataError
from tests.lsl_support import unique_name

CUES_R04 = [672, 2000, 3328, 4656]  # first task cues of S001R04 (160 Hz)


@pytest.fixture(scope="module")
def r04_path(data_dir):
    return data_dir / "eegmmidb" / "S001" / "S001R04.edf"


@pytest.fixture(scope="module")
def r04(r04_path) -> Recording:
    return load_recording(r04_path, RUN_EVENT_LABELS[4])


@pytest.fixture(scope="module")
def offline(r04_path):
    """trainer's offline epochs of S001R04 (float64 raw microvolts), labels and channel names."""
    raw = read_raw(r04_path)
    x, labels = epochs_from_raw(raw, RUN_EVENT_LABELS[4], 0.0, 4.0)
    return x, labels, list(raw.ch_names)


def _capture(rec: Recording, cfg: CaptureConfig, max_trials: int, processing: str = "clocksync",
             duration: float = 30.0, **player_kw) -> tuple[list[RawTrial], LiveCapture]:
    pcfg = PlayerConfig(name=unique_name("cap"), wait_consumers=5.0, **player_kw)
    p = HeadsetPlayer(rec, pcfg)
    p.start()
    try:
        cap = LiveCapture(name=pcfg.name, cfg=cfg, processing=processing)
        trials: list[RawTrial] = []
        cap.run(trials.append, max_trials=max_trials, duration=duration, stall_warn=0.3)
        cap.close()
    finally:
        p.stop()
        p.join(timeout=10)
    return trials, cap


@pytest.mark.parametrize("pcfg", [PreprocessConfig(), PreprocessConfig.from_preset("sensorimotor21", resample=80.0)],
                         ids=["all-160Hz", "sm21-80Hz"])
def test_live_epoch_equals_offline_epoch(r04, offline, pcfg):
    """KEY: S001R04 replayed over LSL (float32 on the wire) -> same preprocessed epochs as trainer offline."""
    x_off, labels, names = offline
    trials, cap = _capture(r04, CaptureConfig(preprocess=pcfg), max_trials=15, speed=30)
    assert [t.label for t in trials] == labels and cap.stats.skipped == []
    x_live, sfreq, live_names = preprocess_trials(trials, pcfg)
    x_ref, sfreq_ref, ref_names = preprocess_epochs(x_off, 160.0, names, pcfg)
    assert live_names == ref_names and sfreq == sfreq_ref and x_live.shape == x_ref.shape
    np.testing.assert_allclose(x_live, x_ref, rtol=0, atol=1e-3)  # microvolts; float32 wire precision
    np.testing.assert_allclose(np.stack([t.data for t in trials]), x_off, rtol=1e-6, atol=1e-4)


def test_reorders_channels_by_label_with_clock_offset_and_jitter(r04, offline):
    x_off, labels, names = offline
    perm = np.random.default_rng(0).permutation(len(names))
    shuffled = Recording(np.ascontiguousarray(r04.data[:, perm]), 160.0, [names[i] for i in perm], r04.markers, "shuffled")
    cfg = CaptureConfig(channels=tuple(names))
    trials, _ = _capture(shuffled, cfg, max_trials=4, speed=40, max_samples=CUES_R04[-1] + 700,
                         clock_offset=-25.0, jitter=0.0005, processing="dejitter")
    assert [t.ch_names for t in trials] == [names] * 4 and [t.label for t in trials] == labels[:4]
    np.testing.assert_allclose(np.stack([t.data for t in trials]), x_off[:4], atol=1e-4)


def test_missing_channels_listed(r04):
    keep = [i for i, c in enumerate(r04.ch_names) if c not in ("C3", "Cz")]
    rec = Recording(np.ascontiguousarray(r04.data[:, keep]), 160.0, [r04.ch_names[i] for i in keep], [], "no-C3-Cz")
    cfg = CaptureConfig(preprocess=PreprocessConfig.from_preset("sensorimotor21"))
    with pytest.raises(DataError, match=r"missing channels \['C3', 'Cz'\]"):
        _capture(rec, cfg, max_trials=1, max_samples=200)


def test_bad_stream_rate_and_units():
    names, units = ["C3", "Cz", "C4"], ["microvolts"] * 3
    with pytest.raises(DataError, match="sampling rate is 160 Hz but 250 Hz was expected"):
        check_stream(160.0, names, units, CaptureConfig(expected_sfreq=250.0))
    with pytest.raises(DataError, match="irregular sampling rate"):
        check_stream(0.0, names, units, CaptureConfig())
    with pytest.raises(DataError, match="too low"):
        check_stream(50.0, names, units, CaptureConfig())
    with pytest.raises(DataError, match=r"units must be microvolts .*got \[\('C3', 'kelvin'\)"):
        check_stream(160.0, names, ["kelvin", "uV", "µV"], CaptureConfig())
    idx, kept, scale = check_stream(160.0, ["Cz.", "C4", "C3"], ["volts", "0", "-6"],
                                    CaptureConfig(channels=("C3", "CZ", "C4")))
    assert idx == [2, 0, 1] and kept == ["C3", "CZ", "C4"] and list(scale) == [1.0, 1e6, 1e6]


def test_wrong_units_on_a_live_stream():
    rec = Recording(np.zeros((100, 3), np.float32), 160.0, ["C3", "Cz", "C4"], [], "degC")
    with pytest.raises(DataError, match=r"units must be microvolts .*'degC'"):
        _capture(rec, CaptureConfig(), max_trials=1, unit="degC")


def _cutter(n_ch: int = 2, sfreq: float = 100.0, **kw) -> TrialCutter:
    cfg = CaptureConfig(preprocess=PreprocessConfig(tmin=0.0, tmax=1.0), **kw)
    return TrialCutter(sfreq, [f"C{i}" for i in range(n_ch)], ["microvolts"] * n_ch, cfg)


def _feed(buf: RingBuffer, start: int, n: int, sfreq: float = 100.0, value: float | None = None) -> None:
    idx = np.arange(start, start + n)
    data = np.repeat(idx[:, None], buf.n_channels, 1).astype(np.float32) if value is None else \
        np.full((n, buf.n_channels), value, np.float32)
    buf.append(data, idx / sfreq)


def test_cutter_waits_for_data_then_cuts_nan_markers_without_data_and_gaps():
    cut, buf = _cutter(), RingBuffer(2, 1000)
    cut.add_marker(1.0, "left_fist", now=0.0)  # marker before its data (cue sample 100)
    cut.add_marker(1.5, "rest", now=0.0)  # not a class: ignored
    _feed(buf, 0, 150)
    assert cut.poll(buf, now=0.1) == [] and len(cut.pending) == 1  # window [100, 200) incomplete
    _feed(buf, 150, 100)
    (tr,) = cut.poll(buf, now=0.2)
    assert tr.label == "left_fist" and np.array_equal(tr.data[0], np.arange(100, 200)) and tr.first_index == 100
    cut.add_marker(3.0, "right_fist", now=0.2)  # its data never comes
    assert cut.poll(buf, now=5.0) == [] and cut.pending
    assert cut.poll(buf, now=20.0) == [] and "no EEG data for it after 10 s" in cut.skipped[-1]
    _feed(buf, 250, 50)
    _feed(buf, 300, 20, value=np.nan)  # NaN samples inside the next window
    _feed(buf, 320, 100)
    cut.add_marker(2.6, "left_fist", now=21.0)
    assert cut.poll(buf, now=21.0) == [] and "NaN" in cut.skipped[-1]
    buf.append(np.zeros((100, 2), np.float32), np.arange(450, 550) / 100)  # samples 420..449 lost
    cut.add_marker(4.0, "right_fist", now=22.0)
    assert cut.poll(buf, now=22.0) == [] and "samples lost inside the window" in cut.skipped[-1]
    cut.add_marker(4.35, "right_fist", now=22.0)  # the cue sample itself was lost
    assert cut.poll(buf, now=22.0) == [] and "data lost" in cut.skipped[-1]
    buf.append(np.full((100, 2), 3e-5, np.float32), np.arange(550, 650) / 100)  # volts labelled microvolts
    cut.add_marker(5.45, "left_fist", now=23.0)
    assert cut.poll(buf, now=23.0) == [] and "probably in volts" in cut.skipped[-1]


def test_stream_vanishing_mid_trial_then_recovering(r04, offline):
    """Outage over the first trial: it is skipped with a message, later trials arrive after reconnection."""
    x_off, labels, _ = offline
    trials, cap = _capture(r04, CaptureConfig(), max_trials=2, speed=8, outages=((6.0, 6.0),),
                           max_samples=CUES_R04[2] + 700)
    assert "samples lost inside the window" in cap.stats.skipped[0] or "data lost" in cap.stats.skipped[0]
    assert cap.stats.outages >= 1
    assert [t.label for t in trials] == labels[1:3]
    np.testing.assert_allclose(np.stack([t.data for t in trials]), x_off[1:3], atol=1e-4)


def test_stalled_sender_keeps_its_inlets_and_loses_no_trial(r04, offline):
    """A headset that freezes with its outlets open (a starved sender on a loaded host) for longer than
    ``reconnect_after``, then pushes its backlog: the capture keeps its inlets (the outlet's uid is unchanged:
    fresh inlets would miss what arrives while they connect), counts one outage and stores every trial."""
    x_off, labels, _ = offline
    pcfg = PlayerConfig(name=unique_name("stall"), wait_consumers=5.0, speed=8, max_samples=CUES_R04[2] + 700,
                        stalls=((CUES_R04[1] / 160 + 1.0, 6.0),))  # frozen 6 s inside the second trial
    p = HeadsetPlayer(r04, pcfg)
    p.start()
    try:
        cap = LiveCapture(name=pcfg.name, cfg=CaptureConfig(), reconnect_after=1.0)
        inlets = (cap.eeg, cap.markers)
        trials: list[RawTrial] = []
        cap.run(trials.append, max_trials=3, duration=30.0, stall_warn=0.5)
        kept = (cap.eeg, cap.markers) == inlets
        cap.close()
    finally:
        p.stop()
        p.join(timeout=10)
    assert kept and cap.stats.skipped == [] and cap.stats.outages == 1  # the stall is reported, not a loss
    assert [t.label for t in trials] == labels[:3]
    np.testing.assert_allclose(np.stack([t.data for t in trials]), x_off[:3], atol=1e-4)
