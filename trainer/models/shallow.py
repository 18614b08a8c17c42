"""ShallowConvNet (Schirrmeister et al., 2017) with a selectable BatchNorm mode."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from neurofed.trainer.errors import ModelConfigError
from neurofed.trainer.models.bn import BNMode, make_bn


class ShallowConvNet(nn.Module):
    """Temporal conv (40 x 25) -> spatial conv (40) -> BN -> square -> mean pool (75/15) -> log -> linear.

    Parameters
    ----------
    n_channels, n_classes, n_times : int
    sfreq : float
        Recorded for metadata; kernel sizes are the paper's sample counts.
    bn_mode : {"standard", "batch_specific"}
    dropout : float
    """

    def __init__(
        self, n_channels: int, n_classes: int, n_times: int, sfreq: float,
        bn_mode: BNMode = "batch_specific", *, n_filters: int = 40, dropout: float = 0.5,
    ) -> None:
        super().__init__()
        out_t = (n_times - 25 + 1 - 75) // 15 + 1
        if out_t < 1:
            raise ModelConfigError(
                f"ShallowConvNet needs at least 99 samples per trial, got {n_times}; lengthen the window or raise the rate"
            )
        self.n_channels, self.n_classes, self.n_times, self.sfreq = n_channels, n_classes, n_times, sfreq
        self.conv_time = nn.Conv2d(1, n_filters, (1, 25))
        self.conv_spat = nn.Conv2d(n_filters, n_filters, (n_channels, 1), bias=False)
        self.bnorm = make_bn(n_filters, bn_mode)
        self.pool = nn.AvgPool2d((1, 75), stride=(1, 15))
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(n_filters * out_t, n_classes)

    def features(self, x: Tensor) -> Tensor:
        x = self.bnorm(self.conv_spat(self.conv_time(x.unsqueeze(1))))
        x = torch.log(torch.clamp(self.pool(x * x), min=1e-6))
        return self.drop(x).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
