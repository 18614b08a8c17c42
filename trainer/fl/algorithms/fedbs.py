"""FedBS: local batch-specific BN + sharpness-aware minimisation (SAM)."""

from __future__ import annotations

from neurofed.trainer.fl.api import Algorithm, LocalHook, Param, ScalarComponent
from neurofed.trainer.perturb import sam_perturbation


class _SamHook(LocalHook):
    def __init__(self, rho: float) -> None:
        self.rho = rho

    def weight_delta(self, params):
        return sam_perturbation(list(params), self.rho)


class SAM(ScalarComponent):
    """Non-adaptive SAM: ``e = rho g / ||g||`` over all parameters; the gradient at ``w + e`` is used."""

    PARAMS = (Param("sam_rho", float, 0.0, "SAM radius rho (0 = off)"),)
    HOOK = _SamHook


FEDBS = Algorithm("fedbs", "local batch-specific BN + SAM (rho 0.1)", (SAM,),
                  {"bn_mode": "batch_specific", "local_bn": True, "sam_rho": 0.1},
                  reference="Jia et al., IEEE TNSRE 2024")
