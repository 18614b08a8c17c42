"""FedFA: federated feature augmentation (Zhou & Konukoglu, "FedFA: Federated Feature Augmentation", ICLR 2023).

During local training, the output ``x`` (batch B, channels C, H, W) of every augmentation point (the model's
``FEATURE_BLOCKS``: for EEGNet the end of both conv blocks, after ELU and average pooling, as the paper puts
its layers after conv-BN-ReLU-pool; models without it: every BatchNorm layer's output) is, with probability
``p`` per batch and point, re-styled: with the per-trial channel means ``mu`` and standard deviations ``sig`` (over H, W),

    x' = (x - mu) / sig * sig~ + mu~,   mu~ ~ N(mu, (1 + g_mu) s2_mu),   sig~ ~ N(sig, (1 + g_sig) s2_sig)

where ``s2_mu``/``s2_sig`` are the batch's own variances of ``mu``/``sig`` over its trials (per channel, + 1e-6)
and ``g`` combines them with the **client-sharing** variances ``S2`` the server estimates across clients:
``g_c = C * r_c / sum_c' r_c'`` with ``r = S2 / (1 + S2)`` (so ``g`` averages 1 over the channels and only moves
noise to the channels whose statistics differ most between clients).

Each client keeps running means of its ``mu`` and ``sig`` per point (momentum 0.99, updated on every training
batch), starting each round from the server's values, and uploads them (``fedfa_up.mean.<point>``,
``fedfa_up.std.<point>``). The server sets the next round's running statistics to their trial-weighted mean
and ``S2`` to their channel-wise variance across the round's clients (population variance, 1/M);
everything travels down as ``fedfa.{mean,std,var_mean,var_std}.<point>``. Before the first aggregation
``S2`` is 1 (so ``g`` = 1), the running means 0 and 1.

The augmentation is installed as forward hooks for the local round only and removed when it ends: the model
and its state dict are unchanged, and evaluation, export and every other algorithm never see it (identity at
test time, as in the paper).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from neurofed.trainer.fl.aggregate import WeightedSum
from neurofed.trainer.fl.api import (
    Algorithm,
    Component,
    LocalHook,
    Param,
    RoundInputs,
    ServerRound,
    TensorSpec,
)
from neurofed.trainer.models.bn import bn_modules

EPS = 1e-6
MOMENTUM = 0.99
STATS = ("mean", "std")


def augmentation_points(model: nn.Module) -> list[str]:
    """The modules whose outputs FedFA augments: the model's ``FEATURE_BLOCKS`` (EEGNet: the end of each conv
    block), else every BatchNorm layer (by type, :func:`neurofed.trainer.models.bn.bn_modules`)."""
    names = getattr(model, "FEATURE_BLOCKS", None)
    if names is None:
        return sorted(bn_modules(model))
    mods = dict(model.named_modules())
    missing = [n for n in names if n not in mods]
    if missing:
        raise ValueError(f"{type(model).__name__}.FEATURE_BLOCKS names no module {missing}")
    return list(names)


def point_channels(model: nn.Module) -> dict[str, int]:
    """Feature channels at each augmentation point, from one forward pass of two zero trials in eval mode
    (``model.n_channels`` x ``model.n_times``; nothing of the model changes)."""
    mods = dict(model.named_modules())
    shapes: dict[str, int] = {}

    def probe(name: str):
        def hook(module: nn.Module, inputs: Any, out: Tensor) -> None:
            shapes.setdefault(name, int(out.shape[1]))
        return hook

    handles = [mods[n].register_forward_hook(probe(n)) for n in augmentation_points(model)]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(2, model.n_channels, model.n_times))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {n: shapes[n] for n in augmentation_points(model)}


def instance_stats(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-trial, per-channel mean and standard deviation over the spatial dims: ``(B, C)`` each."""
    mu = x.mean(dim=(2, 3))
    sig = (x.var(dim=(2, 3)) + EPS).sqrt()
    return mu, sig


def sharing_weights(s2: Tensor) -> Tensor:
    """``g_c = C r_c / sum(r)``, ``r = S2 / (1 + S2)``: the client-sharing variances as channel weights (mean 1)."""
    r = 1.0 / (1.0 + 1.0 / (s2 + EPS))
    return s2.numel() * r / r.sum()


def noise_std(stat: Tensor, s2_shared: Tensor) -> Tensor:
    """Std of the Gaussian a statistic ``stat`` (B, C) is drawn from: ``sqrt((1 + g) (var_batch(stat) + eps))``."""
    return ((1.0 + sharing_weights(s2_shared)) * (stat.var(dim=0) + EPS)).sqrt()


class _Point:
    """One augmentation point's running statistics and shared variances during a local round."""

    def __init__(self, p: float, mean: Tensor, std: Tensor, var_mean: Tensor, var_std: Tensor) -> None:
        self.p, self.mean, self.std, self.var_mean, self.var_std = p, mean.clone(), std.clone(), var_mean, var_std

    def __call__(self, module: nn.Module, inputs: Any, x: Tensor) -> Tensor:
        if not module.training or x.dim() != 4 or x.shape[0] < 2 or x.shape[2] * x.shape[3] < 2:
            return x
        mu, sig = instance_stats(x)
        with torch.no_grad():
            self.mean.mul_(MOMENTUM).add_(mu.mean(0).detach(), alpha=1 - MOMENTUM)
            self.std.mul_(MOMENTUM).add_(sig.mean(0).detach(), alpha=1 - MOMENTUM)
        if float(torch.rand(())) >= self.p:
            return x
        new_mu = mu + torch.randn_like(mu) * noise_std(mu, self.var_mean)
        new_sig = sig + torch.randn_like(sig) * noise_std(sig, self.var_std)
        return (x - mu[:, :, None, None]) / sig[:, :, None, None] * new_sig[:, :, None, None] + new_mu[:, :, None, None]


@contextmanager
def augmented(model: nn.Module, p: float, extras: Mapping[str, Tensor] | None = None):
    """FedFA's augmentation installed on ``model`` for the block (yields the points' running statistics)."""
    hook = _FedFAHook(model, p, extras or {})
    try:
        yield hook.points
    finally:
        hook.remove()


class _FedFAHook(LocalHook):
    def __init__(self, model: nn.Module, p: float, extras: Mapping[str, Tensor]) -> None:
        mods = dict(model.named_modules())
        self.points: dict[str, _Point] = {}
        for name, c in point_channels(model).items():
            def get(kind: str, default: float, name: str = name, c: int = c) -> Tensor:
                v = extras.get(f"{FedFA.KEY}.{kind}.{name}")
                return v.detach().to(torch.float32).clone() if v is not None else torch.full((c,), default)
            self.points[name] = _Point(p, get("mean", 0.0), get("std", 1.0), get("var_mean", 1.0), get("var_std", 1.0))
        self.handles = [mods[n].register_forward_hook(pt) for n, pt in self.points.items()]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    close = remove

    def finish(self, start, state, metrics):
        self.remove()
        up = {}
        for name, pt in self.points.items():
            up[f"{FedFA.UP}.mean.{name}"] = pt.mean.clone()
            up[f"{FedFA.UP}.std.{name}"] = pt.std.clone()
        return up, None


class _FedFAServer(ServerRound):
    """Trial-weighted mean and population variance (over clients, per channel) of the uploaded running stats."""

    def __init__(self) -> None:
        self.mean = WeightedSum()
        self.s1: dict[str, Tensor] = {}
        self.s2: dict[str, Tensor] = {}
        self.n = 0

    def add(self, extras, n_samples) -> None:
        ups = {k[len(FedFA.UP) + 1:]: v.double() for k, v in extras.items() if k.startswith(FedFA.UP + ".")}
        self.mean.add(ups, float(n_samples))
        for k, v in ups.items():
            self.s1[k] = self.s1.get(k, 0) + v
            self.s2[k] = self.s2.get(k, 0) + v * v
        self.n += 1

    def finish(self, old_global, new_global, extras, n_updates):
        if not self.n:
            return new_global, extras
        for k, v in self.mean.result().items():  # k = "mean.<point>" / "std.<point>"
            kind, _, point = k.partition(".")
            m1 = self.s1[k] / self.n
            var = (self.s2[k] / self.n - m1 * m1).clamp_min(0.0)
            extras[f"{FedFA.KEY}.{kind}.{point}"] = v.to(torch.float32)
            extras[f"{FedFA.KEY}.var_{kind}.{point}"] = var.to(torch.float32)
        return new_global, extras


class FedFA(Component):
    """Local feature-statistics augmentation; the server aggregates the clients' running statistics."""

    PARAMS = (Param("fedfa_p", float, 0.0, "FedFA: probability of augmenting a batch at each feature-augmentation point "
                    "(0 = off; the paper uses 0.5)"),)
    KEY = "fedfa"
    UP = "fedfa_up"

    def __init__(self, p: float) -> None:
        if not 0 < p <= 1:
            raise ValueError(f"fedfa_p must be in (0, 1], got {p}")
        self.p = p

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> FedFA | None:
        return cls(settings["fedfa_p"]) if settings["fedfa_p"] > 0 else None

    def local_round(self, model: nn.Module, kept: Mapping[str, Tensor] | None, inputs: RoundInputs) -> LocalHook:
        return _FedFAHook(model, self.p, inputs.server_extras)

    def upload_specs(self, model: nn.Module) -> dict[str, TensorSpec]:
        return {f"{self.UP}.{kind}.{name}": TensorSpec((c,), torch.float32)
                for name, c in point_channels(model).items() for kind in STATS}

    def downlink_extras(self, server_extras):
        return {k: v for k, v in server_extras.items() if k.startswith(self.KEY + ".")}

    def server_round(self, server_extras, n_clients_total: int) -> ServerRound:
        return _FedFAServer()


FEDFA = Algorithm("fedfa", "FedAvg + feature-statistics augmentation after each conv block (p 0.5): per-trial channel "
                  "mean/std resampled with noise from the batch's and the clients' shared statistic variances",
                  (FedFA,), {"fedfa_p": 0.5}, reference="Zhou & Konukoglu, ICLR 2023")
