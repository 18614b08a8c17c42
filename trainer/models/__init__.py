"""EEG models with a selectable BatchNorm mode, and BN key helpers."""

from __future__ import annotations

from torch import nn

from trainer.models.bn import BN_MODES, bn_mode_of, bn_modules, bn_state_keys, float_state_keys, make_bn
from trainer.models.deep import DeepConvNet
from trainer.models.eegnet import EEGNet
from trainer.models.fleeg import LOCAL_PREFIX, FleegEEGNet
from trainer.models.shallow import ShallowConvNet

MODELS: dict[str, type[nn.Module]] = {"eegnet": EEGNet, "shallow": ShallowConvNet, "deep": DeepConvNet,
                                      "fleeg_eegnet": FleegEEGNet}


def build_model(
    name: str, n_channels: int, n_classes: int, n_times: int, sfreq: float, bn_mode: str = "batch_specific",
    **kwargs: object,
) -> nn.Module:
    """Build a model by name (``eegnet``, ``shallow``, ``deep``, ``fleeg_eegnet``) for a signal shape.

    ``kwargs`` go to the model's constructor (e.g. ``local_bn_mode`` of ``fleeg_eegnet``).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(MODELS)}")
    return MODELS[name](n_channels, n_classes, n_times, sfreq, bn_mode, **kwargs)  # type: ignore[call-arg]


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = [
    "BN_MODES",
    "MODELS",
    "DeepConvNet",
    "EEGNet",
    "FleegEEGNet",
    "LOCAL_PREFIX",
    "ShallowConvNet",
    "bn_mode_of",
    "bn_modules",
    "bn_state_keys",
    "build_model",
    "count_parameters",
    "float_state_keys",
    "make_bn",
]
