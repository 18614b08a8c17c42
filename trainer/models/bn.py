"""BatchNorm modes and the one answer to "which state-dict keys are BatchNorm" (by module type)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

BNMode = Literal["standard", "batch_specific"]
BN_MODES: tuple[str, ...] = ("standard", "batch_specific")


def make_bn(num_features: int, bn_mode: BNMode, **kwargs: float) -> nn.BatchNorm2d:
    """A BatchNorm2d in the requested mode.

    ``standard`` keeps running statistics (used at eval); ``batch_specific`` has none
    (``track_running_stats=False``): it always normalises with the current batch's statistics,
    in training and at test time (FedBS's local batch-specific BN).
    """
    if bn_mode not in BN_MODES:
        raise ValueError(f"bn_mode must be one of {BN_MODES}, got {bn_mode!r}")
    return nn.BatchNorm2d(num_features, track_running_stats=(bn_mode == "standard"), **kwargs)


def bn_modules(model: nn.Module) -> dict[str, _BatchNorm]:
    """Every BatchNorm module of ``model`` by qualified name, chosen by type, never by name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, _BatchNorm)}


def bn_state_keys(model: nn.Module) -> set[str]:
    """State-dict keys that belong to BatchNorm modules (affine and, if any, running statistics)."""
    keys: set[str] = set()
    state = model.state_dict()
    for name in bn_modules(model):
        prefix = f"{name}." if name else ""
        keys |= {k for k in state if k.startswith(prefix) and "." not in k[len(prefix):]}
    return keys


def bn_mode_of(model: nn.Module) -> str:
    """``batch_specific`` if every BN layer lacks running stats, ``standard`` if all keep them."""
    mods = list(bn_modules(model).values())
    if not mods:
        return "none"
    tracking = {m.track_running_stats for m in mods}
    if len(tracking) > 1:
        return "mixed"
    return "standard" if tracking.pop() else "batch_specific"


def float_state_keys(model: nn.Module) -> list[str]:
    """Keys of floating-point tensors (excludes integer counters like ``num_batches_tracked``)."""
    return [k for k, v in model.state_dict().items() if torch.is_floating_point(v)]
