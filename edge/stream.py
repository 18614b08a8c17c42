"""Stream layout: unit and channel-label normalisation shared by recording and decoding (no pylsl here).

The rule itself (:class:`StreamLayout`, the channel and unit checks) is the runtime's
(``neurofed_runtime.channels``); this module adds the device profiles that give raw counts their gain.

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

from collections.abc import Sequence

from neurofed_runtime.channels import COUNTER_CHANNEL, COUNTER_LABEL, COUNTS_UNIT, StreamLayout, is_counts
from neurofed_runtime.channels import match_stream as _match_stream

from neurofed.trainer.data.profiles import DeviceProfile, ProfileError, match_profile, to_microvolts
from neurofed.trainer.data.units import norm_label

__all__ = ["COUNTER_CHANNEL", "COUNTS_UNIT", "StreamLayout", "is_counts", "match_stream", "stream_profile"]


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


def match_stream(sfreq: float, ch_names: Sequence[str], units: Sequence[str] | None = None,
                 wanted: Sequence[str] | None = None, also_needed: Sequence[str] = (), fmax: float | None = None,
                 expected_sfreq: float | None = None, source: str = "stream",
                 profile: DeviceProfile | None = None) -> StreamLayout:
    """Validate a stream's rate, channels and units for a consumer: :func:`neurofed_runtime.channels.match_stream`
    (the one rule), with ``counts`` channels read at the gain of ``profile`` (a device profile in counts).

    Raises
    ------
    DataError
        Irregular, unexpected or too low rate; missing channels (all listed); unknown units.
    """
    counts_uv = (float(to_microvolts(1.0, profile)) if profile is not None and profile.unit == COUNTS_UNIT
                 else None)
    return _match_stream(sfreq, ch_names, units, wanted, also_needed, fmax, expected_sfreq, source, counts_uv)
