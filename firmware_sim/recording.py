"""Load recordings to replay: continuous EEG in microvolts (float32) plus cue markers at sample indices.

This module never touches LSL (see :mod:`neurofed.firmware_sim.lsl_out` for the pusher). Reading recordings is
trainer's (:mod:`neurofed.trainer.data.io`: ``read_raw`` with its size and annotation checks, ``cue_samples`` placing
cues on samples exactly as offline epoching does); firmware_sim imports only ``neurofed.trainer.data`` and
``neurofed.trainer.errors`` (the import contract in pyproject.toml).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from neurofed.trainer.data.eegmmidb import LR_IMAGERY_RUNS, RUN_EVENT_LABELS, subject_files
from neurofed.trainer.data.io import cue_samples, read_raw
from neurofed.trainer.data.profiles import get_profile, to_device
from neurofed.trainer.errors import DataError

#: Name of the optional counter channel (sample index), as in mne-lsl's tests.
COUNTER_CHANNEL = "Samples"
REST_LABEL = "rest"


@dataclass
class Recording:
    """Continuous EEG ready to stream.

    Attributes
    ----------
    data : ndarray, float32, shape (n_samples, n_channels)
        Microvolts, sample-major (the layout LSL pushes).
    sfreq : float
    ch_names : list of str
    markers : list of (int, str)
        (sample index of the cue, class name), sorted by sample.
    source : str
        Where it came from (shown in logs and in the stream description).
    """

    data: np.ndarray
    sfreq: float
    ch_names: list[str]
    markers: list[tuple[int, str]] = field(default_factory=list)
    source: str = ""

    def __post_init__(self) -> None:
        if self.data.ndim != 2 or self.data.shape[1] != len(self.ch_names):
            raise DataError(
                f"{self.source}: data shape {self.data.shape} does not match {len(self.ch_names)} channel names"
            )
        if self.sfreq <= 0:
            raise DataError(f"{self.source}: sampling rate must be positive, got {self.sfreq}")

    @property
    def n_samples(self) -> int:
        return int(self.data.shape[0])

    @property
    def n_channels(self) -> int:
        return int(self.data.shape[1])

    def with_counter(self) -> Recording:
        """Copy with a first channel ``Samples`` holding the sample index (float32 is exact to 2**24)."""
        if COUNTER_CHANNEL in self.ch_names:
            return self
        idx = np.arange(self.n_samples, dtype=np.float32)[:, None]
        return Recording(np.hstack([idx, self.data]), self.sfreq, [COUNTER_CHANNEL, *self.ch_names],
                         list(self.markers), self.source)


def load_recording(
    path: str | os.PathLike,
    label_map: Mapping[str, str] | None = None,
    include_rest: bool = False,
) -> Recording:
    """Read any MNE-readable file (``neurofed.trainer.data.io.read_raw``) into a :class:`Recording`.

    Parameters
    ----------
    path : path
    label_map : mapping, optional
        Annotation description -> marker string (default: every annotation keeps its description).
    include_rest : bool
        With EEGMMIDB-style maps, also emit ``T0`` as ``"rest"``.
    """
    raw = read_raw(path)
    if label_map is None:
        label_map = {d: d for d in sorted(set(map(str, raw.annotations.description)))}
    label_map = dict(label_map)
    if include_rest:
        label_map.setdefault("T0", REST_LABEL)
    data = (raw.get_data() * 1e6).T.astype(np.float32)  # volts -> microvolts, sample-major
    if not np.all(np.isfinite(data)):
        raise DataError(f"{path}: recording contains NaN or infinite samples")
    return Recording(np.ascontiguousarray(data), float(raw.info["sfreq"]), list(raw.ch_names),
                     cue_samples(raw, label_map), str(path))


def concatenate(recs: Sequence[Recording], source: str = "") -> Recording:
    """Join recordings back to back (same rate and channels); markers are shifted accordingly."""
    if not recs:
        raise DataError("nothing to concatenate")
    first = recs[0]
    markers: list[tuple[int, str]] = []
    offset = 0
    for r in recs:
        if r.sfreq != first.sfreq:
            raise DataError(f"{r.source}: sampling rate {r.sfreq} Hz differs from {first.source} ({first.sfreq} Hz)")
        if r.ch_names != first.ch_names:
            raise DataError(f"{r.source}: channels differ from {first.source}")
        markers += [(s + offset, lab) for s, lab in r.markers]
        offset += r.n_samples
    data = np.concatenate([r.data for r in recs])
    return Recording(data, first.sfreq, list(first.ch_names), markers, source or "+".join(r.source for r in recs))


def load_eegmmidb(
    subject: int,
    data_dir: str | os.PathLike | None = None,
    runs: Iterable[int] = LR_IMAGERY_RUNS,
    include_rest: bool = False,
) -> Recording:
    """One EEGMMIDB subject's runs concatenated, markers named per run (T1/T2 differ between runs)."""
    runs = list(runs)
    unknown = [r for r in runs if r not in RUN_EVENT_LABELS]
    if unknown:
        raise DataError(f"runs {unknown} have no task labels; choose among {sorted(RUN_EVENT_LABELS)}")
    paths = subject_files(data_dir, subject, runs)
    recs = [load_recording(p, RUN_EVENT_LABELS[r], include_rest) for p, r in zip(paths, runs)]
    return concatenate(recs, source=f"S{subject:03d} runs {','.join(map(str, runs))}")


#: LSL ``unit`` strings of the device profiles' units
LSL_UNITS: dict[str, str] = {"uV": "microvolts", "mV": "millivolts", "V": "volts", "nV": "nanovolts", "counts": "counts"}


def through_profile(rec: Recording, profile, seed: int = 0) -> Recording:
    """What the headset of a device profile would stream for this recording (issue 19).

    The profile's channels (in its order), its rate (``scipy.signal.resample_poly``), its seeded
    additive noise and its unit and gain (:func:`neurofed.trainer.data.profiles.to_device`, the code the
    trainer's profile loader uses); cue markers keep their times (sample index x new rate / old rate).

    Parameters
    ----------
    rec : Recording
    profile : neurofed.trainer.data.profiles.DeviceProfile or str
        A profile or the name of a shipped one.
    seed : int
        Seed of the additive noise.
    """

    prof = get_profile(profile)
    rng = np.random.default_rng([seed, 19])
    data = to_device(rec.data.T.astype(np.float64), rec.sfreq, rec.ch_names, prof, rng)
    ratio = prof.sfreq / rec.sfreq
    n = data.shape[1]
    markers = [(min(round(s * ratio), n - 1), lab) for s, lab in rec.markers]
    return Recording(np.ascontiguousarray(data.T.astype(np.float32)), prof.sfreq, list(prof.channels), markers,
                     f"{rec.source} via profile {prof.name}")
