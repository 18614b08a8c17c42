"""White-box adversarial attacks on EEG with budgets relative to the signal.

The budget ``eps`` is a multiple of each trial's per-channel standard deviation over time
(as in ABAT/SAFE): the perturbation of channel c of trial i is bounded by
``eps * std(x[i, c, :])`` in the L-infinity norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def channel_budget(x: Tensor, eps: float) -> Tensor:
    """Per-trial, per-channel L-inf bound ``eps * std_t(x)``, shape (n, c, 1)."""
    return eps * x.std(dim=-1, keepdim=True)


def _input_grad(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    x = x.detach().requires_grad_(True)
    loss = F.cross_entropy(model(x), y)
    (g,) = torch.autograd.grad(loss, x)
    return g


def fgsm(model: nn.Module, x: Tensor, y: Tensor, eps: float) -> Tensor:
    """One-step FGSM: ``x + eps*std * sign(grad_x L)``. Model mode (train/eval) is left as it is."""
    if eps == 0:
        return x.detach()
    budget = channel_budget(x, eps)
    return (x + budget * _input_grad(model, x, y).sign()).detach()


def pgd(
    model: nn.Module, x: Tensor, y: Tensor, eps: float, steps: int = 10,
    step_size: float | None = None, seed: int = 0, random_start: bool = True,
) -> Tensor:
    """L-inf PGD with per-channel budget, step ``eps/4`` by default, seeded random start."""
    if eps == 0:
        return x.detach()
    budget = channel_budget(x, eps)
    alpha = budget * ((step_size / eps) if step_size is not None else 0.25)
    x_adv = x.detach().clone()
    if random_start:
        gen = torch.Generator().manual_seed(seed)
        x_adv = x_adv + (torch.rand(x.shape, generator=gen, dtype=x.dtype) * 2 - 1) * budget
    for _ in range(steps):
        g = _input_grad(model, x_adv, y)
        x_adv = x_adv.detach() + alpha * g.sign()
        x_adv = torch.max(torch.min(x_adv, x + budget), x - budget)
    return x_adv.detach()


ATTACKS = {"fgsm": fgsm, "pgd": pgd}
