"""Hierarchical aggregation (FLEEG, Liu et al., Neural Networks 2024), generalised to many clients per device.

The model is split by state-dict key prefix: entries under ``group_keys`` (``local.``: the
per-device input module of ``fleeg_eegnet``) are averaged only over the selected clients of the
same group (device profile), with trial-count weights within the group, and sent only to that
group's clients; everything else (the global module) is averaged over all selected clients. The
server keeps a group's module as ``@<group>/<key>`` (see :func:`neurofed.trainer.fl.api.group_view`).

It composes with any BN rule (``--algorithm fedbs --group-keys local.`` is the FedBS rule on a
mixed-device federation) and with local components (SAM, FAT, AWP, FedProx, MOON). Server rules
that keep per-parameter state (SCAFFOLD's control variates) assume one architecture and are not
supported with groups of different shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from neurofed.trainer.fl.api import Algorithm, Component, Param


def parse_prefixes(value: str) -> tuple[str, ...]:
    """``"local.,head."`` -> ``("local.", "head.")``."""
    return tuple(p.strip() for p in str(value).split(",") if p.strip())


class Hierarchical(Component):
    """Per-group aggregation of the keys under the given prefixes (the seam: :meth:`Component.grouped_keys`)."""

    PARAMS = (Param("group_keys", str, "", "state-dict key prefixes averaged only within each client's device "
                    "profile, comma list (e.g. local.; empty = off)", minimum=None),)

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        self.prefixes = prefixes

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> Hierarchical | None:
        prefixes = parse_prefixes(settings["group_keys"])
        return cls(prefixes) if prefixes else None

    def grouped_keys(self) -> tuple[str, ...]:
        return self.prefixes


FLEEG = Algorithm("fleeg", "hierarchical: local.* (per-device module) averaged per device profile, the rest over "
                  "all clients (use with --model fleeg_eegnet --profiles)", (Hierarchical,), {"group_keys": "local."},
                  reference="Liu et al., Neural Networks 2024")
