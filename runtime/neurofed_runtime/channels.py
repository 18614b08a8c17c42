"""Which stream channels feed a model, and the factor from each channel's unit: one rule for every consumer.

:func:`match_stream` decides whether an EEG stream (its nominal rate, channel labels and units) can feed a
consumer and returns a :class:`StreamLayout` (the columns to take, in the consumer's order, and the factor to
microvolts of each). ``edge-client record``/``infer`` (through ``neurofed.edge.stream``) and the runtime's
:class:`~neurofed_runtime.decode.Decoder` use it, so a stream one accepts, the others accept.

The channel description comes from an LSL stream's ``desc/channels`` (:func:`lsl_channels`, the XDF meta-data
convention: ``label``, ``unit``, ``type``; duck-typed, no pylsl import) or from an ``mne.Info``
(:func:`mne_channels`; MNE keeps data in volts). Units follow :mod:`neurofed_runtime.units`; a channel in
``counts`` (raw amplifier counts) needs the gain of the device it comes from (``counts_uv``: microvolts per count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from neurofed_runtime.errors import DataError
from neurofed_runtime.units import norm_label, unit_scale

#: Name of a sample-counter channel (mne-lsl's tests, firmware_sim); never EEG.
COUNTER_CHANNEL = "Samples"
COUNTER_LABEL = COUNTER_CHANNEL.lower()
#: LSL unit of raw amplifier counts (firmware_sim's spelling of a ``counts`` device profile)
COUNTS_UNIT = "counts"
#: MNE keeps EEG in volts.
MNE_UNIT = "volts"


def is_counts(unit: str) -> bool:
    """True for a channel in raw amplifier counts."""
    return unit.strip().lower() == COUNTS_UNIT


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
                 counts_uv: float | None = None) -> StreamLayout:
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
    counts_uv : float, optional
        Microvolts per count of the device whose raw ``counts`` channels the stream carries (its device profile's
        gain); without it a ``counts`` channel is refused.

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
    if counts and counts_uv is None:
        raise DataError(f"{source}: channels {[ch_names[i] for i in counts][:5]} are in raw counts, but no device "
                        "profile in counts gives their gain")
    scales = [float(counts_uv) if i in counts else unit_scale(units[i]) for i in idx]  # type: ignore[arg-type]
    bad = [(ch_names[i], units[i]) for i, f in zip(idx, scales) if f is None]
    if bad:
        raise DataError(f"{source}: channel units must be microvolts (or volts/millivolts/nanovolts, mne-lsl's "
                        f"power of ten of volts, or counts of a device profile); got {bad[:5]}"
                        f"{' ...' if len(bad) > 5 else ''}")
    return StreamLayout(idx, keep, np.array(scales, dtype=np.float64))


@dataclass(frozen=True)
class StreamChannels:
    """What a stream says about its channels: name, nominal rate, labels, units and types."""

    name: str
    sfreq: float
    ch_names: list[str]
    units: list[str]
    types: list[str]


def lsl_channels(info: Any) -> StreamChannels:
    """The channel description of an LSL stream (a ``pylsl.StreamInfo`` with its full description, e.g. an
    inlet's ``info()``): ``desc/channels/channel/{label,unit,type}``; without one, ``ch1..chN`` in microvolts."""
    names, units, types = [], [], []
    ch = info.desc().child("channels").child("channel")
    while not ch.empty():
        names.append(ch.child_value("label"))
        units.append(ch.child_value("unit"))
        types.append(ch.child_value("type"))
        ch = ch.next_sibling("channel")
    n = info.channel_count()
    if len(names) != n:  # no (or partial) channel description
        names, units, types = [f"ch{i + 1}" for i in range(n)], [""] * n, [info.type()] * n
    return StreamChannels(info.name(), float(info.nominal_srate()), names, units, types)


def mne_channels(info: Any) -> StreamChannels:
    """The channel description of an ``mne.Info`` (its EEG data are in volts)."""
    names = list(info["ch_names"])
    return StreamChannels("mne", float(info["sfreq"]), names, [MNE_UNIT] * len(names), ["EEG"] * len(names))


__all__ = ["COUNTER_CHANNEL", "COUNTS_UNIT", "StreamChannels", "StreamLayout", "is_counts", "lsl_channels",
           "match_stream", "mne_channels"]
