"""FedFA (federated feature augmentation): identity at test time and outside the round, the noise scale, the
running statistics, the server's aggregation of them, and a short real-data run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from neurofed.trainer.evaluate import mean_loss
from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl.algorithms import fedfa
from neurofed.trainer.fl.client import ClientUpdate, client_update, init_client_state
from neurofed.trainer.fl.local import LocalConfig, train_local
from neurofed.trainer.fl.server import (
    CLIPPED_KEY,
    ServerState,
    downlink,
    server_extras_for_clients,
    server_update,
)
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import build_model


def _model(seed: int = 0, name: str = "eegnet"):
    torch.manual_seed(seed)
    return build_model(name, 4, 2, 128, 64.0, "standard")


def _x(n: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(seed).standard_normal((n, 4, 128)).astype(np.float32))


def test_points_and_wire_specs_leave_the_model_unchanged():
    m = _model()
    keys = list(m.state_dict())
    assert fedfa.augmentation_points(m) == ["pool_1.1", "pool_2.1"]
    assert fedfa.point_channels(m) == {"pool_1.1": 16, "pool_2.1": 16}  # F1 * D and F2
    specs = get_strategy("fedfa").upload_specs(m)
    assert {k: v.shape for k, v in specs.items()} == {f"fedfa_up.{s}.{p}": (16,) for s in ("mean", "std")
                                                        for p in ("pool_1.1", "pool_2.1")}
    assert list(m.state_dict()) == keys and m.training
    # models without FEATURE_BLOCKS: every BN layer's output
    deep = build_model("deep", 4, 2, 480, 160.0, "standard")
    assert fedfa.point_channels(deep) == {"bnorm_1": 25, "bnorms.0": 50, "bnorms.1": 100, "bnorms.2": 200}


def test_identity_at_eval_and_after_the_round():
    m, x = _model(), _x()
    ref = _model()
    with fedfa.augmented(m, p=1.0):
        m.eval()
        assert torch.equal(m(x), ref.eval()(x))  # test time: identity
        m.train()
        torch.manual_seed(1)
        aug = m(x)
    m.train(), ref.train()
    torch.manual_seed(1)
    plain = m(x)
    torch.manual_seed(1)
    assert torch.equal(plain, ref(x))  # hooks removed: the model is its old self (same dropout draw)
    assert not torch.allclose(aug, plain)  # and in training with p = 1 it did augment
    assert not m._forward_hooks and all(not mod._forward_hooks for mod in m.modules())


def test_hooks_come_off_after_training_also_centralised(subjects4):
    sd = subjects4[0]
    torch.manual_seed(0)
    m = build_model("eegnet", sd.X.shape[1], 2, sd.X.shape[2], sd.sfreq, "standard")
    ref = build_model("eegnet", sd.X.shape[1], 2, sd.X.shape[2], sd.sfreq, "standard")
    ref.load_state_dict(m.state_dict())
    cfg = LocalConfig(local_epochs=1)
    for ep in range(2):  # CT + FedFA: train_local builds the hooks itself and closes them each epoch
        train_local(m, sd.X, sd.y, get_strategy("ct", fedfa_p=1.0), cfg, ep)
        train_local(ref, sd.X, sd.y, get_strategy("ct"), cfg, ep)
        assert all(not mod._forward_hooks for mod in m.modules())
    assert any(not torch.equal(p, q) for p, q in zip(m.parameters(), ref.parameters()))  # it did augment


def test_sharing_weights_and_noise_scale_by_hand():
    # r = S2 / (1 + S2): equal variances -> g = 1 everywhere; g is C r / sum(r), so it averages 1
    torch.testing.assert_close(fedfa.sharing_weights(torch.ones(3)), torch.ones(3))
    g = fedfa.sharing_weights(torch.tensor([0.0, 1.0, 3.0]))  # r ~ (0, 1/2, 3/4)
    torch.testing.assert_close(g, torch.tensor([0.0, 1.2, 1.8]), atol=1e-5, rtol=1e-5)
    stat = torch.tensor([[0.0, 1.0, 1.0], [2.0, 5.0, 1.0]])  # batch variances (unbiased): 2, 8, 0
    want = torch.tensor([math.sqrt(1.0 * (2 + 1e-6)), math.sqrt(2.2 * (8 + 1e-6)), math.sqrt(2.8 * 1e-6)])
    torch.testing.assert_close(fedfa.noise_std(stat, torch.tensor([0.0, 1.0, 3.0])), want, atol=1e-5, rtol=1e-4)


def test_resampled_statistics_have_the_stated_spread():
    torch.manual_seed(0)
    x = torch.randn(6, 2, 1, 200) * torch.tensor([1.0, 3.0])[None, :, None, None] + torch.randn(6, 2, 1, 1)
    mu, sig = fedfa.instance_stats(x)
    s2 = torch.tensor([0.5, 2.0])
    pt = fedfa._Point(1.0, torch.zeros(2), torch.ones(2), var_mean=s2, var_std=s2)
    draws_mu, draws_sig = [], []
    for _ in range(3000):
        out_mu, out_sig = fedfa.instance_stats(pt(torch.nn.Identity().train(), (), x))
        draws_mu.append(out_mu - mu)
        draws_sig.append(out_sig - sig)
    for draws, stat in ((torch.stack(draws_mu), mu), (torch.stack(draws_sig), sig)):
        assert draws.mean(0).abs().max() < 0.1 * fedfa.noise_std(stat, s2).max()  # centred on the trial's own
        emp = draws.std(0).mean(0)  # per channel, averaged over the trials
        torch.testing.assert_close(emp, fedfa.noise_std(stat, s2), rtol=0.06, atol=1e-3)


def test_running_statistics_start_from_the_server_and_move_with_momentum():
    pt = fedfa._Point(0.0, torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]), torch.ones(2), torch.ones(2))
    x = torch.randn(4, 2, 1, 50)
    out = pt(torch.nn.Identity().train(), (), x)
    assert torch.equal(out, x)  # p = 0: never augmented, but the statistics are tracked
    mu, sig = fedfa.instance_stats(x)
    torch.testing.assert_close(pt.mean, 0.99 * torch.tensor([1.0, 2.0]) + 0.01 * mu.mean(0))
    torch.testing.assert_close(pt.std, 0.99 * torch.tensor([3.0, 4.0]) + 0.01 * sig.mean(0))
    pt(torch.nn.Identity().eval(), (), x)  # eval: nothing moves
    torch.testing.assert_close(pt.mean, 0.99 * torch.tensor([1.0, 2.0]) + 0.01 * mu.mean(0))


def test_server_aggregates_running_statistics_and_their_client_variance():
    st = get_strategy("fedfa", clip_mult=0)

    def up(mean, std):
        return {"fedfa_up.mean.p": torch.tensor(mean), "fedfa_up.std.p": torch.tensor(std)}

    ups = [("a", ClientUpdate({"w": torch.tensor([0.0])}, 1, up([0.0, 2.0], [1.0, 1.0]))),
           ("b", ClientUpdate({"w": torch.tensor([4.0])}, 3, up([4.0, 2.0], [1.0, 3.0])))]
    s1 = server_update(ServerState({"w": torch.tensor([0.0])}), ups, st, 2)
    assert s1.global_state["w"].item() == pytest.approx(3.0)  # FedAvg: trial-count weights
    torch.testing.assert_close(s1.extras["fedfa.mean.p"], torch.tensor([3.0, 2.0]))  # trial-weighted mean
    torch.testing.assert_close(s1.extras["fedfa.std.p"], torch.tensor([1.0, 2.5]))
    torch.testing.assert_close(s1.extras["fedfa.var_mean.p"], torch.tensor([4.0, 0.0]))  # 1/M variance
    torch.testing.assert_close(s1.extras["fedfa.var_std.p"], torch.tensor([0.0, 1.0]))
    assert server_extras_for_clients(s1, st).keys() == {"fedfa.mean.p", "fedfa.std.p", "fedfa.var_mean.p",
                                                         "fedfa.var_std.p"}


def test_client_round_uses_the_downlinked_statistics_and_uploads_its_own(subjects4):
    sd = subjects4[0]
    st = get_strategy("fedfa")
    torch.manual_seed(0)
    m = build_model("eegnet", sd.X.shape[1], 2, sd.X.shape[2], sd.sfreq, "standard")
    g = {k: v.clone() for k, v in m.state_dict().items()}
    ch = fedfa.point_channels(m)
    extras = {f"fedfa.{kind}.{p}": torch.full((c,), v) for p, c in ch.items()
              for kind, v in (("mean", 5.0), ("std", 7.0), ("var_mean", 1.0), ("var_std", 1.0))}
    upd, _ = client_update(m, downlink(g, st, m), init_client_state(g, m, st), sd.X, sd.y, st,
                           LocalConfig(local_epochs=1), 3, extras)
    assert set(upd.extras) == set(st.upload_specs(m))
    steps = int(upd.metrics["steps"])  # each step moves the running mean 1 % of the way from 5 to ~0
    for p in ch:
        assert torch.all(upd.extras[f"fedfa_up.mean.{p}"] < 5.0)
        assert torch.all(upd.extras[f"fedfa_up.mean.{p}"] > 5.0 * 0.99 ** steps - 1.0)
    assert all(not mod._forward_hooks for mod in m.modules())


def test_two_rounds_on_real_subjects_learn(subjects4):
    clients = {sd.subject: sd for sd in subjects4}
    model, info = run_federated(clients, "eegnet", get_strategy("fedfa"), LocalConfig(), 2, 1.0, 0)
    ex = {k: v for k, v in info["server"].extras.items() if k != CLIPPED_KEY}  # FedFA's own, besides the clip count
    assert {k.rsplit(".", 2)[0] for k in ex} == {"fedfa.mean", "fedfa.std", "fedfa.var_mean", "fedfa.var_std"}
    assert all(torch.isfinite(v).all() and (v >= 0).all() for k, v in ex.items() if ".var_" in k)
    loss = [p["loss"] for p in info["curve"]]
    assert loss[1] < loss[0] < 1.5 * math.log(2)
    X = np.concatenate([sd.X for sd in subjects4])
    y = np.concatenate([sd.y for sd in subjects4])
    assert mean_loss(model, X, y) < math.log(2)
