"""Input guard on real EEG windows with injected faults."""

from __future__ import annotations

import numpy as np
import pytest

from neurofed.edge.guard import GuardConfig, check_window
from neurofed.trainer.data.io import epochs_from_raw, read_raw


@pytest.fixture(scope="module")
def window(data_dir):
    raw = read_raw(data_dir / "eegmmidb" / "S003" / "S003R04.edf")
    x, _ = epochs_from_raw(raw, {"T1": "left_fist", "T2": "right_fist"}, 0.0, 4.0)
    return x[0], list(raw.ch_names)


def test_clean_real_window_passes(window):
    x, names = window
    r = check_window(x, names)
    assert r.ok and r.reason == "" and r.bad_channels == {}


def test_nan_flat_saturated_are_named(window):
    x, names = window
    bad = x.copy()
    i_c3, i_cz, i_c4, i_fz = (names.index(c) for c in ("C3", "Cz", "C4", "Fz"))
    bad[i_c3, 10] = np.nan
    bad[i_cz] = 5.0  # flat (DC only)
    bad[i_c4, 100:110] = 4000.0  # beyond amplifier range
    bad[i_fz] = np.clip(bad[i_fz], -5.0, 5.0)  # clipping plateaus
    r = check_window(bad, names)
    assert not r.ok
    assert r.bad_channels["non_finite"] == ["C3"] and r.bad_channels["flat"] == ["Cz"]
    assert set(r.bad_channels["saturated"]) == {"C4", "Fz"}
    assert (
        "non-finite channel C3" in r.reason
        and "flat channel Cz" in r.reason
        and "saturated channels" in r.reason
    )


def test_shape_mismatch_and_config_validation(window):
    x, names = window
    assert "does not match" in check_window(x[:-1], names).reason
    with pytest.raises(ValueError):
        GuardConfig(clip_fraction=1.5)
    # a stricter threshold flags the real (about 10-50 uV) signal as saturated
    assert not check_window(x, names, GuardConfig(saturation_uv=1.0)).ok
