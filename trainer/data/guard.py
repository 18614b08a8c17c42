"""The input guard's definition, one place for both guards that apply it.

``neurofed.edge.guard.check_window`` (the Python edge path, numpy) and the standalone ONNX graph
(``neurofed.export.standalone``, torch ops exported into the graph) reject the same raw windows: the kinds
of fault, their thresholds and the one-line reason naming the channels are defined here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
