"""Local training: SGD with composable SAM, FGSM adversarial training, AWP, FedProx, SCAFFOLD, MOON."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.attacks import fgsm
from trainer.fl.strategies import Strategy
from trainer.perturb import awp_perturbation, frozen_bn_stats, perturbed, sam_perturbation


@dataclass(frozen=True)
class LocalConfig:
    """Client optimiser and schedule (papers' values: SGD lr 0.005, momentum 0.9, wd 1e-4, 2 epochs).

    Parameters
    ----------
    lr, momentum, weight_decay : float
    batch_size : int
        Client mini-batch size.
    local_epochs : int
        Passes over the client's trials per round.
    """

    lr: float = 0.005
    momentum: float = 0.9
    weight_decay: float = 1e-4
    batch_size: int = 32
    local_epochs: int = 2

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.batch_size < 2 or self.local_epochs < 1:
            raise ValueError(f"invalid local config {self}: need lr > 0, batch_size >= 2, local_epochs >= 1")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class LocalContext:
    """Round inputs some strategies need besides the data.

    Attributes
    ----------
    global_state : dict
        The model as received this round (FedProx anchor, MOON's global representation).
    scaffold_c, scaffold_ci : dict
        Server and client control variates (parameter name -> tensor).
    moon_prev : dict or None
        The client's previous local model state (MOON negative).
    """

    global_state: dict[str, Tensor] = field(default_factory=dict)
    scaffold_c: dict[str, Tensor] | None = None
    scaffold_ci: dict[str, Tensor] | None = None
    moon_prev: dict[str, Tensor] | None = None


def _frozen_copy(model: nn.Module, state: dict[str, Tensor]) -> nn.Module:
    twin = copy.deepcopy(model)
    twin.load_state_dict(state)
    twin.train()
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin


def batches(n: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled mini-batch indices; a trailing batch of one trial is dropped (BN needs >= 2)."""
    perm = rng.permutation(n)
    out = [perm[i : i + batch_size] for i in range(0, n, batch_size)]
    return [b for b in out if len(b) >= 2]


def train_local(
    model: nn.Module,
    X: np.ndarray,
    y: np.ndarray,
    strategy: Strategy,
    cfg: LocalConfig,
    seed: int,
    ctx: LocalContext | None = None,
) -> dict[str, float]:
    """Train ``model`` in place on (X, y) for ``cfg.local_epochs`` epochs.

    Each step: optional FGSM examples (``strategy.fat_eps``), loss (+ FedProx / MOON terms),
    first-pass gradient; if SAM and/or AWP, the combined perturbation ``e_SAM + v_AWP`` is
    applied, the gradient taken there, and the exact weights restored; SCAFFOLD corrects the
    gradient by ``c - c_i``; then one SGD step.

    Returns
    -------
    dict
        ``loss`` (mean over steps) and ``steps``.
    """
    ctx = ctx or LocalContext()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    anchor = [ctx.global_state[n].detach().clone() for n in names] if strategy.prox_mu > 0 else None
    moon_global = moon_prev = None
    if strategy.moon_mu > 0:
        moon_global = _frozen_copy(model, {**model.state_dict(), **ctx.global_state})
        moon_prev = _frozen_copy(model, ctx.moon_prev) if ctx.moon_prev is not None else None
    correction = None
    if strategy.scaffold and ctx.scaffold_c is not None and ctx.scaffold_ci is not None:
        correction = [ctx.scaffold_c[n] - ctx.scaffold_ci[n] for n in names]
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)

    def loss_on(xb: Tensor, yb: Tensor) -> Tensor:
        if moon_global is None:
            loss = F.cross_entropy(model(xb), yb)
        else:
            z = model.features(xb)
            loss = F.cross_entropy(model.classifier(z), yb)
            if moon_prev is not None:
                with torch.no_grad():
                    zg, zp = moon_global.features(xb), moon_prev.features(xb)
                sims = torch.stack([F.cosine_similarity(z, zg, dim=1), F.cosine_similarity(z, zp, dim=1)], 1)
                target = torch.zeros(len(xb), dtype=torch.long)
                loss = loss + strategy.moon_mu * F.cross_entropy(sims / strategy.moon_tau, target)
        if anchor is not None:
            loss = loss + 0.5 * strategy.prox_mu * sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))
        return loss

    total, steps = 0.0, 0
    for _ in range(cfg.local_epochs):
        for idx in batches(len(X), cfg.batch_size, rng):
            xb, yb = Xt[idx], yt[idx]
            if strategy.fat_eps > 0:
                with frozen_bn_stats(model):
                    xb = fgsm(model, xb, yb, strategy.fat_eps)
            opt.zero_grad(set_to_none=True)
            loss = loss_on(xb, yb)
            loss.backward()
            if strategy.sam_rho > 0 or strategy.awp_gamma > 0:
                deltas = [None] * len(params)
                parts = []
                if strategy.sam_rho > 0:
                    parts.append(sam_perturbation(params, strategy.sam_rho))
                if strategy.awp_gamma > 0:
                    parts.append(awp_perturbation(params, strategy.awp_gamma))
                for part in parts:
                    deltas = [d if q is None else (q if d is None else d + q) for d, q in zip(deltas, part)]
                with perturbed(params, deltas), frozen_bn_stats(model):
                    opt.zero_grad(set_to_none=True)
                    loss_on(xb, yb).backward()
            if correction is not None:
                for p, c in zip(params, correction):
                    if p.grad is not None:
                        p.grad.add_(c)
            opt.step()
            total += float(loss.detach())
            steps += 1
    return {"loss": total / max(steps, 1), "steps": float(steps)}
