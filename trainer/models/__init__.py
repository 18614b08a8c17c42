"""EEG models with a selectable BatchNorm mode, and BN key helpers."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from neurofed.trainer.models.bn import (
    BN_MODES,
    bn_mode_of,
    bn_modules,
    bn_state_keys,
    float_state_keys,
    make_bn,
)
from neurofed.trainer.models.classical import CSPLDA, TangentLDA
from neurofed.trainer.models.deep import DeepConvNet
from neurofed.trainer.models.eegnet import CroppedEEGNet, EEGNet
from neurofed.trainer.models.fleeg import LOCAL_PREFIX, FleegEEGNet
from neurofed.trainer.models.fleeg_proj import FleegFixedMapEEGNet, FleegProjEEGNet
from neurofed.trainer.models.itnet import EEGITNet
from neurofed.trainer.models.shallow import ShallowConvNet

MODELS: dict[str, type[nn.Module]] = {"eegnet": EEGNet, "eegnet_crop": CroppedEEGNet, "shallow": ShallowConvNet, "deep": DeepConvNet,
                                      "itnet": EEGITNet,
                                      "fleeg_eegnet": FleegEEGNet, "fleeg_proj_eegnet": FleegProjEEGNet,
                                      "fleeg_fixmap_eegnet": FleegFixedMapEEGNet,
                                      # fitted from summed statistics (fed-csp-lda, fed-tangent), not by SGD
                                      "csp_lda": CSPLDA, "tangent_lda": TangentLDA}
#: every model name (the wire schema and the coordinator's config accept exactly these)
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)
#: models with a per-device module ``local.*`` (a mixed-device federation aggregates it per profile)
PER_DEVICE_MODELS: tuple[str, ...] = ("fleeg_eegnet", "fleeg_proj_eegnet", "fleeg_fixmap_eegnet")


def build_model(
    name: str, n_channels: int, n_classes: int, n_times: int, sfreq: float, bn_mode: str = "batch_specific",
    *, ch_names: Sequence[str] | None = None, **kwargs: object,
) -> nn.Module:
    """Build a model by name (``eegnet``, ``shallow``, ``deep``, ``fleeg_eegnet``, ``fleeg_proj_eegnet``,
    ``fleeg_fixmap_eegnet``) for a signal shape.

    ``ch_names`` (the input's channel labels) is passed on only to models that need it
    (``NEEDS_CH_NAMES``: ``fleeg_proj_eegnet`` and ``fleeg_fixmap_eegnet``, whose channel map is
    initialised from the electrode positions) and ignored otherwise. ``kwargs`` go to the model's
    constructor (e.g. ``local_bn_mode`` of ``fleeg_eegnet``).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(MODELS)}")
    cls = MODELS[name]
    if getattr(cls, "NEEDS_CH_NAMES", False):
        if not ch_names:
            raise ValueError(f"model {name} needs the input's channel names (ch_names) to build its channel map")
        kwargs["ch_names"] = tuple(ch_names)
    return cls(n_channels, n_classes, n_times, sfreq, bn_mode, **kwargs)  # type: ignore[call-arg]


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = [
    "BN_MODES",
    "CSPLDA",
    "CroppedEEGNet",
    "TangentLDA",
    "LOCAL_PREFIX",
    "MODELS",
    "MODEL_NAMES",
    "PER_DEVICE_MODELS",
    "DeepConvNet",
    "EEGITNet",
    "EEGNet",
    "FleegEEGNet",
    "FleegFixedMapEEGNet",
    "FleegProjEEGNet",
    "ShallowConvNet",
    "bn_mode_of",
    "bn_modules",
    "bn_state_keys",
    "build_model",
    "count_parameters",
    "float_state_keys",
    "make_bn",
]
