"""FLEEG-style split model: a per-device local module in front of a shared global module (issue 19).

FLEEG (Liu et al., Neural Networks 2024) gives each dataset its own temporal + spatial convolution
and shares the rest. :class:`FleegEEGNet` is EEGNet regrouped that way, with no new layer:

* ``local`` = EEGNet's input layers: temporal conv (F1 filters, kernel fs/2) -> BN -> depthwise
  spatial conv over the device's channels (F1*D spatial filters) -> BN. Its output,
  ``(batch, F1*D, 1, T)``, no longer depends on the montage: it is the shared embedding.
* ``body`` + ``classifier`` = the rest of EEGNet (pool, separable conv, BN, pool, linear): the
  global module every device shares.

Why temporal + spatial convolution rather than a learned channel-to-embedding projection: the
spatial stage of EEGNet already *is* a learned projection from the montage to F1*D virtual
channels (spatial filters, as CSP would learn), so the split costs nothing and a one-device model
is exactly EEGNet (same modules, same initialisation order, same function; a test pins it). A
separate projection layer in front of a shared EEGNet would add parameters and put a montage-free
"virtual montage" in front of a spatial conv that then has to be shared across devices.

The state-dict keys of the local module start with ``local.``; a hierarchical strategy
(``group_keys="local."``, :mod:`neurofed.trainer.fl.algorithms.hierarchical`) aggregates them per device
profile and everything else over all clients. BatchNorm: ``bn_mode`` for the global part and
``local_bn_mode`` (default: the same) for the local part.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from neurofed.trainer.models.bn import BNMode, make_bn
from neurofed.trainer.models.eegnet import EEGNet

#: state-dict prefix of the per-device module
LOCAL_PREFIX = "local."


class FleegEEGNet(nn.Module):
    """EEGNet split into ``local`` (temporal + spatial conv, per device) and ``body``/``classifier`` (shared).

    Parameters
    ----------
    n_channels, n_classes, n_times : int
    sfreq : float
    bn_mode : {"standard", "batch_specific"}
        BN of the global module.
    local_bn_mode : {"standard", "batch_specific"} or None
        BN of the local module (None: ``bn_mode``).
    """

    #: FedFA's augmentation points: EEGNet's (its pooling layers, now in ``body``)
    FEATURE_BLOCKS: ClassVar[tuple[str, ...]] = ("body.0.1", "body.3.1")

    def __init__(
        self, n_channels: int, n_classes: int, n_times: int, sfreq: float,
        bn_mode: BNMode = "batch_specific", *, local_bn_mode: BNMode | None = None, **eegnet_kwargs,
    ) -> None:
        super().__init__()
        net = EEGNet(n_channels, n_classes, n_times, sfreq, bn_mode, **eegnet_kwargs)
        self.n_channels, self.n_classes, self.n_times, self.sfreq = n_channels, n_classes, n_times, sfreq
        lbn = local_bn_mode or bn_mode
        bn_t, bn_s = net.bnorm_temporal, net.bnorm_1
        if lbn != bn_mode:
            bn_t, bn_s = make_bn(bn_t.num_features, lbn), make_bn(bn_s.num_features, lbn)
        self.local = nn.Sequential(net.temporal, bn_t, net.conv_spatial, bn_s)
        self.body = nn.Sequential(net.pool_1, net.conv_separable, net.bnorm_2, net.pool_2, nn.Flatten(1))
        self.classifier = net.classifier

    def features(self, x: Tensor) -> Tensor:
        """Flattened features before the classifier (as EEGNet's)."""
        return self.body(self.local(x.unsqueeze(1)))

    def forward(self, x: Tensor) -> Tensor:
        """``x``: (batch, channels, times) -> logits (batch, classes)."""
        return self.classifier(self.features(x))
