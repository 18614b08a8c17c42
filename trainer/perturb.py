"""Weight perturbations for sharpness-aware (SAM) and adversarial-weight (AWP) training.

Both are "ascend, take the gradient there, come back" schemes over the same first-pass
gradient, so they compose: the perturbation applied is ``e_SAM + v_AWP``, removed exactly
(restored from a saved copy, not subtracted) before the optimiser step.

* SAM (Foret et al., 2021), non-adaptive: ``e = rho * g / ||g||_2`` over all parameters.
* AWP (Wu et al., 2020), one step, layer-wise: ``v_l = gamma * ||w_l|| * g_l / ||g_l||`` for weight
  tensors with ``dim > 1`` only (no BN, no biases).

With batch-specific BN there are no running statistics, so the second pass cannot disturb
them; with standard BN, :func:`frozen_bn_stats` keeps the second pass from updating them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def sam_perturbation(params: list[nn.Parameter], rho: float) -> list[torch.Tensor | None]:
    """``rho * g / ||g||`` with the global L2 norm over every parameter's gradient."""
    grads = [p.grad for p in params]
    norm = torch.norm(torch.stack([g.norm(2) for g in grads if g is not None]), 2)
    scale = rho / (norm + 1e-12)
    return [None if g is None else g * scale for g in grads]


def awp_perturbation(params: list[nn.Parameter], gamma: float) -> list[torch.Tensor | None]:
    """Layer-wise ``gamma * ||w|| * g / ||g||`` for tensors with ``dim > 1``; None elsewhere."""
    out: list[torch.Tensor | None] = []
    for p in params:
        if p.grad is None or p.dim() <= 1:
            out.append(None)
            continue
        out.append(gamma * p.detach().norm() * p.grad / (p.grad.norm() + 1e-12))
    return out


@contextlib.contextmanager
def perturbed(params: list[nn.Parameter], deltas: list[torch.Tensor | None]) -> Iterator[None]:
    """Add ``deltas`` to ``params`` inside the block; restore the exact original values after."""
    saved = [p.detach().clone() if d is not None else None for p, d in zip(params, deltas)]
    with torch.no_grad():
        for p, d in zip(params, deltas):
            if d is not None:
                p.add_(d)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                if s is not None:
                    p.copy_(s)


@contextlib.contextmanager
def frozen_bn_stats(model: nn.Module) -> Iterator[None]:
    """Stop BN running statistics from updating (SAM's second pass); no-op for batch-specific BN."""
    saved = []
    for m in model.modules():
        if isinstance(m, _BatchNorm) and m.track_running_stats:
            saved.append((m, m.momentum))
            m.momentum = 0.0
    # momentum 0 keeps running_mean/var; num_batches_tracked still counts but is unused with momentum set
    try:
        yield
    finally:
        for m, mom in saved:
            m.momentum = mom
