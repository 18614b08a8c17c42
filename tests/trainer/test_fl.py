"""Federated rules pinned: aggregation weights, BN downlink rule, SAM/AWP restore, FGSM budget, selection."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from neurofed.trainer.attacks import channel_budget, fgsm, pgd
from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl.api import StateAggregator
from neurofed.trainer.fl.client import ClientState, ClientUpdate, client_update, init_client_state
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import ServerState, WeightedSum, downlink, select_clients, server_update
from neurofed.trainer.fl.strategies import ALGORITHMS, get_strategy
from neurofed.trainer.models import bn_state_keys, build_model
from neurofed.trainer.perturb import awp_perturbation, perturbed, sam_perturbation


def test_weighted_sum_matches_hand_computed_average():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    ws = WeightedSum()
    ws.add(a, 45)
    ws.add(b, 15)
    out = ws.result()
    torch.testing.assert_close(out["w"], torch.tensor([(45 * 1 + 15 * 3) / 60, (45 * 2 + 15 * 6) / 60]))
    assert out["n"].item() == 5 and out["w"].dtype == torch.float32


@pytest.mark.parametrize("name, overrides", [(n, {}) for n in ALGORITHMS if not ALGORITHMS[n].centralised]
                         + [("fedavg", {"aggregator": "median"}), ("fedavg", {"dp_clip": 1.0, "dp_noise": 0.0})])
def test_every_server_rule_is_a_state_aggregator(name, overrides):
    """The server's rule, default or a component's, honours one contract: add(state, weight) ... result()."""
    st = get_strategy(name, **overrides)
    old = {"w": torch.zeros(2)}
    agg = st.state_aggregator(old, 0, 4)
    assert isinstance(agg, StateAggregator), type(agg)
    for w in (1.0, 2.0, 3.0):
        agg.add({"w": torch.full((2,), w)}, 10)
    assert agg.count == 3 and agg.result()["w"].shape == (2,)


def test_server_update_weights_by_trial_counts_and_sorts():
    s0 = ServerState({"w": torch.zeros(2)})
    ups = [("c2", ClientUpdate({"w": torch.tensor([4.0, 0.0])}, 30)),
           ("c1", ClientUpdate({"w": torch.tensor([1.0, 1.0])}, 10))]
    s1 = server_update(s0, ups, get_strategy("fedavg"), 2)
    torch.testing.assert_close(s1.global_state["w"], torch.tensor([(10 + 120) / 40, 10 / 40]))
    assert s1.round == 1


def _model(bn_mode="batch_specific"):
    torch.manual_seed(0)
    return build_model("eegnet", 4, 2, 128, 64.0, bn_mode)


@pytest.mark.parametrize("alg,sent", [("fedavg", True), ("fedbn", False), ("fedbs", False), ("safe", False)])
def test_bn_keys_not_sent_under_local_bn_rule(alg, sent):
    st = get_strategy(alg)
    m = _model(st.bn_mode)
    down = downlink(m.state_dict(), st, m)
    bn = bn_state_keys(m)
    assert bn
    assert (bn <= down.keys()) is sent
    assert (set(m.state_dict()) - bn) <= down.keys()  # every non-BN entry is sent


def test_stale_global_option_sends_bn():
    st = get_strategy("fedbs", bn_sync="stale_global")
    m = _model()
    assert bn_state_keys(m) <= downlink(m.state_dict(), st, m).keys()


def _data(seed, n=16):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 4, 128)).astype(np.float32), rng.integers(0, 2, n)


def test_client_keeps_own_bn_and_global_carries_aggregate():
    st = get_strategy("fedbs")
    cfg = LocalConfig(batch_size=8, local_epochs=1)
    m = _model()
    g0 = {k: v.clone() for k, v in m.state_dict().items()}
    bn = bn_state_keys(m)
    states = {c: init_client_state(g0, m, st) for c in ("a", "b")}
    ups = []
    for i, c in enumerate(("a", "b")):
        X, y = _data(i)
        u, states[c] = client_update(m, downlink(g0, st, m), states[c], X, y, st, cfg, seed=i)
        ups.append((c, u))
        for k in bn:  # the client's kept BN is what it trained
            torch.testing.assert_close(states[c].bn[k], u.state[k])
    server = server_update(ServerState(g0), ups, st, 2)
    for k in bn:  # the global model carries the (trial-weighted) aggregate of the BN entries
        torch.testing.assert_close(server.global_state[k], (ups[0][1].state[k] + ups[1][1].state[k]) / 2)
    # next round: client a starts from ITS BN, not the aggregate
    down = downlink(server.global_state, st, m)
    assert not (bn & down.keys())
    states["a"].bn = {k: v + 0.5 for k, v in states["a"].bn.items()}  # make client a's BN distinctive
    own_bn = {k: v.clone() for k, v in states["a"].bn.items()}
    X, y = _data(0)
    u2, _ = client_update(m, down, states["a"], X, y, st, LocalConfig(lr=1e-9, batch_size=8, local_epochs=1), seed=0)
    for k in bn:
        torch.testing.assert_close(u2.state[k], own_bn[k], atol=1e-5, rtol=0)
        assert (u2.state[k] - server.global_state[k]).abs().min() > 0.4


def test_client_without_bn_state_is_refused():
    st = get_strategy("fedbs")
    m = _model()
    X, y = _data(0)
    with pytest.raises(ValueError, match="no local BN"):
        client_update(m, downlink(m.state_dict(), st, m), ClientState(), X, y, st, LocalConfig(batch_size=8), 0)


def test_sam_and_awp_perturbations_and_exact_restore():
    m = _model()
    X, y = _data(1)
    nn.functional.cross_entropy(m(torch.as_tensor(X)), torch.as_tensor(y)).backward()
    params = list(m.parameters())
    e = sam_perturbation(params, 0.1)
    norm = torch.sqrt(sum((d ** 2).sum() for d in e if d is not None))
    assert abs(norm.item() - 0.1) < 1e-5  # ||e||_2 = rho
    v = awp_perturbation(params, 0.01)
    for p, d in zip(params, v):
        if p.dim() <= 1:
            assert d is None  # no BN, no bias
        else:
            assert abs(d.norm().item() - 0.01 * p.norm().item()) < 1e-6 * max(1.0, p.norm().item())
    before = [p.detach().clone() for p in params]
    with perturbed(params, [a if b is None else (b if a is None else a + b) for a, b in zip(e, v)]):
        assert any(not torch.equal(p, q) for p, q in zip(params, before))
    for p, q in zip(params, before):
        assert torch.equal(p, q)  # bit-exact restore


def test_fgsm_budget_is_per_channel_std():
    m = _model().eval()
    X, y = _data(2, n=8)
    X[:, 1] *= 50  # a loud channel gets a proportionally larger budget
    x = torch.as_tensor(X)
    xa = fgsm(m, x, torch.as_tensor(y), 0.03)
    delta = (xa - x).abs()
    torch.testing.assert_close(delta.amax(-1, keepdim=True), channel_budget(x, 0.03), rtol=1e-4, atol=1e-6)
    xp = pgd(m, x, torch.as_tensor(y), 0.03, steps=3)
    assert torch.all((xp - x).abs() <= channel_budget(x, 0.03) * (1 + 1e-5))


def test_seeded_selection():
    ids = [f"S{i:03d}" for i in range(1, 30)]
    a = select_clients(ids, 0.5, 3, seed=7)
    assert a == select_clients(list(reversed(ids)), 0.5, 3, seed=7)  # order of arrival does not matter
    assert len(a) == 14 and a == sorted(a) and len(set(a)) == 14  # floor(0.5 * 29)
    assert a != select_clients(ids, 0.5, 4, seed=7)
    assert a != select_clients(ids, 0.5, 3, seed=8)
    assert select_clients(["x"], 0.5, 0, 0) == ["x"]


def test_scaffold_control_variates_move():
    st = get_strategy("scaffold")
    m = _model("standard")
    g0 = {k: v.clone() for k, v in m.state_dict().items()}
    X, y = _data(3)
    u, cs = client_update(m, g0, ClientState(), X, y, st, LocalConfig(batch_size=8, local_epochs=1), 0)
    assert cs.scaffold_c and any(v.abs().sum() > 0 for v in cs.scaffold_c.values())
    s1 = server_update(ServerState(g0), [("a", u)], st, n_clients_total=4)
    dc = {k[len("scaffold_dc."):]: v for k, v in u.extras.items()}
    for n, v in dc.items():  # c <- c + |S|/N * mean(dc)
        torch.testing.assert_close(s1.extras[f"scaffold_c.{n}"], v / 4)


@pytest.mark.parametrize("alg", ["fedavg", "fedprox", "scaffold", "moon", "fedbn", "fedbs", "safe"])
def test_runs_are_reproducible(subjects4, alg):
    clients = {sd.subject: sd for sd in subjects4}
    cfg = LocalConfig(batch_size=16, local_epochs=1)
    m1, r1 = run_federated(clients, "eegnet", get_strategy(alg), cfg, rounds=2, fraction=0.5, seed=3)
    m2, r2 = run_federated(clients, "eegnet", get_strategy(alg), cfg, rounds=2, fraction=0.5, seed=3)
    for k, v in m1.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k]), k
    assert r1["curve"] == r2["curve"] and sum(r1["participation"].values()) == 4


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_scaffold_displacement_recovers_the_gradient_with_momentum(momentum):
    """SCAFFOLD's c_i = (x - y_i) / (lr * D_K): under a constant gradient g it is exactly g, with or without
    momentum (torch's SGD, fresh buffer, as in every local round)."""
    from neurofed.trainer.fl.client import momentum_displacement

    g = torch.tensor([1.0, -2.0, 0.5])
    w = nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([w], lr=0.1, momentum=momentum)
    for _ in range(12):
        opt.zero_grad()
        (w * g).sum().backward()  # d/dw = g, constant
        opt.step()
    torch.testing.assert_close(-w.detach() / (0.1 * momentum_displacement(12, momentum)), g)
    assert momentum_displacement(12, 0.0) == 12.0 and momentum_displacement(12, 0.9) > 4 * 12
