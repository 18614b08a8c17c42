"""Interoperability: a stream from mne-lsl's PlayerLSL (its own bundled liblsl) replaying a shared EDF file."""

from __future__ import annotations

import mne
import numpy as np
import pytest

from neurofed.edge.capture import CaptureConfig, LiveCapture
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS
from neurofed.trainer.data.io import epochs_from_raw, read_raw
from tests.lsl_support import unique_name

mne_lsl_player = pytest.importorskip("mne_lsl.player")


@pytest.mark.parametrize("encoding", ["string", "one-hot"])
def test_capture_from_mne_lsl_player(data_dir, encoding):
    path = data_dir / "eegmmidb" / "S001" / "S001R04.edf"
    raw = mne.io.read_raw_edf(path, preload=True, verbose="error").crop(tmin=11.0)  # 2nd cue 1.5 s in
    name = unique_name("mnelsl")
    player = mne_lsl_player.PlayerLSL(raw, chunk_size=16, n_repeat=1, name=name, source_id=unique_name("src"),
                                      annotations=True, annotations_encoding=encoding)
    standard = read_raw(path)  # trainer's view: standard 10-05 labels, microvolts
    cfg = CaptureConfig(channels=tuple(standard.ch_names), marker_map=RUN_EVENT_LABELS[4], marker_lag_samples=1)
    player.start()
    try:
        cap = LiveCapture(name=name, marker_name=f"{name}-annotations", cfg=cfg)
        assert cap.eeg.meta.ch_names[0] == "Fc5." and cap.eeg.meta.units[0] == "0"  # volts, EDF labels
        trials = []
        cap.run(trials.append, max_trials=1, duration=15)
        cap.close()
    finally:
        player.stop()
    x_off, labels = epochs_from_raw(standard, RUN_EVENT_LABELS[4], 0.0, 4.0)
    (tr,) = trials
    assert tr.label == labels[1] == "left_fist" and tr.ch_names == standard.ch_names
    np.testing.assert_allclose(tr.data, x_off[1], atol=1e-3)  # volts (float64) -> microvolts, same window
