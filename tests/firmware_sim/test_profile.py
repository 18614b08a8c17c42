"""headset-sim --profile (issue 19): a simulated headset streams its device profile's channels, rate and unit."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from neurofed.edge.lsl_io import Inlet, find_stream
from neurofed.firmware_sim.recording import load_eegmmidb, through_profile
from neurofed.trainer.data.profiles import DeviceProfile, ProfileError, get_profile, to_device
from tests.lsl_support import drain, unique_name

RUN = [sys.executable, "-c", "from neurofed.firmware_sim.cli import main; main()"]


def test_recording_through_profile_keeps_cue_times(data_dir):
    rec = load_eegmmidb(1, data_dir, [4])
    out = through_profile(rec, "cyton_daisy16", seed=0)
    prof = get_profile("cyton_daisy16")
    assert out.ch_names == list(prof.channels) and out.sfreq == 125.0
    assert abs(out.n_samples - rec.n_samples * 125 / 160) <= 1
    assert [lab for _, lab in out.markers] == [lab for _, lab in rec.markers]
    assert all(abs(s2 / 125 - s1 / 160) <= 1 / 125 for (s1, _), (s2, _) in zip(rec.markers, out.markers))
    quiet = DeviceProfile("q", prof.channels, 125.0, prof.unit, prof.gain)  # no noise: the trainer's conversion
    want = to_device(rec.data.T.astype(np.float64), 160.0, rec.ch_names, quiet)
    got = through_profile(rec, quiet).data.T
    assert np.allclose(got, want, rtol=1e-6, atol=1e-3)  # counts, float32


def test_recording_lacking_profile_channels_is_refused(data_dir):
    rec = load_eegmmidb(1, data_dir, [4])
    rec.ch_names = [c if c != "Cz" else "Cq" for c in rec.ch_names]
    with pytest.raises(ProfileError, match="Cz"):
        through_profile(rec, "unicorn8")


@pytest.mark.integration
def test_cli_streams_the_profile(data_dir):
    name = unique_name("prof")
    proc = subprocess.Popen(RUN + ["--subject", "1", "--data-dir", str(data_dir), "--name", name, "--speed", "10",
                                   "--profile", "unicorn8", "--duration", "6"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        inlet = Inlet(find_stream(name=name, timeout=15))
        assert inlet.meta.sfreq == 250 and inlet.meta.n_channels == 8
        assert inlet.meta.ch_names == list(get_profile("unicorn8").channels)
        assert set(inlet.meta.units) == {"microvolts"}
        data, _ = drain(inlet, lambda d, t: len(t) >= 250, timeout=10)
        assert data.shape[1] == 8 and np.isfinite(data).all()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert "8 ch @ 250 Hz" in out


@pytest.mark.integration
def test_cli_unknown_profile_one_line():
    r = subprocess.run(RUN + ["--subject", "1", "--profile", "nosuch"], capture_output=True, text=True,
                       check=False, timeout=60)
    assert r.returncode == 2 and "unknown device profile 'nosuch'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
