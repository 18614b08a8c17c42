"""PGD against FGSM: budgets, seeded random start, and strength where FGSM is known to be optimal."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from neurofed.trainer.attacks import channel_budget, fgsm, pgd
from neurofed.trainer.models import build_model


def _data(n=8, c=4, t=64, seed=0):
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.standard_normal((n, c, t)).astype(np.float32)) * torch.tensor([1.0, 5.0, 0.2, 1.0])[:, None]
    return x, torch.as_tensor(rng.integers(0, 2, n))


class Linear(nn.Module):
    """Logits linear in the input: the L-inf loss maximiser per sample is FGSM's corner."""

    def __init__(self, c=4, t=64):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(c * t, 2)

    def forward(self, x):
        return self.fc(x.flatten(1))


def test_pgd_reaches_fgsm_on_a_linear_model_and_stays_in_budget():
    m, (x, y) = Linear(), _data()
    xf, xp = fgsm(m, x, y, 0.05), pgd(m, x, y, 0.05, steps=10, seed=3)
    b = channel_budget(x, 0.05)
    assert torch.all((xp - x).abs() <= b * (1 + 1e-5))
    # for logits linear in x, each sample's loss is maximised at the sign-of-gradient corner FGSM takes
    lf = F.cross_entropy(m(xf), y, reduction="none")
    lp = F.cross_entropy(m(xp), y, reduction="none")
    assert torch.all(lp >= lf - 1e-4)
    torch.testing.assert_close(xp, xf, rtol=0, atol=1e-5 * float(b.max()) + 1e-6)


def test_pgd_random_start_is_seeded_and_attacks_a_network():
    torch.manual_seed(0)
    m = build_model("eegnet", 4, 2, 64, 32.0, "batch_specific").eval()
    x, y = _data()
    a, b = pgd(m, x, y, 0.1, steps=3, seed=1), pgd(m, x, y, 0.1, steps=3, seed=1)
    assert torch.equal(a, b)
    assert not torch.equal(a, pgd(m, x, y, 0.1, steps=3, seed=2))
    with torch.no_grad():
        assert F.cross_entropy(m(a), y) > F.cross_entropy(m(x), y)  # PGD raises the loss
    # without a random start and with one step of size eps, PGD is FGSM
    torch.testing.assert_close(pgd(m, x, y, 0.1, steps=1, step_size=0.1, random_start=False), fgsm(m, x, y, 0.1))


def test_library_attacks_without_art_name_the_missing_library(monkeypatch):
    """Without ART, the torch path and the ONNX query path both raise AttackUnavailable naming the extra."""
    import sys

    import pytest

    from neurofed.export.evaluate import query_attack_batches
    from neurofed.trainer.attacks import ATTACKS, AttackUnavailable

    monkeypatch.setitem(sys.modules, "art", None)  # import art -> ImportError
    monkeypatch.delitem(sys.modules, "neurofed.trainer.art_attacks", raising=False)
    model = build_model("eegnet", 4, 2, 80, 80.0, "batch_specific").eval()
    x, y = torch.zeros(2, 4, 80), torch.tensor([0, 1])
    with pytest.raises(AttackUnavailable, match=r"square.*neurofed\[attacks\]"):
        ATTACKS["square"](model, x, y, 0.05)
    with pytest.raises(AttackUnavailable, match=r"hsj.*neurofed\[attacks\]"):
        query_attack_batches(None, x.numpy(), y.numpy(), "hsj", 0.05, batch_size=8)
