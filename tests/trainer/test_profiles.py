"""Device profiles (issue 19): validation at the boundary, and real recordings presented through them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import signal

from neurofed.trainer.data import PreprocessConfig, load_eegmmidb_subject
from neurofed.trainer.data.eegmmidb import subject_files
from neurofed.trainer.data.io import read_raw
from neurofed.trainer.data.profiles import (
    DeviceProfile,
    ProfileError,
    assign_profiles,
    channel_intersection,
    get_profile,
    load_profile,
    load_profile_subject,
    match_profile,
    parse_assignment,
    present_raw,
    shipped_profiles,
    to_device,
    to_microvolts,
)

CFG = PreprocessConfig(resample=80.0)


def test_shipped_profiles_are_valid_and_distinct():
    profs = shipped_profiles()
    assert {"lab64", "research21", "cyton_daisy16", "unicorn8"} <= set(profs)
    assert {p.n_channels for p in profs.values()} >= {64, 21, 16, 8}
    assert len({p.sfreq for p in profs.values()}) >= 3
    assert len({p.unit for p in profs.values()}) >= 3
    assert channel_intersection([profs[n] for n in ("lab64", "research21", "cyton_daisy16", "unicorn8")]) == ("C3", "C4")


def test_unknown_channel_names_one_line_error(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"name": "bad", "channels": ["C3", "Cq7", "XYZ"], "sfreq": 250}))
    with pytest.raises(ProfileError) as e:
        load_profile(f)
    msg = str(e.value)
    assert "\n" not in msg and "Cq7" in msg and "XYZ" in msg and "C3'" not in msg and "bad.json" in msg


@pytest.mark.parametrize("bad, word", [
    ({"name": "x", "channels": ["C3"], "sfreq": 250, "unit": "furlong"}, "unit"),
    ({"name": "x", "channels": ["C3"], "sfreq": 5}, "sampling rate"),
    ({"name": "x", "channels": ["C3", "c3"], "sfreq": 250}, "duplicate"),
    ({"name": "x", "channels": ["C3"], "sfreq": 250, "gain": 0}, "gain"),
    ({"name": "x", "channels": ["C3"], "sfreq": 250, "colour": "red"}, "colour"),
    ({"name": "x", "sfreq": 250}, "channels"),
])
def test_profile_validation(bad, word):
    with pytest.raises(ProfileError, match=word):
        DeviceProfile.from_dict(bad)


def test_channel_names_are_canonicalised():
    assert DeviceProfile("p", ("fc5", "CZ", "po7"), 250).channels == ("FC5", "Cz", "PO7")


def test_units_and_gain_round_trip_and_scale():
    rng = np.random.default_rng(0)
    p = get_profile("cyton_daisy16")
    quiet = DeviceProfile("q", p.channels, 160.0, p.unit, p.gain)
    x16 = rng.standard_normal((16, 320))
    dev = to_device(x16, 160.0, list(p.channels), quiet)
    assert np.allclose(dev, x16 * 44.739)  # counts at PGA gain 24
    assert np.allclose(to_microvolts(dev, quiet), x16)
    v = DeviceProfile("v", p.channels, 160.0, "V")
    assert np.allclose(to_device(x16, 160.0, list(p.channels), v), x16 * 1e-6)


def test_noise_is_seeded_and_has_its_rms():
    p = DeviceProfile("n", ("C3", "C4"), 250.0, noise_uv=3.0)
    x = np.zeros((2, 25000))
    a = to_device(x, 250.0, ["C3", "C4"], p, np.random.default_rng(1))
    b = to_device(x, 250.0, ["C3", "C4"], p, np.random.default_rng(1))
    assert np.array_equal(a, b) and abs(a.std() - 3.0) < 0.05
    with pytest.raises(ValueError, match="rng"):
        to_device(x, 250.0, ["C3", "C4"], p)


def test_present_real_recording_selects_resamples_and_keeps_cues(data_dir):
    raw = read_raw(subject_files(data_dir, 1, (4,))[0])
    prof = DeviceProfile("u", get_profile("unicorn8").channels, 250.0, "counts", 44.739)  # noiseless
    out = present_raw(raw, prof)
    assert out.ch_names == list(prof.channels) and out.info["sfreq"] == 250.0
    assert abs(out.n_times - raw.n_times * 250 / 160) <= 1
    assert np.allclose(out.annotations.onset, raw.annotations.onset - raw.first_time)
    # the device's signal is the recording's channels resampled by resample_poly (unit/gain undone exactly)
    src = raw.get_data(picks=list(prof.channels)) * 1e6
    want = signal.resample_poly(src, 25, 16, axis=-1)
    assert np.allclose(out.get_data() * 1e6, want[:, : out.n_times], atol=1e-6)


def test_profile_subject_through_lab64_equals_the_plain_loader(data_dir):
    plain = load_eegmmidb_subject(1, CFG, data_dir)
    lab = load_profile_subject(1, "lab64", CFG, data_dir)
    assert lab.ch_names == plain.ch_names and lab.X.shape == plain.X.shape and np.array_equal(lab.y, plain.y)
    assert np.abs(lab.X - plain.X).max() < 1e-4


def test_profile_subjects_differ_by_device_but_share_labels(data_dir):
    subs = {n: load_profile_subject(2, n, CFG, data_dir) for n in ("research21", "cyton_daisy16", "unicorn8")}
    for n, sd in subs.items():
        prof = get_profile(n)
        assert sd.subject == "S002" and sd.ch_names == list(prof.channels)
        assert sd.X.shape == (45, prof.n_channels, 320) and sd.sfreq == 80.0
        cov = np.einsum("nct,ndt->cd", sd.X.astype(np.float64), sd.X) / (sd.X.shape[0] * sd.X.shape[2])
        assert np.allclose(cov, np.eye(prof.n_channels), atol=1e-3)  # EA per subject on the device's channels
    assert all(np.array_equal(subs["unicorn8"].y, sd.y) for sd in subs.values())
    again = load_profile_subject(2, "unicorn8", CFG, data_dir, use_cache=False)
    assert np.allclose(again.X, subs["unicorn8"].X, atol=1e-5)  # seeded noise: reproducible
    other = load_profile_subject(2, "unicorn8", CFG, data_dir, noise_seed=1, use_cache=False)
    assert not np.allclose(other.X, subs["unicorn8"].X, atol=1e-3)


def test_intersection_channels_and_foreign_channels(data_dir):
    cfg = PreprocessConfig(resample=80.0, channels=("C3", "C4"))
    sd = load_profile_subject(3, "cyton_daisy16", cfg, data_dir)
    assert sd.ch_names == ["C3", "C4"] and sd.X.shape[1] == 2
    with pytest.raises(ProfileError, match="Cz"):
        load_profile_subject(3, "cyton_daisy16", PreprocessConfig(resample=80.0, channels=("C3", "Cz")), data_dir)


def test_assignment_seeded_balanced_and_explicit():
    a = assign_profiles(range(1, 11), ["x", "y", "z"], seed=0)
    assert a == assign_profiles(range(1, 11), ["x", "y", "z"], seed=0)
    assert a != assign_profiles(range(1, 11), ["x", "y", "z"], seed=1)
    counts = sorted(list(a.values()).count(n) for n in "xyz")
    assert counts == [3, 3, 4]
    e = parse_assignment("unicorn8:1-3;research21:4,5", [1, 2, 3, 4, 5])
    assert e == {1: "unicorn8", 2: "unicorn8", 3: "unicorn8", 4: "research21", 5: "research21"}
    with pytest.raises(ProfileError, match=r"\[5\]"):
        parse_assignment("unicorn8:1-4", [1, 2, 3, 4, 5])
    with pytest.raises(ProfileError, match="nosuch"):
        parse_assignment("nosuch,unicorn8", [1, 2])


def test_match_profile_by_channels_and_rate():
    u = get_profile("unicorn8")
    assert match_profile(list(u.channels), 250.0).name == "unicorn8"
    with pytest.raises(ProfileError, match="matches no device profile"):
        match_profile(list(u.channels), 500.0)


def test_simulate_profile_options_refuse_bad_combinations(tmp_path, data_dir):
    from typer.testing import CliRunner

    from neurofed.cli import app

    base = ["simulate", "--subjects", "1-4", "--data-dir", str(data_dir), "--out", str(tmp_path / "x")]
    cases = [
        (["--profiles", "unicorn8,research21", "--channels", "sensorimotor21"], "--channels does not combine"),
        (["--profiles", "unicorn8,nosuch"], "unknown device profile 'nosuch'"),
        (["--only-profile", "unicorn8"], "--only-profile needs --profiles"),
        (["--profiles", "unicorn8,research21", "--only-profile", "cyton8"], "no subject has profile"),
        (["--profiles", "unicorn8", "--profile-channels", "union"], "own, intersection or interpolate"),
    ]
    for extra, msg in cases:
        res = CliRunner().invoke(app, base + extra)
        assert res.exit_code == 2, (extra, res.output)
        out = (res.output + str(res.exception or "")).replace("\n", " ")
        assert msg.split("'")[0].strip() in out.replace("│", " ").replace("  ", " ") or msg in out, (extra, out)


# ---------------------------------------------------------------------------- channel interpolation
def test_interpolation_matrix_hand_checkable_case():
    from neurofed.trainer.data.profiles import interpolation_matrix

    w = interpolation_matrix(["C3", "c4"], ["C3", "Cz", "C4"])
    assert w.shape == (3, 2)
    assert np.array_equal(w[0], [1.0, 0.0]) and np.array_equal(w[2], [0.0, 1.0])  # present: exact copies
    # Cz lies (almost) midway between C3 and C4 on the template head (its left/right asymmetry is a few mm)
    assert np.allclose(w[1], [0.5, 0.5], atol=0.01)


def test_interpolation_matrix_rows_sum_to_one():
    """The spline's free constant term with sum(c) = 0 reproduces a constant potential exactly: every row
    sums to 1 (weights can be negative)."""
    from neurofed.trainer.data.config import SENSORIMOTOR_21
    from neurofed.trainer.data.profiles import interpolation_matrix

    for name in ("unicorn8", "cyton_daisy16", "cyton8", "lab64"):
        w = interpolation_matrix(get_profile(name).channels, SENSORIMOTOR_21)
        assert w.shape == (21, get_profile(name).n_channels)
        assert np.allclose(w.sum(axis=1), 1.0, atol=1e-9)
    w = interpolation_matrix(get_profile("unicorn8").channels, SENSORIMOTOR_21)
    assert (w < 0).any()  # not a convex combination
    lab = interpolation_matrix(get_profile("lab64").channels, SENSORIMOTOR_21)  # lab64 has all 21: selection
    assert np.array_equal(lab, np.eye(64)[:21])
    assert np.array_equal(interpolation_matrix(SENSORIMOTOR_21, SENSORIMOTOR_21), np.eye(21))


def test_interpolation_matrix_matches_mnes_spline():
    """Cross-check against MNE's own (private) implementation, when this MNE still has it."""
    from mne.channels import interpolation as mi

    from neurofed.trainer.data.profiles import _template_geometry, interpolation_matrix

    if not hasattr(mi, "_make_interpolation_matrix"):
        pytest.skip("this MNE has no mne.channels.interpolation._make_interpolation_matrix")
    src, dst = list(get_profile("unicorn8").channels), ["C1", "C2", "CP5", "FC6"]
    pos, origin = _template_geometry()
    ref = mi._make_interpolation_matrix(np.stack([pos[c] for c in src]) - origin,
                                        np.stack([pos[c] for c in dst]) - origin)
    assert np.allclose(interpolation_matrix(src, dst), ref, atol=1e-8)


def test_interpolation_matrix_errors():
    from neurofed.trainer.data.profiles import interpolation_matrix

    with pytest.raises(ProfileError, match=r"\['XX9'\] have no position"):
        interpolation_matrix(["C3", "XX9"], ["Cz"])
    with pytest.raises(ProfileError, match=r"\['Q1'\] have no position"):
        interpolation_matrix(["C3", "C4"], ["Q1"])
    with pytest.raises(ProfileError, match="duplicate source channels"):
        interpolation_matrix(["C3", "c3"], ["Cz"])
    with pytest.raises(ProfileError, match="at least one"):
        interpolation_matrix([], ["Cz"])
