"""`edge-client join` in a federation of device profiles (issue 19): the client's device (a captured store's
channels and rate, or the profile an EEGMMIDB subject is presented through) is matched against the federation's
profiles; a recording that matches none is one clear line."""

from __future__ import annotations

import numpy as np
import pytest

from neurofed.edge.capture import RawTrial
from neurofed.edge.join_cli import make_loader, make_montage
from neurofed.edge.store import LocalStore
from neurofed.trainer.data.profiles import ProfileError, get_profile, match_profile
from neurofed.trainer.errors import DataError

FED = [get_profile("unicorn8"), get_profile("cyton_daisy16")]


def _store(path, ch_names, sfreq) -> LocalStore:
    st = LocalStore(path, subject="S001", classes=("left_fist", "right_fist"))
    x = np.random.default_rng(0).normal(0, 10, (len(ch_names), int(4 * sfreq))).astype(np.float32)
    st.append(RawTrial(x, "left_fist", 0.0, float(sfreq), list(ch_names)))
    return st


def test_a_store_is_its_devices_profile_or_one_clear_line(tmp_path):
    uni = get_profile("unicorn8")
    _store(tmp_path / "uni", uni.channels, uni.sfreq)
    ch, sf = make_montage(tmp_path / "uni", None)()
    assert match_profile(ch, sf, FED).name == "unicorn8"
    _store(tmp_path / "lab", ["C3", "Cz", "C4"], 160.0)  # a recording no profile of the federation describes
    with pytest.raises(ProfileError) as exc:
        match_profile(*make_montage(tmp_path / "lab", None)(), FED)
    msg = str(exc.value)
    assert msg == "stream with 3 channels at 160 Hz (C3, Cz, C4) matches no device profile (unicorn8, cyton_daisy16)"
    LocalStore(tmp_path / "empty")
    with pytest.raises(DataError, match="holds no trials yet"):
        make_montage(tmp_path / "empty", None)()


def test_a_subject_is_presented_through_its_profile(tmp_path):
    ch, sf = make_montage(None, "cyton_daisy16")()
    assert (ch, sf) == (list(get_profile("cyton_daisy16").channels), 125.0)
    assert make_montage(None, None)()[1] == 160.0  # default lab64: the EEGMMIDB recording as it is
    with pytest.raises(DataError, match="a --store is already a device's"):
        make_loader(None, None, tmp_path, "unicorn8")
