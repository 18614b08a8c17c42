"""Preprocessing configuration (validated once, hashed into the cache key)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

SENSORIMOTOR_21: tuple[str, ...] = (
    "FC5", "FC3", "FC1", "FCz", "FC2", "FC4", "FC6",
    "C5", "C3", "C1", "Cz", "C2", "C4", "C6",
    "CP5", "CP3", "CP1", "CPz", "CP2", "CP4", "CP6",
)

CHANNEL_PRESETS: dict[str, tuple[str, ...] | None] = {
    "all": None,
    "sensorimotor21": SENSORIMOTOR_21,
}

#: Bumped whenever preprocessing code changes what it produces (invalidates caches).
PIPELINE_VERSION = "1"


@dataclass(frozen=True)
class PreprocessConfig:
    """How epochs are cut and preprocessed.

    Parameters
    ----------
    fmin, fmax : float
        Band-pass edges in Hz (zero-phase Butterworth, applied to each epoch).
    tmin, tmax : float
        Epoch window in seconds relative to the cue; ``n_times = round((tmax - tmin) * sfreq)``.
    resample : float or None
        Target sampling rate in Hz, or None to keep the recording's rate.
    channels : tuple of str or None
        Channel subset in this order (standard 10-05 names), or None for all channels.
    ea : bool
        Euclidean alignment per subject, from that subject's own trials only.
    filter_order : int
        Butterworth order of each of the low-/high-pass halves.
    """

    fmin: float = 8.0
    fmax: float = 30.0
    tmin: float = 0.0
    tmax: float = 4.0
    resample: float | None = None
    channels: tuple[str, ...] | None = None
    ea: bool = True
    filter_order: int = 4
    version: str = field(default=PIPELINE_VERSION)

    def __post_init__(self) -> None:
        if not 0 < self.fmin < self.fmax:
            raise ValueError(f"band-pass needs 0 < fmin < fmax, got fmin={self.fmin}, fmax={self.fmax}")
        if self.tmax <= self.tmin:
            raise ValueError(f"epoch window needs tmax > tmin, got [{self.tmin}, {self.tmax}]")
        if self.resample is not None and self.resample <= 2 * self.fmax:
            raise ValueError(
                f"resample={self.resample} Hz is below twice fmax={self.fmax} Hz (Nyquist); raise it or lower fmax"
            )
        if self.filter_order < 1:
            raise ValueError(f"filter_order must be >= 1, got {self.filter_order}")
        if self.channels is not None:
            object.__setattr__(self, "channels", tuple(self.channels))
            if len(set(self.channels)) != len(self.channels):
                raise ValueError("channel list has duplicates")

    @classmethod
    def from_preset(cls, channels: str = "all", **kwargs: object) -> PreprocessConfig:
        """Build with a named channel preset (``all`` or ``sensorimotor21``) or a comma list."""
        if channels in CHANNEL_PRESETS:
            chs = CHANNEL_PRESETS[channels]
        else:
            chs = tuple(c.strip() for c in channels.split(",") if c.strip())
        return cls(channels=chs, **kwargs)  # type: ignore[arg-type]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["channels"] = list(self.channels) if self.channels is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PreprocessConfig:
        d = dict(d)
        if d.get("channels") is not None:
            d["channels"] = tuple(d["channels"])
        return cls(**d)

    def key(self) -> str:
        """Stable hash of every parameter (part of the cache key)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
