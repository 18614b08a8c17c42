"""SAFE: local batch-specific BN + FGSM federated adversarial training (FAT) + adversarial weight perturbation (AWP)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from trainer.attacks import fgsm
from trainer.fl.api import Algorithm, Component, LocalHook, Param, RoundInputs
from trainer.perturb import awp_perturbation, frozen_bn_stats


class _FatHook(LocalHook):
    def __init__(self, eps: float) -> None:
        self.eps = eps

    def adversarial(self, model: nn.Module, xb: Tensor, yb: Tensor) -> Tensor:
        with frozen_bn_stats(model):
            return fgsm(model, xb, yb, self.eps)


class FAT(Component):
    """Train on one-step FGSM examples, budget eps x each trial's per-channel std (BN statistics untouched)."""

    PARAMS = (Param("fat_eps", float, 0.0, "FGSM adversarial-training budget, x per-channel std (0 = off)"),)

    def __init__(self, eps: float) -> None:
        self.eps = eps

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> FAT | None:
        return cls(settings["fat_eps"]) if settings["fat_eps"] > 0 else None

    def local_round(self, model: nn.Module, kept: Mapping[str, Tensor] | None, inputs: RoundInputs) -> LocalHook:
        return _FatHook(self.eps)


class _AwpHook(LocalHook):
    def __init__(self, gamma: float) -> None:
        self.gamma = gamma

    def weight_delta(self, params):
        return awp_perturbation(list(params), self.gamma)


class AWP(Component):
    """One-step, layer-wise ``v = gamma ||w|| g / ||g||`` on weight tensors (dim > 1), removed after the step."""

    PARAMS = (Param("awp_gamma", float, 0.0, "adversarial weight perturbation gamma (0 = off)"),)

    def __init__(self, gamma: float) -> None:
        self.gamma = gamma

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> AWP | None:
        return cls(settings["awp_gamma"]) if settings["awp_gamma"] > 0 else None

    def local_round(self, model: nn.Module, kept: Mapping[str, Tensor] | None, inputs: RoundInputs) -> LocalHook:
        return _AwpHook(self.gamma)


SAFE = Algorithm("safe", "local batch-specific BN + FGSM adversarial training (0.03 x std) + AWP (0.01)",
                 (FAT, AWP), {"bn_mode": "batch_specific", "local_bn": True, "fat_eps": 0.03, "awp_gamma": 0.01},
                 reference="SAFE, arXiv 2601.05789")
