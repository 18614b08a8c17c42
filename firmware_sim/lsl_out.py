"""The only firmware_sim module touching liblsl: outlet construction with a full channel description."""

from __future__ import annotations

from collections.abc import Sequence

import pylsl

from neurofed.firmware_sim.recording import COUNTER_CHANNEL

EEG_UNIT = "microvolts"


def local_clock() -> float:
    """LSL's clock (seconds), the time base of every timestamp."""
    return pylsl.local_clock()


def eeg_outlet(
    name: str,
    source_id: str,
    ch_names: Sequence[str],
    sfreq: float,
    stype: str = "EEG",
    unit: str = EEG_UNIT,
    source: str = "",
    chunk_size: int = 0,
) -> pylsl.StreamOutlet:
    """A float32 EEG outlet whose ``desc/channels`` carry label, unit and type of every channel."""
    info = pylsl.StreamInfo(name, stype, len(ch_names), sfreq, pylsl.cf_float32, source_id)
    desc = info.desc()
    chans = desc.append_child("channels")
    for ch in ch_names:
        c = chans.append_child("channel")
        c.append_child_value("label", ch)
        if ch == COUNTER_CHANNEL:
            c.append_child_value("unit", "samples")
            c.append_child_value("type", "MISC")
        else:
            c.append_child_value("unit", unit)
            c.append_child_value("type", stype)
    acq = desc.append_child("acquisition")
    acq.append_child_value("manufacturer", "NeuroFed")
    acq.append_child_value("model", "firmware_sim")
    if source:
        desc.append_child_value("recording", source)
    return pylsl.StreamOutlet(info, chunk_size=chunk_size, max_buffered=360)


def marker_outlet(name: str, source_id: str, classes: Sequence[str] = ()) -> pylsl.StreamOutlet:
    """An irregular-rate string marker outlet (one cue label per sample), self-described for other tools:
    ``desc/channels`` (label ``cue``, type ``Markers``, unit ``none``), ``desc/classes/class`` (the labels it
    sends) and ``desc/meaning``."""
    info = pylsl.StreamInfo(name, "Markers", 1, pylsl.IRREGULAR_RATE, pylsl.cf_string, source_id)
    desc = info.desc()
    ch = desc.append_child("channels").append_child("channel")
    ch.append_child_value("label", "cue")
    ch.append_child_value("type", "Markers")
    ch.append_child_value("unit", "none")
    node = desc.append_child("classes")
    for c in classes:
        node.append_child_value("class", c)
    desc.append_child_value("meaning", "one cue per sample: the class name the subject is asked to perform, "
                                       "stamped at the cue's onset on the EEG stream's clock")
    return pylsl.StreamOutlet(info)


def wait_for_consumers(outlet: pylsl.StreamOutlet, timeout: float) -> bool:
    """True once some inlet is connected to ``outlet`` (False after ``timeout`` seconds)."""
    return bool(outlet.wait_for_consumers(timeout))
