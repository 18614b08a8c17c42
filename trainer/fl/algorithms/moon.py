"""MOON: model-contrastive loss between the local, the global and the previous local representation."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from neurofed.trainer.fl.api import Algorithm, Component, LocalHook, Param, RoundInputs


def _frozen_copy(model: nn.Module, state: Mapping[str, Tensor]) -> nn.Module:
    twin = copy.deepcopy(model)
    twin.load_state_dict(dict(state))
    twin.train()
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin


class _MoonHook(LocalHook):
    needs_features = True

    def __init__(self, mu: float, tau: float, glob: nn.Module, prev: nn.Module | None) -> None:
        self.mu, self.tau, self.glob, self.prev = mu, tau, glob, prev

    def loss_term(self, xb: Tensor, z: Tensor | None) -> Tensor | None:
        if self.prev is None:  # first participation: no previous local model yet
            return None
        with torch.no_grad():
            zg, zp = self.glob.features(xb), self.prev.features(xb)
        sims = torch.stack([F.cosine_similarity(z, zg, dim=1), F.cosine_similarity(z, zp, dim=1)], 1)
        target = torch.zeros(len(xb), dtype=torch.long)
        return self.mu * F.cross_entropy(sims / self.tau, target)

    def finish(self, start, state, metrics):
        return {}, {k: v.clone() for k, v in state.items()}


class Moon(Component):
    """The client keeps its previous local model (``moon_prev.*``); nothing extra travels."""

    PARAMS = (Param("moon_mu", float, 0.0, "MOON contrastive weight mu (0 = off)"),
              Param("moon_tau", float, 0.5, "MOON temperature tau", minimum=1e-6))
    KEY = "moon_prev"

    def __init__(self, mu: float, tau: float) -> None:
        self.mu, self.tau = mu, tau

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> Moon | None:
        return cls(settings["moon_mu"], settings["moon_tau"]) if settings["moon_mu"] > 0 else None

    def local_round(self, model: nn.Module, kept: Mapping[str, Tensor] | None, inputs: RoundInputs) -> LocalHook:
        glob = _frozen_copy(model, {**model.state_dict(), **inputs.global_state})
        return _MoonHook(self.mu, self.tau, glob, _frozen_copy(model, kept) if kept is not None else None)


MOON = Algorithm("moon", "SGD + mu x contrastive loss on EEGNet features (mu 1, tau 0.5; no projection head)",
                 (Moon,), {"moon_mu": 1.0, "moon_tau": 0.5}, reference="Li, He, Song, CVPR 2021")
