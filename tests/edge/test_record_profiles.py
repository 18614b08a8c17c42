"""``edge-client record`` of a headset that streams raw amplifier counts (issue 19: cyton_daisy16, ADS1299 counts
at PGA gain 24): the trials are converted with the gain of the device profile the stream matches and stored in
microvolts like every other device's; a counts stream matching no profile is one line, nothing stored."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from neurofed.edge.store import LocalStore
from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
from neurofed.firmware_sim.recording import LSL_UNITS, load_recording, through_profile
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS
from neurofed.trainer.data.io import epochs_from_raw, read_raw
from neurofed.trainer.data.profiles import get_profile, present_raw
from tests.lsl_support import unique_name

EDGE = [sys.executable, "-c", "from neurofed.edge.cli import main; main()"]
SEED = 3  # the headset's noise seed


def _headset(path, prof, name: str) -> HeadsetPlayer:
    """headset-sim --profile: the recording through ``prof`` (channels, rate, seeded noise, unit and gain)."""
    cfg = PlayerConfig(name=name, speed=10, loop=True, wait_consumers=30.0, unit=LSL_UNITS[prof.unit])
    p = HeadsetPlayer(through_profile(load_recording(path, RUN_EVENT_LABELS[4]), prof, SEED), cfg)
    p.start()
    return p


@pytest.mark.slow
def test_record_counts_stream_stores_microvolts_of_its_profile(data_dir, tmp_path):
    path = data_dir / "eegmmidb" / "S001" / "S001R04.edf"
    prof = get_profile("cyton_daisy16")
    assert prof.unit == "counts"
    name = unique_name("reccounts")
    player = _headset(path, prof, name)
    try:
        store = tmp_path / "store"
        r = subprocess.run(EDGE + ["record", "--stream", name, "--store", str(store), "--subject", "S001",
                                   "--duration", "60", "--max-trials", "3"],
                           capture_output=True, text=True, check=False, timeout=120)
    finally:
        player.stop()
        player.join(timeout=10)
    assert r.returncode == 0, r.stderr
    assert "captured 3 trials" in r.stdout and "16 ch @ 125 Hz" in r.stdout
    assert "stream matches device profile cyton_daisy16 (44.739 counts per µV)" in r.stdout
    st = LocalStore(store)
    assert st.verify() == [] and st.meta["unit"] == "microvolts"
    assert (st.meta["ch_names"], st.meta["sfreq"]) == (list(prof.channels), 125.0)
    # the same recording presented through the profile (same seeded noise), read back in volts (epochs in microvolts)
    raw = present_raw(read_raw(path), prof, np.random.default_rng([SEED, 19]))
    x_off, labels = epochs_from_raw(raw, RUN_EVENT_LABELS[4], 0.0, 4.0)
    x, got = st.raw_trials()
    assert x.dtype == np.float32 and x.shape == (3, 16, 500)
    # float32 on the wire (counts = uV * gain) and in the store: a few float32 ulps of the amplitude
    tol = 4 * np.finfo(np.float32).eps * float(np.abs(x_off).max())
    worst = 0.0
    for xi, lab in zip(x, got):
        k = int(np.argmin(np.abs(x_off - xi).max(axis=(1, 2))))
        np.testing.assert_allclose(xi, x_off[k], rtol=0, atol=tol)
        assert labels[k] == lab
        worst = max(worst, float(np.abs(xi - x_off[k]).max()))
    print(f"stored vs presented: max |diff| {worst:.3g} uV, tolerance {tol:.3g} uV")  # pytest -rP
    # a counts store is read like any other: train-ready in microvolts
    sd = st.load_subject_data(PreprocessConfig())
    assert sd.X.shape[:2] == (3, 16) and sd.ch_names == list(prof.channels)


def test_record_counts_stream_matching_no_profile_is_one_line(data_dir, tmp_path):
    """Cyton channels in counts, but at 250 Hz (no shipped profile): refused before anything is stored."""
    path = data_dir / "eegmmidb" / "S001" / "S001R04.edf"
    odd = replace(get_profile("cyton_daisy16"), name="cyton16_250", sfreq=250.0)
    name = unique_name("reccounts-odd")
    player = _headset(path, odd, name)
    try:
        store = tmp_path / "store"
        r = subprocess.run(EDGE + ["record", "--stream", name, "--store", str(store), "--duration", "20"],
                           capture_output=True, text=True, check=False, timeout=90)
    finally:
        player.stop()
        player.join(timeout=10)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: {name}: raw counts need the gain of a device profile, but the "
                               "stream with 16 channels at 250 Hz (Fp1, Fp2, F7, F3, F4, F8, C3, C4, ...) matches "
                               "no device profile ("), r.stderr
    assert len(LocalStore(store)) == 0 and not (store / "meta.json").exists()
