"""Models: parameter counts, BN modes, BN keys by module type, clear shape errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from neurofed.trainer.errors import ModelConfigError
from neurofed.trainer.models import bn_mode_of, bn_state_keys, build_model, count_parameters

# (model, channels, times, sfreq) -> trainable parameters; EEGNet-8,2 at 64 ch x 640 samples:
# temporal 8*80 + spatial 16*64 + depthwise 16*16 + pointwise 16*16 + BN 2*(8+16+16) + linear 16*20*2+2 = 2898
PINNED = {
    ("eegnet", 64, 640, 160.0): 2898,
    ("eegnet", 21, 320, 80.0): 1570,
    ("shallow", 64, 640, 160.0): 106482,
    ("shallow", 21, 320, 80.0): 35922,
    ("itnet", 21, 320, 80.0): 8836,
    # EEGNet's trunk (1248) + a (1 x 6) convolution head over 6 of the 10 feature positions: 16*6*2+2 = 194
    ("eegnet_crop", 21, 320, 80.0): 1442,
    ("deep", 64, 640, 160.0): 304727,
}


@pytest.mark.parametrize("key", list(PINNED))
def test_parameter_counts_pinned(key):
    name, c, t, sf = key
    m = build_model(name, c, 2, t, sf, "batch_specific")
    assert count_parameters(m) == PINNED[key]
    assert m(torch.randn(3, c, t)).shape == (3, 2)


@pytest.mark.parametrize("name", ["eegnet", "eegnet_crop", "shallow", "deep", "itnet"])
def test_bn_modes(name):
    std = build_model(name, 22, 2, 640, 160.0, "standard")
    bs = build_model(name, 22, 2, 640, 160.0, "batch_specific")
    assert bn_mode_of(std) == "standard" and bn_mode_of(bs) == "batch_specific"
    assert any(k.endswith("running_mean") for k in bn_state_keys(std))
    assert not any("running" in k for k in bs.state_dict())
    assert bn_state_keys(bs) and all(k.endswith(("weight", "bias")) for k in bn_state_keys(bs))


def test_batch_specific_bn_uses_batch_statistics_at_eval():
    torch.manual_seed(0)
    m = build_model("eegnet", 8, 2, 256, 128.0, "batch_specific").eval()
    x = torch.randn(8, 8, 256)
    with torch.no_grad():
        alone = m(x[:4])
        mixed = m(torch.cat([x[:4], 5 * x[4:] + 3]))
    assert not torch.allclose(alone, mixed[:4])  # a trial's output depends on its batch
    std = build_model("eegnet", 8, 2, 256, 128.0, "standard").eval()
    with torch.no_grad():
        torch.testing.assert_close(std(x[:4]), std(torch.cat([x[:4], 5 * x[4:] + 3]))[:4])


def test_bn_keys_found_by_type_not_name():
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 1)
            self.zz_normaliser = nn.BatchNorm2d(2)  # no "bn" in the name
            self.bn_like_name = nn.Conv2d(2, 2, 1)  # "bn" in the name, not a BN

    keys = bn_state_keys(Odd())
    assert keys == {"zz_normaliser.weight", "zz_normaliser.bias", "zz_normaliser.running_mean",
                    "zz_normaliser.running_var", "zz_normaliser.num_batches_tracked"}


def test_too_short_input_is_a_clear_error():
    with pytest.raises(ModelConfigError, match="DeepConvNet needs at least 441 samples"):
        build_model("deep", 21, 2, 320, 80.0)
    with pytest.raises(ModelConfigError, match="ShallowConvNet needs at least 99"):
        build_model("shallow", 21, 2, 64, 16.0)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("resnet", 21, 2, 320, 80.0)


def test_cropped_eegnet_decodes_the_mean_of_its_crops():
    """eegnet_crop: each crop is the classifier on `crop` consecutive trunk positions; the output is the crops' mean
    log-probability, and cross-entropy on it is the crops' mean cross-entropy plus a non-negative consistency term."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    m = build_model("eegnet_crop", 21, 2, 320, 80.0, "standard").eval()
    assert (m.crop, m.n_crops) == (6, 5)
    x, y = torch.randn(4, 21, 320), torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        feats = m.trunk(x)  # (4, 16, 1, 10)
        w, b = m.classifier.weight.flatten(1), m.classifier.bias
        crops = [torch.log_softmax(feats[..., j:j + 6].flatten(1) @ w.T + b, 1) for j in range(5)]
        out = m(x)
    torch.testing.assert_close(out, torch.stack(crops).mean(0))
    crop_ce = torch.stack([F.nll_loss(c, y) for c in crops]).mean()
    assert F.cross_entropy(out, y) >= crop_ce - 1e-5
    # one crop over the whole trial: plain EEGNet's decision (log-softmax of its logits)
    one = build_model("eegnet_crop", 21, 2, 320, 80.0, "standard", crop_fraction=1.0)
    assert (one.crop, one.n_crops) == (10, 1)
    with pytest.raises(ModelConfigError, match="crop_fraction"):
        build_model("eegnet_crop", 21, 2, 320, 80.0, crop_fraction=0.0)
