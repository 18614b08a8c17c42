"""Device profiles: what a headset delivers (channels, rate, unit and gain, noise), and presenting a
real recording through one, so the SAME real subjects can be spread over device groups (issue 19).

A :class:`DeviceProfile` is validated at the boundary (unknown 10-05 channel names, a rate or unit
out of range: one :class:`ProfileError` line naming the problem). The shipped profiles live in
``trainer/data/profiles/*.json`` (``lab64``, ``research21``, ``cyton_daisy16``, ``unicorn8``,
``cyton8``; their ``description`` says which real montage each copies).

Presenting a recording (:func:`to_device`) works on the continuous signal, as a headset would
stream it: channel selection, polyphase resampling to the device's rate
(:func:`neurofed.trainer.data.preprocess.resample`, ``scipy.signal.resample_poly``), optional seeded white
noise of ``noise_uv`` RMS, then the device's unit and gain. The client side undoes unit and gain
with the profile's nominal values (:func:`to_microvolts`) and runs the normal pipeline (epochs,
band-pass, resampling to the model's rate, per-subject EA): :func:`load_profile_subject`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from neurofed.trainer.data import cache
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.dataset import SubjectData, load_raws
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS, TASKS, parse_subjects, subject_files
from neurofed.trainer.data.io import read_raw, sha256_file
from neurofed.trainer.data.preprocess import resample
from neurofed.trainer.errors import DataError

logger = logging.getLogger("neurofed.trainer")

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
#: device units per microvolt, before the profile's gain
UNIT_PER_UV: dict[str, float] = {"V": 1e-6, "mV": 1e-3, "uV": 1.0, "nV": 1e3, "counts": 1.0}


class ProfileError(DataError):
    """A device profile, or a stream/recording that matches no profile."""


@lru_cache(maxsize=1)
def known_channels() -> dict[str, str]:
    """Lower-case name -> canonical name of every position of MNE's 10-05 template (343 labels)."""
    return {n.lower(): n for n in _template_montage().ch_names}


@dataclass(frozen=True)
class DeviceProfile:
    """A headset: what it streams.

    Parameters
    ----------
    name : str
        Identifier (letters, digits, ``_``, ``-``).
    channels : tuple of str
        10-05 labels in stream order (canonicalised: ``fc5`` -> ``FC5``).
    sfreq : float
        Sampling rate in Hz.
    unit : {"V", "mV", "uV", "nV", "counts"}
        Unit of the streamed samples.
    gain : float
        Device units per unit of ``unit`` and microvolt: ``value = uV * UNIT_PER_UV[unit] * gain``
        (1 for calibrated physical units; counts per microvolt for ``counts``).
    noise_uv : float
        RMS of the white noise added when a recording is presented through the profile (a
        simulation parameter, 0 = none).
    description : str
        Which real device/montage it copies.
    """

    name: str
    channels: tuple[str, ...]
    sfreq: float
    unit: str = "uV"
    gain: float = 1.0
    noise_uv: float = 0.0
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "_-" for c in self.name):
            raise ProfileError(f"profile name {self.name!r} must be letters, digits, '_' or '-'")
        chans = tuple(self.channels)
        if not chans:
            raise ProfileError(f"profile {self.name}: no channels")
        known = known_channels()
        unknown = [c for c in chans if str(c).lower() not in known]
        if unknown:
            raise ProfileError(f"profile {self.name}: unknown channel names {unknown} (not 10-05 positions)")
        canon = tuple(known[str(c).lower()] for c in chans)
        dup = sorted({c for c in canon if canon.count(c) > 1})
        if dup:
            raise ProfileError(f"profile {self.name}: duplicate channels {dup}")
        object.__setattr__(self, "channels", canon)
        if not 32 <= float(self.sfreq) <= 20000:
            raise ProfileError(f"profile {self.name}: sampling rate {self.sfreq} Hz out of range [32, 20000]")
        object.__setattr__(self, "sfreq", float(self.sfreq))
        if self.unit not in UNIT_PER_UV:
            raise ProfileError(f"profile {self.name}: unit {self.unit!r} not one of {sorted(UNIT_PER_UV)}")
        if not float(self.gain) > 0:
            raise ProfileError(f"profile {self.name}: gain must be > 0, got {self.gain}")
        if not float(self.noise_uv) >= 0:
            raise ProfileError(f"profile {self.name}: noise_uv must be >= 0, got {self.noise_uv}")

    @property
    def n_channels(self) -> int:
        return len(self.channels)

    @property
    def scale(self) -> float:
        """Device units per microvolt."""
        return UNIT_PER_UV[self.unit] * float(self.gain)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["channels"] = list(self.channels)
        return d

    @classmethod
    def from_dict(cls, d: Mapping, source: str = "") -> DeviceProfile:
        """Build from a parsed JSON object; unknown or missing fields raise one :class:`ProfileError` line."""
        fields = set(cls.__dataclass_fields__)
        where = f"{source}: " if source else ""
        if not isinstance(d, Mapping):
            raise ProfileError(f"{where}a profile must be a JSON object")
        extra = sorted(set(d) - fields)
        if extra:
            raise ProfileError(f"{where}unknown profile fields {extra}; allowed: {sorted(fields)}")
        missing = sorted({"name", "channels", "sfreq"} - set(d))
        if missing:
            raise ProfileError(f"{where}profile lacks {missing}")
        if not isinstance(d["channels"], list | tuple) or not all(isinstance(c, str) for c in d["channels"]):
            raise ProfileError(f"{where}channels must be a list of names")
        try:
            return cls(**{**d, "channels": tuple(d["channels"])})
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ProfileError):
                raise ProfileError(f"{where}{exc}") from None
            raise ProfileError(f"{where}invalid profile ({exc})") from None


def load_profile(path: str | os.PathLike) -> DeviceProfile:
    """Read one profile file (JSON)."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except OSError as exc:
        raise ProfileError(f"{p}: cannot read profile ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{p}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    return DeviceProfile.from_dict(d, str(p))


@lru_cache(maxsize=1)
def shipped_profiles() -> dict[str, DeviceProfile]:
    """The profiles shipped in ``trainer/data/profiles/``, by name."""
    out = {}
    for f in sorted(PROFILE_DIR.glob("*.json")):
        prof = load_profile(f)
        out[prof.name] = prof
    return out


def get_profile(name_or_path: str | DeviceProfile) -> DeviceProfile:
    """A shipped profile by name, or a profile file by path."""
    if isinstance(name_or_path, DeviceProfile):
        return name_or_path
    shipped = shipped_profiles()
    if name_or_path in shipped:
        return shipped[name_or_path]
    if str(name_or_path).endswith(".json") or os.sep in str(name_or_path):
        return load_profile(name_or_path)
    raise ProfileError(f"unknown device profile {name_or_path!r}; shipped: {', '.join(shipped)} (or a .json path)")


def channel_intersection(profiles: Sequence[DeviceProfile]) -> tuple[str, ...]:
    """Channels every profile has, in the first profile's order."""
    common = set.intersection(*(set(p.channels) for p in profiles))
    return tuple(c for c in profiles[0].channels if c in common)


# ---------------------------------------------------------------------------- channel interpolation
#: spherical-spline parameters (Perrin et al. 1989; the values MNE's ``interpolate_bads`` uses)
SPLINE_STIFFNESS = 4
SPLINE_LEGENDRE_TERMS = 50
SPLINE_ALPHA = 1e-5


@lru_cache(maxsize=1)
def _template_montage():
    """MNE's 10-05 template (``standard_1005``; renamed ``colin27_1005`` in MNE 1.13, same positions)."""
    import warnings

    import mne

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return mne.channels.make_standard_montage("standard_1005")
        except ValueError:  # MNE >= 1.14: the deprecated name is gone
            return mne.channels.make_standard_montage("colin27_1005")


@lru_cache(maxsize=1)
def _template_geometry() -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Positions (metres, head frame) of every template label, and the centre of the sphere fitted to them.

    The sphere is fitted once to all 343 template positions (``mne.bem.fit_sphere_to_headshape``, public
    API), so a channel's position relative to the centre does not depend on which other channels a device has.
    """
    import mne

    mont = _template_montage()
    info = mne.create_info(mont.ch_names, 100.0, "eeg")
    info.set_montage(mont)
    _, origin, _ = mne.bem.fit_sphere_to_headshape(info, dig_kinds="eeg", units="m", verbose="error")
    pos = {k: np.asarray(v, dtype=np.float64) for k, v in mont.get_positions()["ch_pos"].items()}
    return pos, np.asarray(origin, dtype=np.float64)


def channel_positions(channels: Sequence[str]) -> np.ndarray:
    """Unit vectors from the template's fitted head centre to each channel, shape (n, 3).

    Raises
    ------
    ProfileError
        A name with no 10-05 template position (case-insensitive match).
    """
    known = known_channels()
    unknown = [c for c in channels if str(c).lower() not in known]
    if unknown:
        raise ProfileError(f"channels {unknown} have no position in MNE's 10-05 template (standard_1005)")
    pos, origin = _template_geometry()
    p = np.stack([pos[known[str(c).lower()]] - origin for c in channels])
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def _spline_g(cosang: np.ndarray) -> np.ndarray:
    """Perrin's g(x) = 1/(4 pi) sum_n (2n+1)/(n(n+1))^m P_n(x), n = 1..N, m = stiffness."""
    from numpy.polynomial.legendre import legval

    n = np.arange(1, SPLINE_LEGENDRE_TERMS + 1, dtype=np.float64)
    coef = (2 * n + 1) / (n ** SPLINE_STIFFNESS * (n + 1) ** SPLINE_STIFFNESS * 4 * np.pi)
    return legval(np.clip(cosang, -1.0, 1.0), np.concatenate([[0.0], coef]))


def interpolation_matrix(src_channels: Sequence[str], dst_channels: Sequence[str]) -> np.ndarray:
    """Spherical-spline interpolation from one montage to another: ``x_dst = W @ x_src``.

    Spherical splines (Perrin et al. 1989) between the electrode positions of MNE's 10-05 template
    (``standard_1005``), projected on the sphere fitted to the template: stiffness 4, 50 Legendre terms,
    ridge 1e-5 on the source Gram matrix (MNE's ``interpolate_bads`` values; the same formula as MNE's
    private ``_make_interpolation_matrix``, re-implemented here on public API; a test cross-checks them).

    Parameters
    ----------
    src_channels : sequence of str
        The channels a device records (10-05 labels, any case).
    dst_channels : sequence of str
        The montage to map onto.

    Returns
    -------
    ndarray, float64, shape (len(dst_channels), len(src_channels))
        A row of a channel present in both lists is the exact one-hot copy of it. Every row sums to 1
        (to float precision): the spline has a free constant term with the side condition
        ``sum(c) = 0``, so a constant potential is reproduced exactly (a common-mode offset passes through
        unchanged, and rows of interpolated channels are affine weights; some may be negative).

    Raises
    ------
    ProfileError
        A name with no template position, a duplicate source channel, or an empty list.
    """
    src, dst = list(src_channels), list(dst_channels)
    if not src or not dst:
        raise ProfileError("interpolation_matrix needs at least one source and one destination channel")
    known = known_channels()
    canon_src = [known.get(str(c).lower(), str(c)) for c in src]
    dup = sorted({c for c in canon_src if canon_src.count(c) > 1})
    if dup:
        raise ProfileError(f"duplicate source channels {dup}")
    p_src, p_dst = channel_positions(src), channel_positions(dst)
    n = len(src)
    g = _spline_g(p_src @ p_src.T)
    g[np.diag_indices(n)] += SPLINE_ALPHA
    c = np.zeros((n + 1, n + 1))
    c[:n, :n], c[:n, n], c[n, :n] = g, 1.0, 1.0
    c_inv = np.linalg.pinv(c)
    w = np.hstack([_spline_g(p_dst @ p_src.T), np.ones((len(dst), 1))]) @ c_inv[:, :n]
    index = {name: i for i, name in enumerate(canon_src)}
    for r, name in enumerate(dst):
        i = index.get(known[str(name).lower()])
        if i is not None:
            w[r] = 0.0
            w[r, i] = 1.0
    return w


# ---------------------------------------------------------------------------- presenting a recording
def to_device(
    x_uv: np.ndarray, sfreq: float, ch_names: Sequence[str], profile: DeviceProfile,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """What ``profile``'s headset would stream for this signal.

    Parameters
    ----------
    x_uv : ndarray, shape (n_channels, n_times) or (..., n_channels, n_times)
        Continuous signal in microvolts.
    sfreq : float
    ch_names : sequence of str
        Labels of ``x_uv``'s channels.
    profile : DeviceProfile
    rng : numpy Generator, optional
        Source of the additive noise (required when ``profile.noise_uv > 0``).

    Returns
    -------
    ndarray, float64, shape (..., profile.n_channels, n_times * profile.sfreq / sfreq)
        In the device's unit and gain.
    """
    index = {c.lower(): i for i, c in enumerate(ch_names)}
    missing = [c for c in profile.channels if c.lower() not in index]
    if missing:
        raise ProfileError(f"recording lacks channels {missing} of profile {profile.name}")
    x = np.asarray(x_uv, dtype=np.float64)[..., [index[c.lower()] for c in profile.channels], :]
    x = resample(x, sfreq, profile.sfreq)
    if profile.noise_uv > 0:
        if rng is None:
            raise ValueError(f"profile {profile.name} adds noise: pass a seeded rng")
        x = x + profile.noise_uv * rng.standard_normal(x.shape)
    return x * profile.scale


def to_microvolts(x_dev: np.ndarray, profile: DeviceProfile) -> np.ndarray:
    """Undo the device's unit and gain (the client side, with the profile's nominal values)."""
    return np.asarray(x_dev, dtype=np.float64) / profile.scale


def present_raw(raw, profile: DeviceProfile, rng: np.random.Generator | None = None):
    """A continuous recording (``mne.io.Raw``) as ``profile``'s device would record it, read back in volts.

    Annotations (cues) keep their times; the result is what a client of that device sees after
    :func:`to_microvolts`.
    """
    import mne

    dev = to_device(raw.get_data() * 1e6, float(raw.info["sfreq"]), raw.ch_names, profile, rng)
    info = mne.create_info(list(profile.channels), profile.sfreq, "eeg")
    out = mne.io.RawArray(to_microvolts(dev, profile) * 1e-6, info, verbose="error")
    a = raw.annotations
    out.set_annotations(mne.Annotations(a.onset - raw.first_time, a.duration, a.description))
    return out


def noise_rng(seed: int, subject: int, profile: DeviceProfile) -> np.random.Generator:
    """The seeded noise source of one (subject, profile)."""
    import zlib

    return np.random.default_rng([seed, subject, zlib.crc32(profile.name.encode())])


def load_profile_subject(
    subject: int, profile: DeviceProfile | str, cfg: PreprocessConfig | None = None,
    data_dir: str | os.PathLike | None = None, noise_seed: int = 0, task: str = "left_right",
    use_cache: bool = True,
) -> SubjectData:
    """One EEGMMIDB subject recorded "through" a device profile, then preprocessed as usual.

    ``cfg.channels`` (if set) must be a subset of the profile's channels (e.g. the channel
    intersection of several profiles); ``cfg.resample`` is the model's rate (all devices meet at it).
    The subject id is kept (``S001``); ``ch_names`` are the profile's channels.
    """
    prof = get_profile(profile)
    cfg = cfg or PreprocessConfig()
    if cfg.channels is not None:
        extra = [c for c in cfg.channels if c not in prof.channels]
        if extra:
            raise ProfileError(f"channels {extra} are not in profile {prof.name}")
    if task not in TASKS:
        raise DataError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    runs, classes = TASKS[task]
    paths = subject_files(data_dir, subject, runs)
    hashes = {p.name: sha256_file(p) for p in paths}
    key = cache.make_key(kind="eegmmidb-profile", subject=subject, task=task, cfg=cfg.to_dict(), files=hashes,
                         profile=prof.to_dict(), noise_seed=noise_seed)
    if use_cache and (hit := cache.load(key)) is not None:
        return SubjectData(f"S{subject:03d}", hit["X"], hit["y"], tuple(str(c) for c in hit["classes"]),
                           float(hit["sfreq"]), [str(c) for c in hit["ch_names"]], hashes)
    rng = noise_rng(noise_seed, subject, prof)
    raws = [(str(p), present_raw(read_raw(p), prof, rng)) for p in paths]
    sd = load_raws(raws, [RUN_EVENT_LABELS[r] for r in runs], cfg, f"S{subject:03d}", classes, hashes)
    if use_cache:
        cache.save(key, {"X": sd.X, "y": sd.y, "classes": np.array(sd.classes), "sfreq": np.array(sd.sfreq),
                         "ch_names": np.array(sd.ch_names)})
    return sd


# ---------------------------------------------------------------------------- assigning subjects
def assign_profiles(subjects: Iterable[int], profiles: Sequence[str], seed: int = 0) -> dict[int, str]:
    """Seeded, balanced split: a permutation of the subjects dealt round-robin over ``profiles``."""
    subs = sorted(subjects)
    if not profiles:
        raise ProfileError("no profiles to assign subjects to")
    perm = np.random.default_rng(seed).permutation(len(subs))
    return {subs[int(i)]: profiles[k % len(profiles)] for k, i in enumerate(perm)}


def parse_assignment(spec: str, subjects: Iterable[int], seed: int = 0) -> dict[int, str]:
    """``--profiles`` value -> subject -> profile name.

    ``"a,b,c"``: a seeded balanced split of ``subjects`` (see :func:`assign_profiles`);
    ``"a:1-10;b:11-20,25"``: explicit (every subject must be assigned exactly once).
    Every name is checked against the shipped profiles (or a readable .json path).
    """
    subs = sorted(subjects)
    if ":" not in spec:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        for n in names:
            get_profile(n)
        return assign_profiles(subs, names, seed)

    out: dict[int, str] = {}
    for part in spec.split(";"):
        name, _, rng = part.partition(":")
        get_profile(name.strip())
        for s in parse_subjects(rng, None):
            if s in out:
                raise ProfileError(f"subject {s} assigned twice in --profiles")
            out[s] = name.strip()
    missing = sorted(set(subs) - set(out))
    if missing:
        raise ProfileError(f"subjects {missing} have no profile in --profiles")
    return {s: out[s] for s in subs}


def match_profile(ch_names: Sequence[str], sfreq: float,
                  profiles: Iterable[DeviceProfile] | None = None) -> DeviceProfile:
    """The profile whose channels (same order) and rate match a stream's; a clear error otherwise."""
    cands = list(profiles) if profiles is not None else list(shipped_profiles().values())
    low = [c.lower() for c in ch_names]
    for p in cands:
        if [c.lower() for c in p.channels] == low and abs(p.sfreq - float(sfreq)) < 1e-6:
            return p
    raise ProfileError(f"stream with {len(low)} channels at {sfreq:g} Hz ({', '.join(ch_names[:8])}"
                       f"{', ...' if len(low) > 8 else ''}) matches no device profile "
                       f"({', '.join(p.name for p in cands)})")
