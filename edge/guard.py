"""Input guard: reject EEG windows that must not reach the decoder, with a reason.

Checks the raw window (microvolts, before filtering) channel by channel: non-finite samples,
flat channels (electrode off, amplifier dead), saturated channels (amplitude beyond the
amplifier's range, or clipping plateaus at the channel's extreme values). The kinds, thresholds
and reason text are ``neurofed.trainer.data.guard``'s, shared with the standalone ONNX graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from neurofed.trainer.data.guard import GuardConfig, guard_reason

__all__ = ["GuardConfig", "GuardResult", "check_window"]


@dataclass(frozen=True)
class GuardResult:
    """Verdict on one window: ``ok``, else a one-line ``reason`` and the channels at fault."""

    ok: bool
    reason: str = ""
    bad_channels: dict[str, list[str]] = field(default_factory=dict)


def check_window(x: np.ndarray, ch_names: Sequence[str], cfg: GuardConfig | None = None) -> GuardResult:
    """Check one raw window ``(n_channels, n_times)`` in microvolts.

    Returns
    -------
    GuardResult
        ``ok=False`` with a reason naming the problem and the channels (non-finite first, then
        flat, then saturated) when the window must be rejected.
    """
    cfg = cfg if cfg is not None else GuardConfig()
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
    return GuardResult(False, guard_reason(bad), bad)
