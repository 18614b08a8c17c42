"""Input guard: reject EEG windows that must not reach the decoder, with a reason.

Checks the raw window (microvolts, before filtering) channel by channel: non-finite samples,
flat channels (electrode off, amplifier dead), saturated channels (amplitude beyond the
amplifier's range, or clipping plateaus at the channel's extreme values).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class GuardConfig:
    """Thresholds of the input guard (microvolts).

    Parameters
    ----------
    flat_std_uv : float
        A channel whose standard deviation over the window is below this is flat.
    saturation_uv : float
        A channel with any ``|sample| >= saturation_uv`` is saturated.
    clip_fraction : float
        A channel with more than this fraction of samples sitting exactly at its min or max
        value (a clipping plateau) is saturated.
    """

    flat_std_uv: float = 0.1
    saturation_uv: float = 3000.0
    clip_fraction: float = 0.05

    def __post_init__(self) -> None:
        if self.flat_std_uv < 0 or self.saturation_uv <= 0 or not 0 < self.clip_fraction < 1:
            raise ValueError("guard thresholds: flat_std_uv >= 0, saturation_uv > 0, 0 < clip_fraction < 1")


@dataclass(frozen=True)
class GuardResult:
    """Verdict on one window: ``ok``, else a one-line ``reason`` and the channels at fault."""

    ok: bool
    reason: str = ""
    bad_channels: dict[str, list[str]] = field(default_factory=dict)


def check_window(x: np.ndarray, ch_names: Sequence[str], cfg: GuardConfig = GuardConfig()) -> GuardResult:
    """Check one raw window ``(n_channels, n_times)`` in microvolts.

    Returns
    -------
    GuardResult
        ``ok=False`` with a reason naming the problem and the channels (non-finite first, then
        flat, then saturated) when the window must be rejected.
    """
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] != len(ch_names):
        return GuardResult(False, f"window shape {x.shape} does not match {len(ch_names)} channels", {})
    if x.shape[1] < 2:
        return GuardResult(False, f"window has {x.shape[1]} samples", {})
    names = list(ch_names)
    bad: dict[str, list[str]] = {}
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        bad["non_finite"] = [names[i] for i in np.flatnonzero(~finite)]
    xf = np.where(np.isfinite(x), x, 0.0)
    std = xf.std(axis=1)
    flat = (std < cfg.flat_std_uv) & finite
    if flat.any():
        bad["flat"] = [names[i] for i in np.flatnonzero(flat)]
    over = (np.abs(xf) >= cfg.saturation_uv).any(axis=1)
    n = x.shape[1]
    at_max = (xf == xf.max(axis=1, keepdims=True)).sum(axis=1)
    at_min = (xf == xf.min(axis=1, keepdims=True)).sum(axis=1)
    clipped = (np.maximum(at_max, at_min) > cfg.clip_fraction * n) & ~flat & finite
    sat = (over | clipped) & finite
    if sat.any():
        bad["saturated"] = [names[i] for i in np.flatnonzero(sat)]
    if not bad:
        return GuardResult(True)
    parts = [
        f"{kind.replace('_', '-')} channel{'s' if len(chs) > 1 else ''} {', '.join(chs)}"
        for kind, chs in bad.items()
    ]
    return GuardResult(False, "; ".join(parts), bad)
