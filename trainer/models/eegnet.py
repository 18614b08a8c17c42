"""EEGNet (Lawhern et al., 2018) with a selectable BatchNorm mode, and its cropped variant."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from neurofed.trainer.errors import ModelConfigError
from neurofed.trainer.models.bn import BNMode, make_bn


def _same_pad(kernel: int) -> nn.ZeroPad2d:
    """Explicit 'same' padding along time (works for even kernels and exports cleanly to ONNX)."""
    left = (kernel - 1) // 2
    return nn.ZeroPad2d((left, kernel - 1 - left, 0, 0))


class EEGNet(nn.Module):
    """EEGNet-F1,D: temporal conv -> depthwise spatial conv -> separable conv -> linear.

    Parameters
    ----------
    n_channels : int
        EEG channels.
    n_classes : int
    n_times : int
        Samples per trial.
    sfreq : float
        Sampling rate; the temporal kernel is ``sfreq / 2`` samples (as in FedBS).
    bn_mode : {"standard", "batch_specific"}
    F1, D, F2 : int
        Temporal filters, depth multiplier, pointwise filters (8, 2, 16).
    dropout : float
        Dropout probability (0.5).
    """

    #: where FedFA's feature augmentation acts (:mod:`neurofed.trainer.fl.algorithms.fedfa`): the end of each conv block,
    #: after ELU and average pooling, before dropout (a plain class attribute: the state dict is unchanged)
    FEATURE_BLOCKS: ClassVar[tuple[str, ...]] = ("pool_1.1", "pool_2.1")

    def __init__(
        self,
        n_channels: int,
        n_classes: int,
        n_times: int,
        sfreq: float,
        bn_mode: BNMode = "batch_specific",
        *,
        F1: int = 8,
        D: int = 2,
        F2: int = 16,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        if n_times < 32:
            raise ModelConfigError(f"EEGNet needs at least 32 samples per trial (pooling 4x8), got {n_times}")
        k = max(2, int(round(sfreq / 2)))
        self.n_channels, self.n_classes, self.n_times, self.sfreq = n_channels, n_classes, n_times, sfreq
        self.temporal = nn.Sequential(_same_pad(k), nn.Conv2d(1, F1, (1, k), bias=False))
        self.bnorm_temporal = make_bn(F1, bn_mode)
        self.conv_spatial = nn.Conv2d(F1, F1 * D, (n_channels, 1), groups=F1, bias=False)
        self.bnorm_1 = make_bn(F1 * D, bn_mode)
        self.pool_1 = nn.Sequential(nn.ELU(), nn.AvgPool2d((1, 4)), nn.Dropout(dropout))
        self.conv_separable = nn.Sequential(
            _same_pad(16),
            nn.Conv2d(F1 * D, F1 * D, (1, 16), groups=F1 * D, bias=False),
            nn.Conv2d(F1 * D, F2, (1, 1), bias=False),
        )
        self.bnorm_2 = make_bn(F2, bn_mode)
        self.pool_2 = nn.Sequential(nn.ELU(), nn.AvgPool2d((1, 8)), nn.Dropout(dropout))
        self.classifier = nn.Linear(F2 * ((n_times // 4) // 8), n_classes)

    @staticmethod
    def head(classifier: nn.Module, z: Tensor) -> Tensor:
        """The classifier on the pooled feature sequence ``z`` (batch, F2, 1, positions) -> logits (batch, classes)
        (a static function of the classifier layer: the standalone graph's cached trunk calls it too)."""
        return classifier(z.flatten(1))

    def trunk(self, x: Tensor) -> Tensor:
        """(batch, channels, times) -> pooled feature sequence (batch, F2, 1, positions)."""
        x = x.unsqueeze(1)
        x = self.bnorm_temporal(self.temporal(x))
        x = self.pool_1(self.bnorm_1(self.conv_spatial(x)))
        return self.pool_2(self.bnorm_2(self.conv_separable(x)))

    def features(self, x: Tensor) -> Tensor:
        """Flattened features before the classifier (MOON uses them as its representation)."""
        return self.trunk(x).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        """``x``: (batch, channels, times) -> logits (batch, classes)."""
        return self.head(self.classifier, self.trunk(x))


class CroppedEEGNet(EEGNet):
    """EEGNet with cropped training and decoding (Schirrmeister et al., Hum. Brain Mapp. 2017): the classifier sees a
    crop of the trial's feature sequence, slid over the whole trial; the trial's output is the mean of the crops'
    log-probabilities.

    The trunk is EEGNet's (temporal conv -> depthwise spatial conv -> separable conv, pooled 4 x 8 = 32 samples a
    position). The linear classifier becomes a convolution over ``crop`` consecutive positions (``crop =
    round(crop_fraction * positions)``; at 4 s and 80 Hz: 6 of 10 positions, a 2.4 s crop plus the trunk's receptive
    field), applied at every offset (5 crops, 0.4 s apart). The output is ``mean_j log_softmax(z_j)`` over the crops
    ``j``: softmax of it is the crops' normalised geometric mean (a product of experts), so the model still returns
    logits and every training loss, attack and adaptation works on it unchanged. Cross-entropy on it equals the mean
    of the crops' own cross-entropies (dense cropped training, each crop a training example) plus ``-log Z >= 0``,
    ``Z = sum_c exp(mean_j log p_j(c))`` (1 when the crops agree): a consistency term. The cost a window is EEGNet's
    (one trunk pass; the head is a few hundred multiply-adds more), so the deployed graph stays one standalone model.

    Parameters
    ----------
    crop_fraction : float
        Crop length as a fraction of the trial's feature positions (0.6); 1.0 is one crop (EEGNet with a log-softmax
        output).
    Other parameters as :class:`EEGNet`.
    """

    def __init__(self, *args: Any, crop_fraction: float = 0.6, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not 0.0 < crop_fraction <= 1.0:
            raise ModelConfigError(f"crop_fraction must be in (0, 1], got {crop_fraction}")
        positions = (self.n_times // 4) // 8
        self.crop = max(1, int(round(crop_fraction * positions)))
        self.n_crops = positions - self.crop + 1
        self.classifier = nn.Conv2d(self.classifier.in_features // positions, self.n_classes, (1, self.crop))

    @staticmethod
    def head(classifier: nn.Module, z: Tensor) -> Tensor:
        """The crops' mean log-probabilities: the classifier at every crop offset of ``z`` (batch, F2, 1, positions)
        -> (batch, classes, 1, n_crops) -> log-softmax over classes -> mean over crops."""
        return torch.log_softmax(classifier(z), dim=1).mean(dim=(2, 3))
