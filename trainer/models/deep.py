"""DeepConvNet (Schirrmeister et al., 2017) with a selectable BatchNorm mode."""

from __future__ import annotations

from torch import Tensor, nn

from neurofed.trainer.errors import ModelConfigError
from neurofed.trainer.models.bn import BNMode, make_bn


class DeepConvNet(nn.Module):
    """Four conv-pool blocks (25, 50, 100, 200 filters, kernel 10, max-pool 3) -> linear.

    Parameters
    ----------
    n_channels, n_classes, n_times : int
    sfreq : float
    bn_mode : {"standard", "batch_specific"}
    dropout : float
    """

    def __init__(
        self, n_channels: int, n_classes: int, n_times: int, sfreq: float,
        bn_mode: BNMode = "batch_specific", *, dropout: float = 0.5,
    ) -> None:
        super().__init__()
        t = n_times
        for _ in range(4):
            t = (t - 9) // 3
            if t < 1:
                raise ModelConfigError(
                    f"DeepConvNet needs at least 441 samples per trial (four conv-10/pool-3 blocks), got {n_times}; "
                    "keep the original rate (e.g. 160 Hz x 4 s = 640) or use EEGNet/ShallowConvNet"
                )
        self.n_channels, self.n_classes, self.n_times, self.sfreq = n_channels, n_classes, n_times, sfreq
        self.block1 = nn.Sequential(
            nn.Conv2d(1, 25, (1, 10)), nn.Conv2d(25, 25, (n_channels, 1), bias=False),
        )
        self.bnorm_1 = make_bn(25, bn_mode)
        self.pool1 = nn.Sequential(nn.ELU(), nn.MaxPool2d((1, 3)))
        blocks, bns = [], []
        for cin, cout in ((25, 50), (50, 100), (100, 200)):
            blocks.append(nn.Sequential(nn.Dropout(dropout), nn.Conv2d(cin, cout, (1, 10), bias=False)))
            bns.append(make_bn(cout, bn_mode))
        self.blocks = nn.ModuleList(blocks)
        self.bnorms = nn.ModuleList(bns)
        self.pool = nn.Sequential(nn.ELU(), nn.MaxPool2d((1, 3)))
        self.classifier = nn.Linear(200 * t, n_classes)

    def features(self, x: Tensor) -> Tensor:
        x = self.pool1(self.bnorm_1(self.block1(x.unsqueeze(1))))
        for conv, bn in zip(self.blocks, self.bnorms):
            x = self.pool(bn(conv(x)))
        return x.flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
