"""The ART wrapper reproduces NeuroFed's own attacks; library attacks stay in budget on batch-specific BN."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("art")

from neurofed.trainer.art_attacks import ScaledBatch, art_fgsm, art_pgd
from neurofed.trainer.attacks import ATTACKS, channel_budget, fgsm, pgd
from neurofed.trainer.evaluate import attacked_predict
from neurofed.trainer.models import build_model


def _small(bn_mode: str = "batch_specific"):
    torch.manual_seed(0)
    model = build_model("eegnet", 4, 2, 80, 80.0, bn_mode).eval()
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.standard_normal((8, 4, 80)).astype(np.float32)) * torch.tensor([1.0, 5.0, 0.2, 1.0])[:, None]
    return model, x, torch.as_tensor(rng.integers(0, 2, 8))


@pytest.mark.parametrize("bn_mode", ["standard", "batch_specific"])
def test_library_fgsm_equals_neurofed_fgsm(bn_mode):
    model, x, y = _small(bn_mode)
    ours, lib = fgsm(model, x, y, 0.05), art_fgsm(model, x, y, 0.05)
    torch.testing.assert_close(lib, ours, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert torch.equal(model(lib).argmax(1), model(ours).argmax(1))


def test_library_pgd_equals_neurofed_pgd_without_random_start():
    model, x, y = _small()
    ours = pgd(model, x, y, 0.05, steps=10, random_start=False)
    lib = art_pgd(model, x, y, 0.05, steps=10, random_start=False)
    torch.testing.assert_close(lib, ours, atol=1e-4, rtol=1e-4)


def test_wrapper_puts_queried_subsets_in_their_batch_places():
    model, x, _ = _small()
    w = ScaledBatch(model, x)
    z = torch.as_tensor(w.to_z(x))
    assert z.shape == (8, 1, 16, 20)
    with torch.no_grad():
        full = model(x)
        torch.testing.assert_close(w(z), full, atol=1e-5, rtol=1e-5)
        # a subset in another order, and one trial queried twice: each row scored inside the clean batch
        sub = z[[5, 2, 2]]
        torch.testing.assert_close(w(sub), full[[5, 2, 2]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attack", ["square", "hsj", "autoattack"])
def test_library_attacks_stay_in_the_channel_budget(attack, monkeypatch):
    from neurofed.trainer import art_attacks

    monkeypatch.setitem(art_attacks.LIBRARY_BUDGETS, "square", {"queries": 20, "restarts": 1, "p_init": 0.8})
    monkeypatch.setitem(art_attacks.LIBRARY_BUDGETS, "hsj", {"max_iter": 2, "max_eval": 20, "init_eval": 10})
    monkeypatch.setitem(art_attacks.LIBRARY_BUDGETS, "autoattack", {"apgd_iter": 5, "square_queries": 10})
    model, x, y = _small()
    xa = ATTACKS[attack](model, x, y, 0.1, seed=0)
    assert xa.shape == x.shape
    assert torch.all((xa - x).abs() <= channel_budget(x, 0.1) * (1 + 1e-4) + 1e-6)
    pred = attacked_predict(model, x.numpy(), y.numpy(), attack, 0.1, batch_size=8)
    assert pred.shape == (8,)


def test_budgets_of_library_attacks_go_into_results():
    from neurofed.trainer.art_attacks import LIBRARY_BUDGETS
    from neurofed.trainer.attacks import attack_budgets
    from neurofed.trainer.experiments.simulate import SimConfig, summarise

    assert attack_budgets(["fgsm", "pgd"]) == {}
    cfg = SimConfig(algorithm="fedavg", subjects=[1, 2], attacks=[["pgd", 0.03], ["square", 0.05]])
    job = {"fold": 0, "seed": 0, "per_subject": {"S001": {"bca": 0.6, "square@0.05": 0.5}}, "curve": [],
           "seconds": 1.0, "data_hashes": {}}
    assert summarise(cfg, [job])["attack_budgets"] == {"square": LIBRARY_BUDGETS["square"]}


def test_hsj_leaves_trials_the_model_already_gets_wrong_as_they_are(monkeypatch):
    """HopSkipJump's untargeted goal is "another label than the model's": on a wrong trial that is the right one."""
    from neurofed.trainer import art_attacks

    monkeypatch.setitem(art_attacks.LIBRARY_BUDGETS, "hsj", {"max_iter": 2, "max_eval": 20, "init_eval": 10})
    _, x, _ = _small()
    torch.manual_seed(1)  # a per-trial model: with batch-specific BN the attacked trials move the others' outputs
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4 * 80, 2)).eval()
    with torch.no_grad():
        pred = model(x).argmax(1)
    assert len(set(pred.tolist())) == 2  # both labels present, so every trial has a start point
    y = pred.clone()
    wrong = torch.tensor([0, 3, 6])
    y[wrong] = 1 - y[wrong]
    xa = art_attacks.hsj(model, x, y, 0.5, seed=0)
    torch.testing.assert_close(xa[wrong], x[wrong], atol=1e-6, rtol=1e-6)  # up to the std-scaling round trip
    with torch.no_grad():
        assert torch.all(model(xa)[wrong].argmax(1) != y[wrong])  # still wrong: no attack made them right
    right = torch.tensor([i for i in range(8) if i not in wrong.tolist()])
    assert torch.all((xa[right] - x[right]).abs() <= channel_budget(x[right], 0.5) * (1 + 1e-4) + 1e-6)


def test_hsj_stops_a_trial_at_its_query_budget_and_keeps_it_clean(monkeypatch):
    """A HopSkipJump run past ``max_queries`` (ART's step-size search can loop) is stopped, counted, not hung."""
    from neurofed.trainer import art_attacks

    _, x, _ = _small()
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4 * 80, 2)).eval()
    with torch.no_grad():
        y = model(x).argmax(1)  # every trial correct: all 8 are attacked
    budget = {"max_iter": 2, "max_eval": 20, "init_eval": 10}
    monkeypatch.setitem(art_attacks.LIBRARY_BUDGETS, "hsj", {**budget, "max_queries": 5})
    art_attacks.reset_hsj_stats()
    xa = art_attacks.hsj(model, x, y, 0.5, seed=0)
    assert art_attacks.HSJ_STATS == {"attacked": 8, "capped": 8}
    torch.testing.assert_close(xa, x, atol=1e-6, rtol=1e-6)  # no trial moved
    # with a budget it never reaches, nothing is stopped and the attack moves trials as before
    monkeypatch.setitem(art_attacks.LIBRARY_BUDGETS, "hsj", {**budget, "max_queries": 10**6})
    art_attacks.reset_hsj_stats()
    xb = art_attacks.hsj(model, x, y, 0.5, seed=0)
    assert art_attacks.HSJ_STATS == {"attacked": 8, "capped": 0}
    assert not torch.allclose(xb, x, atol=1e-6)


def test_repeated_batches_are_answered_from_the_cache_with_the_same_numbers(monkeypatch):
    """Square on batch-specific BN: cached answers change no adversarial trial and save forward passes."""
    from neurofed.trainer import art_attacks

    monkeypatch.setitem(art_attacks.LIBRARY_BUDGETS, "square", {"queries": 60, "restarts": 1, "p_init": 0.8})
    model, x, y = _small()
    runs = {}
    for size in (0, art_attacks.ScaledBatch.CACHE_SIZE):
        monkeypatch.setattr(art_attacks.ScaledBatch, "CACHE_SIZE", size)
        wrapper, clf, _ = art_attacks._setup(model, x, seed=3)
        runs[size] = art_attacks._square(wrapper, clf, x, y, 0.1), wrapper.forwards
    (uncached, n0), (cached, n1) = runs[0], runs[art_attacks.ScaledBatch.CACHE_SIZE]
    assert torch.equal(cached, uncached)
    assert n1 < n0


def test_the_cache_is_not_used_when_gradients_are_asked_for():
    model, x, _ = _small()
    w = ScaledBatch(model, x)
    z = torch.as_tensor(w.to_z(x)).requires_grad_(True)
    w(z).sum().backward()
    w(z).sum().backward()
    assert w.forwards == 2 and z.grad is not None and z.grad.abs().sum() > 0
