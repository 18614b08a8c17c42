"""Stream layout: unit and channel-label normalisation shared by recording and decoding (no pylsl here).

One place decides whether an incoming EEG stream can feed a consumer (``edge-client record`` or
``edge-client infer``): its nominal rate, which stream channels carry the wanted labels, and the factor
from each channel's declared unit to microvolts. A stream one command accepts, the other accepts too.

Units and labels follow :mod:`neurofed.trainer.data.units` (the one table: ``microvolts``, ``uV``, ``volts``, mne-lsl's
``"0"``...; ``Fc5.`` ~ ``FC5``). A channel in ``counts`` (raw amplifier counts, e.g. an OpenBCI Cyton's ADS1299)
has no physical unit of its own: it is read with the gain of a device profile whose unit is ``counts``
(:func:`neurofed.trainer.data.profiles.to_microvolts`): the model's profile when decoding, the profile the stream matches
(:func:`stream_profile`) when recording.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from neurofed.trainer.data.profiles import DeviceProfile, ProfileError, match_profile, to_microvolts
from neurofed.trainer.data.units import norm_label, unit_scale
from neurofed.trainer.errors import DataError

#: Name of a sample-counter channel (mne-lsl's tests, firmware_sim); never EEG.
COUNTER_CHANNEL = "Samples"
COUNTER_LABEL = COUNTER_CHANNEL.lower()
#: LSL unit of raw amplifier counts (firmware_sim's spelling of a ``counts`` device profile)
COUNTS_UNIT = "counts"


def is_counts(unit: str) -> bool:
    """True for a channel in raw amplifier counts."""
    return unit.strip().lower() == COUNTS_UNIT


def stream_profile(sfreq: float, ch_names: Sequence[str], units: Sequence[str] | None,
                   profiles: Sequence[DeviceProfile] | None = None, source: str = "stream") -> DeviceProfile | None:
    """The device profile whose gain reads a stream's ``counts`` channels; None when it has none.

    The stream's channels (without the ``Samples`` counter) and rate must match one profile
    (:func:`neurofed.trainer.data.profiles.match_profile`; default: the shipped ones) whose unit is ``counts``.

    Raises
    ------
    ProfileError
        The stream sends counts but matches no profile, or one whose unit is not counts (one line).
    """
    if not any(is_counts(u) for u in units or []):
        return None
    eeg = [c for c in ch_names if norm_label(c) != COUNTER_LABEL]
    try:
        prof = match_profile(eeg, sfreq, profiles)
    except ProfileError as exc:
        raise ProfileError(f"{source}: raw counts need the gain of a device profile, but the {exc}") from None
    if prof.unit != COUNTS_UNIT:
        raise ProfileError(f"{source}: raw counts need the gain of a device profile in counts, but the "
                           f"stream matches {prof.name}, whose unit is {prof.unit}")
    return prof


@dataclass(frozen=True)
class StreamLayout:
    """Where the wanted channels sit in a stream and how to turn them into microvolts.

    Attributes
    ----------
    idx : list of int
        Stream column of each wanted channel, in the wanted order.
    names : list of str
        The wanted labels (the consumer's spelling).
    scale : ndarray, float64
        Per wanted channel, the factor to microvolts.
    """

    idx: list[int]
    names: list[str]
    scale: np.ndarray

    @property
    def unit_ok(self) -> bool:
        """True when every kept channel is already in microvolts."""
        return bool(np.all(self.scale == 1.0))

    @cached_property
    def _pick(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(column indices or None when all stream columns are kept in order, scale column or None if uV)``:
        computed once, :meth:`select` runs for every decoded window."""
        idx = np.asarray(self.idx, dtype=np.intp)
        return (None if np.array_equal(idx, np.arange(len(idx))) else idx,
                None if self.unit_ok else np.asarray(self.scale, np.float64)[:, None])

    def select(self, samples: np.ndarray) -> np.ndarray:
        """Stream-layout samples ``(n, stream_channels)`` -> wanted channels in microvolts ``(channels, n)``.

        Returns float64 (a copy).
        """
        a = np.asarray(samples)
        idx, scale = self._pick
        if idx is None:  # the first columns, in order: a slice, no gather
            x = a[:, : len(self.idx)].T.astype(np.float64)
        else:
            x = np.take(a, idx, axis=1).T.astype(np.float64, copy=False)
        return x if scale is None else x * scale


def match_stream(sfreq: float, ch_names: Sequence[str], units: Sequence[str] | None = None,
                 wanted: Sequence[str] | None = None, also_needed: Sequence[str] = (), fmax: float | None = None,
                 expected_sfreq: float | None = None, source: str = "stream",
                 profile: DeviceProfile | None = None) -> StreamLayout:
    """Validate a stream's rate, channels and units for a consumer.

    Parameters
    ----------
    sfreq : float
        The stream's nominal rate (0 = irregular).
    ch_names, units : sequence of str
        The stream's channel labels and units (units default to microvolts).
    wanted : sequence of str, optional
        Channels to keep, in this order (default: every stream channel except the counter).
    also_needed : sequence of str
        Channels that must be present too (e.g. those preprocessing picks later).
    fmax : float, optional
        Upper band-pass edge the consumer will apply; the rate must exceed twice it.
    expected_sfreq : float, optional
        Refuse another nominal rate.
    source : str
        Stream name for the error messages.
    profile : DeviceProfile, optional
        The device profile (unit ``counts``) whose gain reads ``counts`` channels.

    Raises
    ------
    DataError
        Irregular, unexpected or too low rate; missing channels (all listed); unknown units.
    """
    ch_names = list(ch_names)
    units = [""] * len(ch_names) if units is None else list(units)
    if not sfreq or sfreq <= 0:
        raise DataError(f"{source}: irregular sampling rate; an EEG stream needs a nominal rate")
    if expected_sfreq is not None and not math.isclose(sfreq, expected_sfreq, rel_tol=1e-6):
        raise DataError(f"{source}: sampling rate is {sfreq:g} Hz but {expected_sfreq:g} Hz was expected")
    if fmax is not None and fmax >= sfreq / 2:
        raise DataError(f"{source}: {sfreq:g} Hz is too low for a {fmax:g} Hz band-pass")
    index: dict[str, int] = {}
    for i, c in enumerate(ch_names):
        index.setdefault(norm_label(c), i)
    keep = list(wanted) if wanted is not None else [c for c in ch_names if norm_label(c) != COUNTER_LABEL]
    have = {norm_label(w) for w in keep}
    need = keep + [c for c in also_needed if norm_label(c) not in have]
    missing = [c for c in need if norm_label(c) not in index]
    if missing:
        raise DataError(f"{source}: missing channels {missing} (stream has {ch_names})")
    idx = [index[norm_label(c)] for c in keep]
    counts = [i for i in idx if is_counts(units[i])]
    if counts and (profile is None or profile.unit != COUNTS_UNIT):
        raise DataError(f"{source}: channels {[ch_names[i] for i in counts][:5]} are in raw counts, but no device "
                        "profile in counts gives their gain")
    per_count = float(to_microvolts(1.0, profile)) if counts else 1.0  # microvolts per count
    scales = [per_count if i in counts else unit_scale(units[i]) for i in idx]
    bad = [(ch_names[i], units[i]) for i, f in zip(idx, scales) if f is None]
    if bad:
        raise DataError(f"{source}: channel units must be microvolts (or volts/millivolts/nanovolts, mne-lsl's "
                        f"power of ten of volts, or counts of a device profile); got {bad[:5]}"
                        f"{' ...' if len(bad) > 5 else ''}")
    return StreamLayout(idx, keep, np.array(scales, dtype=np.float64))
