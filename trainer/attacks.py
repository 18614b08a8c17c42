"""White-box adversarial attacks on EEG with budgets relative to the signal.

The budget ``eps`` is a multiple of each trial's per-channel standard deviation over time
(as in ABAT/SAFE): the perturbation of channel c of trial i is bounded by
``eps * std(x[i, c, :])`` in the L-infinity norm.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from neurofed.trainer import art_attacks
from neurofed.trainer.art_attacks import LIBRARY_BUDGETS
from neurofed.trainer.errors import NeuroFedError


def channel_budget(x: Tensor, eps: float) -> Tensor:
    """Per-trial, per-channel L-inf bound ``eps * std_t(x)``, shape (n, c, 1)."""
    return eps * x.std(dim=-1, keepdim=True)


def _input_grad(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    x = x.detach().requires_grad_(True)
    loss = F.cross_entropy(model(x), y)
    (g,) = torch.autograd.grad(loss, x)
    return g


def fgsm(model: nn.Module, x: Tensor, y: Tensor, eps: float, seed: int = 0) -> Tensor:
    """One-step FGSM: ``x + eps*std * sign(grad_x L)``. Model mode (train/eval) is left as it is.

    ``seed`` is unused (FGSM is deterministic); it keeps every attack's signature the same.
    """
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


class AttackUnavailable(NeuroFedError):
    """A library attack was asked for but its library is not installed."""


def art_attacks_module(name: str) -> ModuleType:
    """:mod:`neurofed.trainer.art_attacks`, imported when attack ``name`` runs; :class:`AttackUnavailable` without ART."""
    try:
        import art  # noqa: F401  (neurofed.trainer.art_attacks imports it lazily, inside each attack)
    except ImportError as exc:
        raise AttackUnavailable(f"attack {name!r} needs the Adversarial Robustness Toolbox: "
                                "pip install 'neurofed[attacks]'") from exc
    return art_attacks


def _library_attack(name: str) -> Callable[..., Tensor]:
    """A library attack, importing the Adversarial Robustness Toolbox only when it runs."""

    def run(model: nn.Module, x: Tensor, y: Tensor, eps: float, seed: int = 0) -> Tensor:
        return art_attacks_module(name).LIBRARY_ATTACKS[name](model, x, y, eps, seed)

    run.__name__ = name
    return run


#: Every attack by name (``--attack NAME:EPS``): function(model, x, y, eps, seed) -> adversarial batch.
#: fgsm/pgd are NeuroFed's own white-box attacks; autoattack, square (score-based) and hsj (hard-label
#: HopSkipJump) run through ART (:mod:`neurofed.trainer.art_attacks`, budgets in its ``LIBRARY_BUDGETS``).
LIBRARY_ATTACK_NAMES = ("autoattack", "square", "hsj")
ATTACKS: dict[str, Callable[..., Tensor]] = {"fgsm": fgsm, "pgd": pgd,
                                             **{n: _library_attack(n) for n in LIBRARY_ATTACK_NAMES}}


def attack_budgets(names: list[str]) -> dict[str, dict]:
    """Budgets of the library attacks among ``names`` (stated in results)."""
    if not any(n in LIBRARY_ATTACK_NAMES for n in names):
        return {}

    return {n: LIBRARY_BUDGETS[n] for n in names if n in LIBRARY_BUDGETS}
