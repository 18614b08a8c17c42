"""FedBS: local batch-specific BN + sharpness-aware minimisation (SAM)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from trainer.fl.api import Algorithm, Component, LocalHook, Param, RoundInputs
from trainer.perturb import sam_perturbation


class _SamHook(LocalHook):
    def __init__(self, rho: float) -> None:
        self.rho = rho

    def weight_delta(self, params):
        return sam_perturbation(list(params), self.rho)


class SAM(Component):
    """Non-adaptive SAM: ``e = rho g / ||g||`` over all parameters; the gradient at ``w + e`` is used."""

    PARAMS = (Param("sam_rho", float, 0.0, "SAM radius rho (0 = off)"),)

    def __init__(self, rho: float) -> None:
        self.rho = rho

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> SAM | None:
        return cls(settings["sam_rho"]) if settings["sam_rho"] > 0 else None

    def local_round(self, model: nn.Module, kept: Mapping[str, Tensor] | None, inputs: RoundInputs) -> LocalHook:
        return _SamHook(self.rho)


FEDBS = Algorithm("fedbs", "local batch-specific BN + SAM (rho 0.1)", (SAM,),
                  {"bn_mode": "batch_specific", "local_bn": True, "sam_rho": 0.1},
                  reference="Jia et al., IEEE TNSRE 2024")
