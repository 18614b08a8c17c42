"""EEG-ITNet (Salami, Andreu-Perez, Gillmeister, IEEE Access 10, 2022): an inception block of temporal filters at three
scales, each followed by its own depthwise spatial filter, then a temporal convolutional network (TCN) of dilated
causal convolutions with residual connections, then a pointwise dimension reduction and a linear classifier.

Issue 57's "model capacity" lever: a larger receptive field and multi-scale filters beside EEGNet, with the same kind
of layers (convolutions, BatchNorm in either mode, ELU, average pooling), so it trains in both engines and exports to
the standalone ONNX graph like EEGNet. Sizes follow the paper (branch filters 2/4/8, TCN of 4 blocks with kernel 4
and dilations 1/2/4/8, 28 reduction filters, dropout 0.4); the branch kernels were 16/32/64 samples at 128 Hz, i.e.
0.125/0.25/0.5 s, and are kept in seconds here (10/20/40 samples at 80 Hz).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from neurofed.trainer.errors import ModelConfigError
from neurofed.trainer.models.bn import BNMode, make_bn


def _same_pad(kernel: int) -> nn.ZeroPad2d:
    left = (kernel - 1) // 2
    return nn.ZeroPad2d((left, kernel - 1 - left, 0, 0))


class _Branch(nn.Module):
    """Temporal conv (F filters, 'same') -> BN -> depthwise spatial conv -> BN -> ELU."""

    #: its forward only calls its children (the vectorised engine may train it; neurofed.trainer.fl.vectorised)
    PURE_FORWARD = True

    def __init__(self, n_channels: int, filters: int, kernel: int, bn_mode: BNMode) -> None:
        super().__init__()
        self.temporal = nn.Sequential(_same_pad(kernel), nn.Conv2d(1, filters, (1, kernel), bias=False))
        self.bnorm_temporal = make_bn(filters, bn_mode)
        self.spatial = nn.Conv2d(filters, filters, (n_channels, 1), groups=filters, bias=False)
        self.bnorm_spatial = make_bn(filters, bn_mode)
        self.act = nn.ELU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.bnorm_spatial(self.spatial(self.bnorm_temporal(self.temporal(x)))))


class _TCNBlock(nn.Module):
    """Two dilated causal convolutions (kernel k), each -> BN -> ELU -> dropout, plus the input (residual)."""

    PURE_FORWARD = True  # as _Branch's

    def __init__(self, filters: int, kernel: int, dilation: int, bn_mode: BNMode, dropout: float) -> None:
        super().__init__()
        pad = dilation * (kernel - 1)
        self.conv_1 = nn.Sequential(nn.ZeroPad2d((pad, 0, 0, 0)),
                                    nn.Conv2d(filters, filters, (1, kernel), dilation=(1, dilation), bias=False))
        self.bnorm_1 = make_bn(filters, bn_mode)
        self.act_1 = nn.Sequential(nn.ELU(), nn.Dropout(dropout))
        self.conv_2 = nn.Sequential(nn.ZeroPad2d((pad, 0, 0, 0)),
                                    nn.Conv2d(filters, filters, (1, kernel), dilation=(1, dilation), bias=False))
        self.bnorm_2 = make_bn(filters, bn_mode)
        self.act_2 = nn.Sequential(nn.ELU(), nn.Dropout(dropout))

    def forward(self, x: Tensor) -> Tensor:
        y = self.act_1(self.bnorm_1(self.conv_1(x)))
        return x + self.act_2(self.bnorm_2(self.conv_2(y)))


class EEGITNet(nn.Module):
    """EEG-ITNet with a selectable BatchNorm mode.

    Parameters
    ----------
    n_channels, n_classes, n_times : int
    sfreq : float
        Sampling rate: the inception kernels are 0.125, 0.25 and 0.5 s long.
    bn_mode : {"standard", "batch_specific"}
    dropout : float
        Dropout probability (0.4, the paper's).
    """

    BRANCHES = ((2, 0.125), (4, 0.25), (8, 0.5))  # (filters, kernel in seconds)

    def __init__(self, n_channels: int, n_classes: int, n_times: int, sfreq: float,
                 bn_mode: BNMode = "batch_specific", *, dropout: float = 0.4) -> None:
        super().__init__()
        if n_times < 16:
            raise ModelConfigError(f"EEG-ITNet needs at least 16 samples per trial (pooling 4x4), got {n_times}")
        self.n_channels, self.n_classes, self.n_times, self.sfreq = n_channels, n_classes, n_times, sfreq
        self.branches = nn.ModuleList(_Branch(n_channels, f, max(2, int(round(s * sfreq))), bn_mode)
                                      for f, s in self.BRANCHES)
        width = sum(f for f, _ in self.BRANCHES)
        self.pool_1 = nn.Sequential(nn.AvgPool2d((1, 4)), nn.Dropout(dropout))
        self.tcn = nn.Sequential(*(_TCNBlock(width, 4, d, bn_mode, dropout) for d in (1, 2, 4, 8)))
        self.reduce = nn.Conv2d(width, 2 * width, (1, 1), bias=False)
        self.bnorm_reduce = make_bn(2 * width, bn_mode)
        self.pool_2 = nn.Sequential(nn.ELU(), nn.AvgPool2d((1, 4)), nn.Dropout(dropout))
        self.classifier = nn.Linear(2 * width * ((n_times // 4) // 4), n_classes)

    def features(self, x: Tensor) -> Tensor:
        """Flattened features before the classifier."""
        x = x.unsqueeze(1)
        x = torch.cat([b(x) for b in self.branches], dim=1)
        x = self.tcn(self.pool_1(x))
        x = self.pool_2(self.bnorm_reduce(self.reduce(x)))
        return x.flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        """``x``: (batch, channels, times) -> logits (batch, classes)."""
        return self.classifier(self.features(x))
