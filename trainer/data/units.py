"""Channel units and labels of EEG streams and files: ``neurofed_runtime.units`` (the one table and the one label
rule), re-exported for the trainer's channel picking and the edge's streams."""

from __future__ import annotations

from neurofed_runtime.units import UNIT_TO_UV, norm_label, unit_scale

__all__ = ["UNIT_TO_UV", "norm_label", "unit_scale"]
