"""Physics-initialised FLEEG variant: a per-device channel map onto a common montage, then the WHOLE
EEGNet shared by every device (issue 19).

:class:`~neurofed.trainer.models.fleeg.FleegEEGNet` keeps EEGNet's spatial filters per device profile, so each
profile's filters are learned from its few training subjects and generalise badly to new subjects.
The standard practice for cross-montage EEG is the reverse split:

* ``local`` = a linear channel map without bias, ``(C_device) -> (C_common)``, initialised with the
  spherical-spline interpolation matrix from the device's electrodes to the common montage
  (:func:`neurofed.trainer.data.profiles.interpolation_matrix`: one-hot rows for channels the device has,
  spline weights for the others) and trainable. Its only state-dict key is ``local.weight``, so a
  hierarchical strategy (``--group-keys local.``) aggregates it per device profile.
* everything else = a plain EEGNet over the common montage (default: the project's 21 sensorimotor
  channels, ``PreprocessConfig`` preset ``sensorimotor21``), shared by all devices: temporal conv,
  spatial conv, separable conv, BN and classifier are learned from every subject.

The model IS an :class:`~neurofed.trainer.models.eegnet.EEGNet` over the common channels (same module names,
same state-dict keys, same random draws for a seed: the map is deterministic) with the map in front,
so on a device that records all the common channels (map = channel selection) it computes exactly
what EEGNet computes on those channels (a test pins it). For ONNX the map is one MatMul.

:class:`FleegFixedMapEEGNet` (``fleeg_fixmap_eegnet``) is the same model with the map frozen at its
spline initialisation (``local.weight`` does not require a gradient, so no optimiser, SAM/AWP step or
proximal term touches it and the per-profile average of identical maps returns it bit-exactly): the
federation ``--profile-channels interpolate`` runs (the fixed map applied to the data, one plain EEGNet)
as a deployable model that takes each headset's own channels (a test pins that the two train alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from neurofed.trainer.data.config import SENSORIMOTOR_21
from neurofed.trainer.data.profiles import interpolation_matrix
from neurofed.trainer.models.bn import BNMode
from neurofed.trainer.models.eegnet import EEGNet
from neurofed.trainer.models.fleeg import LOCAL_PREFIX


class ChannelMap(nn.Module):
    """``x -> W @ x`` over the channel axis, ``W`` of shape (n_out, n_in), no bias.

    Parameters
    ----------
    weight : Tensor, shape (n_out, n_in)
        Initial map (copied; trainable).
    """

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        if weight.ndim != 2:
            raise ValueError(f"channel map must be 2-D (n_out, n_in), got shape {tuple(weight.shape)}")
        self.weight = nn.Parameter(weight.detach().clone().float())

    def forward(self, x: Tensor) -> Tensor:
        """``x``: (batch, n_in, times) -> (batch, n_out, times)."""
        return torch.matmul(self.weight, x)


class FleegProjEEGNet(EEGNet):
    """A per-device channel map (``local``) onto ``common_channels``, then EEGNet shared by all devices.

    Parameters
    ----------
    n_channels : int
        The device's channel count (must equal ``len(ch_names)``).
    n_classes, n_times : int
    sfreq : float
    bn_mode : {"standard", "batch_specific"}
    ch_names : sequence of str
        The device's channel labels in input order (10-05 names); :func:`neurofed.trainer.models.build_model`
        passes the subject's / checkpoint's ``ch_names``.
    common_channels : sequence of str
        The shared montage (default: the 21 sensorimotor channels).
    **eegnet_kwargs
        EEGNet's hyper-parameters (F1, D, F2, dropout).
    """

    #: build_model must pass the device's channel names
    NEEDS_CH_NAMES = True
    #: whether the channel map is trained (False: :class:`FleegFixedMapEEGNet`)
    TRAIN_MAP: ClassVar[bool] = True

    def __init__(
        self, n_channels: int, n_classes: int, n_times: int, sfreq: float,
        bn_mode: BNMode = "batch_specific", *, ch_names: Sequence[str],
        common_channels: Sequence[str] = SENSORIMOTOR_21, **eegnet_kwargs,
    ) -> None:
        ch_names, common = tuple(str(c) for c in ch_names), tuple(str(c) for c in common_channels)
        if len(ch_names) != n_channels:
            raise ValueError(f"fleeg_proj_eegnet: {len(ch_names)} channel names for {n_channels} input channels")
        super().__init__(len(common), n_classes, n_times, sfreq, bn_mode, **eegnet_kwargs)
        self.n_channels = n_channels  # the input's (device's) channels; EEGNet runs over len(common)
        self.ch_names, self.common_channels = ch_names, common
        self.local = ChannelMap(torch.from_numpy(interpolation_matrix(ch_names, common)))
        self.local.weight.requires_grad_(self.TRAIN_MAP)

    def trunk(self, x: Tensor) -> Tensor:
        """EEGNet's pooled feature sequence of the mapped signal (``features`` and ``forward`` go through it)."""
        return super().trunk(self.local(x))


class FleegFixedMapEEGNet(FleegProjEEGNet):
    """:class:`FleegProjEEGNet` with the channel map frozen at the spherical-spline interpolation matrix:
    EEGNet over the common montage, deployable on each device's own channels (``fleeg_fixmap_eegnet``)."""

    TRAIN_MAP: ClassVar[bool] = False


assert LOCAL_PREFIX == "local."  # the map's key, local.weight, is what --group-keys local. aggregates per profile
