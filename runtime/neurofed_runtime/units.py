"""Channel units and labels of EEG streams and files: the one table and the one label rule.

Used wherever raw EEG enters (the runtime, edge/ for LSL streams, export/ for what an app's device sends, trainer's own
channel picking), so a stream one part accepts, every part accepts.

Units follow the XDF/LSL meta-data spellings (``microvolts``, ``uV``, ``volts``, ``mV``, ...) and mne-lsl's
convention of the power of ten of volts (``"0"`` = volts, ``"-6"`` = microvolts); an empty unit counts as
microvolts. Labels match case-insensitively and without EEGMMIDB's trailing dots (``Fc5.`` ~ ``FC5``).
"""

from __future__ import annotations

#: Channel unit spellings (lower case) and their factor to microvolts.
UNIT_TO_UV = {"microvolts": 1.0, "microvolt": 1.0, "uv": 1.0, "µv": 1.0, "μv": 1.0,
              "volts": 1e6, "volt": 1e6, "v": 1e6, "millivolts": 1e3, "millivolt": 1e3, "mv": 1e3,
              "nanovolts": 1e-3, "nanovolt": 1e-3, "nv": 1e-3}


def unit_scale(unit: str) -> float | None:
    """Factor turning values in ``unit`` into microvolts ('' counts as microvolts); None if unknown."""
    u = unit.strip().lower()
    if not u:
        return 1.0
    if u in UNIT_TO_UV:
        return UNIT_TO_UV[u]
    try:
        return 10.0 ** (int(u) + 6)  # mne-lsl: exponent of volts
    except ValueError:
        return None


def norm_label(label: str) -> str:
    """Case-insensitive label without EEGMMIDB's trailing dots (``Fc5.`` ~ ``FC5``)."""
    return label.strip().rstrip(".").lower()
