"""FAL (PGD adversarial training on every client) and CT + AT: their rules and that they compose."""

from __future__ import annotations

import numpy as np
import torch

from neurofed.trainer.attacks import channel_budget
from neurofed.trainer.experiments.runner import run_centralised, run_federated
from neurofed.trainer.fl.algorithms import fal
from neurofed.trainer.fl.local import LocalConfig, train_local
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import build_model


def test_pgd_hook_stays_in_the_per_channel_budget_and_leaves_bn_untouched():
    torch.manual_seed(0)
    m = build_model("eegnet", 4, 2, 128, 64.0, "standard")
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.standard_normal((8, 4, 128)).astype(np.float32))
    y = torch.as_tensor(rng.integers(0, 2, 8))
    before = {k: v.clone() for k, v in m.state_dict().items() if "running" in k}
    xa = fal._PgdHook(0.03, 3).adversarial(m.train(), x, y)
    assert torch.all((xa - x).abs() <= channel_budget(x, 0.03) * (1 + 1e-5)) and not torch.equal(xa, x)
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())


def test_fal_and_ct_at_are_settings_of_the_registry(subjects4):
    st = get_strategy("fal")
    assert [type(c).__name__ for c in st.components] == ["PGDAT", "Robust"]
    ct_at = get_strategy("ct_at")
    assert ct_at.centralised and [type(c).__name__ for c in ct_at.components][0] == "FAT"
    # CT + AT trains on FGSM examples: it differs from CT from the first step, and both are reproducible
    sd = subjects4[0]
    cfg = LocalConfig(local_epochs=1)
    a = build_model("eegnet", sd.X.shape[1], 2, sd.X.shape[2], sd.sfreq, "standard")
    b = build_model("eegnet", sd.X.shape[1], 2, sd.X.shape[2], sd.sfreq, "standard")
    b.load_state_dict(a.state_dict())
    train_local(a, sd.X, sd.y, get_strategy("ct"), cfg, 0)
    train_local(b, sd.X, sd.y, ct_at, cfg, 0)
    assert any(not torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    m1, _ = run_centralised(subjects4[:2], "eegnet", ct_at, cfg, 1, 0)
    m2, _ = run_centralised(subjects4[:2], "eegnet", ct_at, cfg, 1, 0)
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    clients = {s.subject: s for s in subjects4}
    f1, _ = run_federated(clients, "eegnet", st, cfg, 1, 0.5, 0)
    f2, _ = run_federated(clients, "eegnet", st, cfg, 1, 0.5, 0)
    assert all(torch.equal(p, q) for p, q in zip(f1.parameters(), f2.parameters()))
