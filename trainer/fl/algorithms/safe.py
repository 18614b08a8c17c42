"""SAFE: local batch-specific BN + FGSM federated adversarial training (FAT) + adversarial weight perturbation (AWP)."""

from __future__ import annotations

from torch import Tensor, nn

from neurofed.trainer.attacks import fgsm
from neurofed.trainer.fl.api import Algorithm, LocalHook, Param, ScalarComponent
from neurofed.trainer.perturb import awp_perturbation, frozen_bn_stats


class _FatHook(LocalHook):
    def __init__(self, eps: float) -> None:
        self.eps = eps

    def adversarial(self, model: nn.Module, xb: Tensor, yb: Tensor) -> Tensor:
        with frozen_bn_stats(model):
            return fgsm(model, xb, yb, self.eps)


class FAT(ScalarComponent):
    """Train on one-step FGSM examples, budget eps x each trial's per-channel std (BN statistics untouched)."""

    PARAMS = (Param("fat_eps", float, 0.0, "FGSM adversarial-training budget, x per-channel std (0 = off)"),)
    HOOK = _FatHook


class _AwpHook(LocalHook):
    def __init__(self, gamma: float) -> None:
        self.gamma = gamma

    def weight_delta(self, params):
        return awp_perturbation(list(params), self.gamma)


class AWP(ScalarComponent):
    """One-step, layer-wise ``v = gamma ||w|| g / ||g||`` on weight tensors (dim > 1), removed after the step."""

    PARAMS = (Param("awp_gamma", float, 0.0, "adversarial weight perturbation gamma (0 = off)"),)
    HOOK = _AwpHook


SAFE = Algorithm("safe", "local batch-specific BN + FGSM adversarial training (0.03 x std) + AWP (0.01)",
                 (FAT, AWP), {"bn_mode": "batch_specific", "local_bn": True, "fat_eps": 0.03, "awp_gamma": 0.01},
                 reference="SAFE, arXiv 2601.05789")
