"""FAL-style federated adversarial training: every client trains on PGD examples (Zizzo et al., "FAT: Federated
Adversarial Training", 2020; SAFE's "FAL" baseline), and SAFE's CT + adversarial training reference ("AT")."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from neurofed.trainer.attacks import pgd
from neurofed.trainer.fl.api import Algorithm, LocalHook, Param, RoundInputs, ScalarComponent
from neurofed.trainer.perturb import frozen_bn_stats


class _PgdHook(LocalHook):
    def __init__(self, eps: float, steps: int) -> None:
        self.eps, self.steps = eps, steps

    def adversarial(self, model: nn.Module, xb: Tensor, yb: Tensor) -> Tensor:
        seed = int(torch.randint(0, 2**31 - 1, (1,)))  # from the round's seeded torch RNG: a new random start per step
        with frozen_bn_stats(model):
            return pgd(model, xb, yb, self.eps, steps=self.steps, seed=seed)


class PGDAT(ScalarComponent):
    """Train on PGD examples (per-channel budget eps x std, step eps/4, seeded random start; BN statistics untouched)."""

    PARAMS = (Param("pgd_at_eps", float, 0.0, "PGD adversarial-training budget, x per-channel std (0 = off)"),
              Param("pgd_at_steps", int, 10, "PGD adversarial training: steps per example", minimum=1))

    def __init__(self, value: float, steps: int = 10) -> None:
        super().__init__(value)
        self.steps = steps

    @classmethod
    def build(cls, settings: Mapping) -> PGDAT | None:
        return cls(settings["pgd_at_eps"], settings["pgd_at_steps"]) if settings["pgd_at_eps"] > 0 else None

    def local_round(self, model: nn.Module, kept: Mapping[str, Tensor] | None, inputs: RoundInputs) -> LocalHook:
        return _PgdHook(self.value, self.steps)


FAL = Algorithm("fal", "FedAvg + PGD-10 adversarial training (0.03 x std) on every client", (PGDAT,),
                {"pgd_at_eps": 0.03}, reference="Zizzo et al., arXiv 2012.01791")
CT_AT = Algorithm("ct_at", "CT + FGSM adversarial training (0.03 x std): SAFE's 'AT' reference", (),
                  {"fat_eps": 0.03}, reference="SAFE, arXiv 2601.05789", centralised=True)
