"""The input guard: reject raw EEG windows that must not reach the decoder, with a one-line reason.

One definition for every guard: the kinds of fault (non-finite, flat, saturated channels), their thresholds
(:class:`GuardConfig`, microvolts), the reason naming the channels (:func:`guard_reason`) and the numpy check
(:func:`check_window`). The standalone ONNX graph (``neurofed.export.standalone``) exports the same rules into the
graph; ``neurofed.trainer.data.guard`` and ``neurofed.edge.guard`` re-export this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

#: Kinds of channel fault, in the order a reason lists them (and the rows of the graph's ``guard`` output).
GUARD_KINDS: tuple[str, ...] = ("non_finite", "flat", "saturated")


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


def guard_reason(bad: Mapping[str, Sequence[str]]) -> str:
    """One line naming the faulty channels by kind, e.g. ``"non-finite channel FCz; flat channels C3, C4"``."""
    return "; ".join(
        f"{kind.replace('_', '-')} channel{'s' if len(chs) > 1 else ''} {', '.join(chs)}"
        for kind in GUARD_KINDS
        if (chs := list(bad.get(kind, ())))
    )

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


__all__ = ["GUARD_KINDS", "GuardConfig", "GuardResult", "check_window", "guard_reason"]
