"""Federated strategies as data: which BN mode, whether BN stays local, which local regularisers.

========  ===============  =========  =====================================================
name      bn_mode          local_bn   local training
========  ===============  =========  =====================================================
fedavg    standard         no         SGD
fedprox   standard         no         SGD + (mu/2)||w - w_global||^2
scaffold  standard         no         SGD with control-variate correction
moon      standard         no         SGD + model-contrastive loss
fedbn     standard         yes        SGD (BN params and running stats stay on the client)
fedbs     batch_specific   yes        SAM (rho 0.1)
safe      batch_specific   yes        FGSM adversarial training (0.03 x std) + AWP (0.01)
ct        standard         -          centralised (pooled) training, not federated
========  ===============  =========  =====================================================

``local_bn`` is FedBS's rule: clients upload every parameter, the server aggregates every
parameter (BN included), but the model sent down omits the BN entries, so each client keeps
its own BN during training; the final global model carries the aggregated BN.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

BN_SYNC = ("local", "stale_global")


@dataclass(frozen=True)
class Strategy:
    """One federated algorithm (and its ablations).

    Parameters
    ----------
    name : str
    bn_mode : {"standard", "batch_specific"}
    local_bn : bool
        BN keys are not sent down (FedBN / FedBS / SAFE).
    bn_sync : {"local", "stale_global"}
        ``local`` (paper): a client trains from its own BN. ``stale_global`` (authors' code):
        the aggregated BN of the previous round is copied into the client at its next round.
    sam_rho : float
        SAM radius (0 = off). Non-adaptive: ``e = rho * g / ||g||`` over all parameters.
    fat_eps : float
        FGSM adversarial training budget as a multiple of each trial's per-channel std (0 = off).
    awp_gamma : float
        Adversarial weight perturbation size relative to each weight tensor's norm (0 = off).
    prox_mu : float
        FedProx proximal weight (0 = off).
    scaffold : bool
        SCAFFOLD control variates.
    moon_mu, moon_tau : float
        MOON contrastive weight (0 = off) and temperature.
    """

    name: str
    bn_mode: str = "standard"
    local_bn: bool = False
    bn_sync: str = "local"
    sam_rho: float = 0.0
    fat_eps: float = 0.0
    awp_gamma: float = 0.0
    prox_mu: float = 0.0
    scaffold: bool = False
    moon_mu: float = 0.0
    moon_tau: float = 0.5

    def __post_init__(self) -> None:
        if self.bn_mode not in ("standard", "batch_specific"):
            raise ValueError(f"bn_mode must be standard or batch_specific, got {self.bn_mode!r}")
        if self.bn_sync not in BN_SYNC:
            raise ValueError(f"bn_sync must be one of {BN_SYNC}, got {self.bn_sync!r}")
        for f in ("sam_rho", "fat_eps", "awp_gamma", "prox_mu", "moon_mu"):
            if getattr(self, f) < 0:
                raise ValueError(f"{f} must be >= 0, got {getattr(self, f)}")
        if self.moon_tau <= 0:
            raise ValueError("moon_tau must be > 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


STRATEGIES: dict[str, Strategy] = {
    "ct": Strategy("ct"),
    "fedavg": Strategy("fedavg"),
    "fedprox": Strategy("fedprox", prox_mu=0.01),
    "scaffold": Strategy("scaffold", scaffold=True),
    "moon": Strategy("moon", moon_mu=1.0, moon_tau=0.5),
    "fedbn": Strategy("fedbn", local_bn=True),
    "fedbs": Strategy("fedbs", bn_mode="batch_specific", local_bn=True, sam_rho=0.1),
    "safe": Strategy("safe", bn_mode="batch_specific", local_bn=True, fat_eps=0.03, awp_gamma=0.01),
}


def get_strategy(name: str, **overrides: Any) -> Strategy:
    """A named strategy with optional field overrides (ablations), e.g. ``get_strategy("fedbs", sam_rho=0)``."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown algorithm {name!r}; choose from {sorted(STRATEGIES)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return replace(STRATEGIES[name], **overrides)
