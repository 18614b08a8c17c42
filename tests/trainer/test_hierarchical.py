"""Hierarchical (FLEEG) aggregation, issue 19: which keys go to which clients, per-profile weighting,
and a mixed-device federation on real recordings presented through device profiles."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neurofed.trainer.data import PreprocessConfig
from neurofed.trainer.data.profiles import load_profile_subject
from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl.api import group_key
from neurofed.trainer.fl.client import ClientUpdate, client_update, init_client_state
from neurofed.trainer.fl.init import init_group_models, init_server_state
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import ServerState, downlink, server_update
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import EEGNet, FleegEEGNet, bn_state_keys

CFG = LocalConfig(lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=8, local_epochs=1)


def _model(c: int, seed: int = 0, bn: str = "standard") -> FleegEEGNet:
    torch.manual_seed(seed)
    return FleegEEGNet(c, 2, 320, 80.0, bn)


def test_one_device_fleeg_model_is_eegnet():
    torch.manual_seed(3)
    a = EEGNet(8, 2, 320, 80.0, "batch_specific")
    torch.manual_seed(3)
    b = FleegEEGNet(8, 2, 320, 80.0, "batch_specific")
    assert [p.shape for p in a.parameters()] == [p.shape for p in b.parameters()]
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    x = torch.randn(8, 8, 320)
    a.eval(), b.eval()
    assert torch.equal(a(x), b(x))


def test_local_bn_mode_is_configurable_per_part():
    m = FleegEEGNet(8, 2, 320, 80.0, "standard", local_bn_mode="batch_specific")
    assert not m.local[1].track_running_stats and not m.local[3].track_running_stats
    assert m.body[2].track_running_stats


def _const_state(model, value: float) -> dict:
    return {k: (torch.full_like(v, value) if torch.is_floating_point(v) else v.clone())
            for k, v in model.state_dict().items()}


def test_global_over_all_local_per_profile_weighted_by_trials():
    st = get_strategy("fleeg", clip_mult=0)  # the aggregation rule alone (constant updates 1, 4, 10 differ > 1.5x)
    models = {"u8": _model(8), "r21": _model(21)}
    server = ServerState(init_server_state(models, st.group_prefixes))
    ups = [("a", ClientUpdate(_const_state(models["u8"], 1.0), 10, group="u8")),
           ("b", ClientUpdate(_const_state(models["u8"], 4.0), 30, group="u8")),
           ("c", ClientUpdate(_const_state(models["r21"], 10.0), 20, group="r21"))]
    new = server_update(server, ups, st, 3).global_state
    w = "local.2.weight"  # the spatial conv: shape depends on the montage
    assert new[group_key("u8", w)].shape[2] == 8 and new[group_key("r21", w)].shape[2] == 21
    assert torch.allclose(new[group_key("u8", w)], torch.tensor(3.25))   # (10*1 + 30*4) / 40: u8 clients only
    assert torch.allclose(new[group_key("r21", w)], torch.tensor(10.0))  # r21's own client only
    assert torch.allclose(new["classifier.weight"], torch.tensor((10 + 120 + 200) / 60))  # all clients
    assert not any(k.startswith("local.") for k in new)  # no federation-wide local module


def test_downlink_carries_only_the_clients_profile_module():
    st = get_strategy("fedbs", group_keys="local.")
    models = {"u8": _model(8, bn="batch_specific"), "r21": _model(21, bn="batch_specific")}
    gs = init_server_state(models, st.group_prefixes)
    gs[group_key("u8", "local.2.weight")] = torch.full_like(gs[group_key("u8", "local.2.weight")], 7.0)
    for g, v in (("u8", 1.0), ("r21", 2.0)):  # the temporal convs start equal (same seed): mark them
        gs[group_key(g, "local.0.1.weight")] = torch.full_like(gs[group_key(g, "local.0.1.weight")], v)
    for g, other in (("u8", "r21"), ("r21", "u8")):
        down = downlink(gs, st, models[g], g)
        assert not any(k.startswith("@") for k in down)
        assert set(down) == set(models[g].state_dict()) - bn_state_keys(models[g])  # FedBS: no BN sent
        assert down["local.2.weight"].shape == models[g].state_dict()["local.2.weight"].shape
        assert torch.equal(down["local.0.1.weight"], gs[group_key(g, "local.0.1.weight")])
        assert not torch.equal(down["local.0.1.weight"], gs[group_key(other, "local.0.1.weight")])
    assert torch.all(downlink(gs, st, models["u8"], "u8")["local.2.weight"] == 7.0)
    with pytest.raises(ValueError, match="no module for client group 'x8'"):
        downlink(gs, st, models["u8"], "x8")


def test_absent_profile_keeps_its_module_and_ungrouped_update_is_refused():
    st = get_strategy("fleeg")
    models = {"u8": _model(8), "r21": _model(21)}
    server = ServerState(init_server_state(models, st.group_prefixes))
    new = server_update(server, [("a", ClientUpdate(_const_state(models["u8"], 2.0), 5, group="u8"))], st, 2)
    k = group_key("r21", "local.2.weight")
    assert torch.equal(new.global_state[k], server.global_state[k])
    with pytest.raises(ValueError, match="without a client group"):
        server_update(server, [("a", ClientUpdate(_const_state(models["u8"], 2.0), 5))], st, 2)


def test_model_without_local_keys_is_refused():
    with pytest.raises(ValueError, match="fleeg_eegnet"):
        init_server_state({"a": EEGNet(8, 2, 320, 80.0)}, ("local.",))


@pytest.fixture(scope="module")
def mixed(data_dir, tmp_path_factory):
    import os

    os.environ.setdefault("NEUROFED_CACHE", str(tmp_path_factory.mktemp("cache")))
    cfg = PreprocessConfig(resample=80.0)
    assign = {1: "unicorn8", 2: "research21", 3: "unicorn8", 4: "research21", 5: "unicorn8"}
    subs = {f"S{s:03d}": load_profile_subject(s, p, cfg, data_dir) for s, p in assign.items()}
    return subs, {f"S{s:03d}": p for s, p in assign.items()}


def test_mixed_device_federation_on_real_recordings(mixed):
    subs, groups = mixed
    train = {k: v for k, v in subs.items() if k != "S005"}
    st = get_strategy("fedbs", group_keys="local.")
    _, info = run_federated(train, "fleeg_eegnet", st, CFG, 2, 1.0, 0, groups=groups)
    ms = info["models"]
    assert set(ms) == {"unicorn8", "research21"}
    assert ms["unicorn8"].local[2].weight.shape[2] == 8 and ms["research21"].local[2].weight.shape[2] == 21
    shared = [k for k in ms["unicorn8"].state_dict() if not k.startswith("local.")]
    for k in shared:  # one global module
        assert torch.equal(ms["unicorn8"].state_dict()[k], ms["research21"].state_dict()[k])
    # a new unicorn8 user is decoded by body + unicorn8's local module
    with torch.no_grad():
        out = ms["unicorn8"].eval()(torch.as_tensor(subs["S005"].X[:8]))
    assert out.shape == (8, 2) and torch.isfinite(out).all()
    assert info["participation"] == {k: 2 for k in train}


def test_one_round_by_hand_equals_run_federated(mixed):
    """Round 1 rebuilt from client_update: the per-profile and global averages of the real updates."""
    from neurofed.trainer.fl.init import client_seed

    subs, groups = mixed
    train = {k: v for k, v in subs.items() if k != "S005"}
    st = get_strategy("fleeg")
    _, info = run_federated(train, "fleeg_eegnet", st, CFG, 1, 1.0, 0, groups=groups)
    models = init_group_models(train, groups, "fleeg_eegnet", st.bn_mode, 0)
    gs = init_server_state(models, st.group_prefixes)
    ups = {}
    for cid in sorted(train):
        g = groups[cid]
        cs = init_client_state(gs, models[g], st, g)
        ups[cid], _ = client_update(models[g], downlink(gs, st, models[g], g), cs, train[cid].X, train[cid].y,
                                    st, CFG, client_seed(0, 0, cid), None, g)
    got = info["server"].global_state
    w = "local.2.weight"
    for g in ("unicorn8", "research21"):
        mine = [c for c in ups if groups[c] == g]
        n = sum(ups[c].n_samples for c in mine)
        want = sum(ups[c].state[w].double() * ups[c].n_samples for c in mine) / n
        assert torch.allclose(got[group_key(g, w)].double(), want, atol=1e-6)
    n = sum(u.n_samples for u in ups.values())
    want = sum(u.state["classifier.weight"].double() * u.n_samples for u in ups.values()) / n
    assert torch.allclose(got["classifier.weight"].double(), want, atol=1e-6)
    assert np.isfinite(info["curve"][0]["loss"])


def test_hierarchical_strategy_without_profiles_is_refused(mixed):
    subs, _ = mixed
    with pytest.raises(ValueError, match="--profiles"):
        run_federated(subs, "fleeg_eegnet", get_strategy("fleeg"), CFG, 1, 1.0, 0)


def test_simulate_with_profiles_reports_per_profile_bca(data_dir, tmp_path, monkeypatch):
    from neurofed.trainer.experiments.simulate import SimConfig, run_simulation

    monkeypatch.setenv("NEUROFED_CACHE", str(tmp_path / "cache"))
    prof = {"1": "unicorn8", "2": "research21", "3": "unicorn8", "4": "research21", "5": "unicorn8", "6": "research21"}
    base = {"model": "fleeg_eegnet", "subjects": [1, 2, 3, 4, 5, 6], "protocol": "kfold:3", "rounds": 1,
            "fraction": 1.0, "local": CFG.to_dict(), "preprocess": PreprocessConfig(resample=80.0).to_dict(),
            "eval_every": 0, "data_dir": str(data_dir), "profiles": prof, "folds": [0]}
    res = run_simulation(SimConfig(algorithm="fleeg", **base), tmp_path / "a")
    tested = sorted(res["per_subject"])
    assert len(tested) == 2 and set(res["per_profile"]) == {prof[str(int(s[1:]))] for s in tested}
    assert sum(r["n"] for r in res["per_profile"].values()) == 2
    from neurofed.trainer.errors import NeuroFedError

    with pytest.raises(NeuroFedError, match="different channels"):
        run_simulation(SimConfig(algorithm="fedavg", **{**base, "model": "eegnet"}), tmp_path / "b")
    only = run_simulation(SimConfig(algorithm="fedavg", **{**base, "model": "eegnet", "only_profile": "unicorn8"}),
                          tmp_path / "c")
    assert all(prof[str(int(s[1:]))] == "unicorn8" for s in only["per_subject"])


def test_deployment_saves_one_checkpoint_per_profile(data_dir, tmp_path, monkeypatch):
    from neurofed.trainer.checkpoint import load_checkpoint
    from neurofed.trainer.experiments.simulate import SimConfig, run_simulation

    monkeypatch.setenv("NEUROFED_CACHE", str(tmp_path / "cache"))
    prof = {"1": "unicorn8", "2": "cyton_daisy16", "3": "unicorn8", "4": "cyton_daisy16"}
    cfg = SimConfig(algorithm="fleeg", model="fleeg_eegnet", subjects=[1, 2, 3, 4], protocol="none", rounds=1,
                    fraction=1.0, local=CFG.to_dict(), preprocess=PreprocessConfig(resample=80.0).to_dict(),
                    eval_every=0, data_dir=str(data_dir), profiles=prof,
                    strategy_overrides={"local_bn_mode": "batch_specific"})
    res = run_simulation(cfg, tmp_path / "run")
    assert len(res["checkpoints"]) == 2
    shared = None
    for path in res["checkpoints"]:
        model, meta = load_checkpoint(path)
        want = "unicorn8" if "unicorn8" in path else "cyton_daisy16"
        assert meta.extra["profile"] == want and meta.n_channels == {"unicorn8": 8, "cyton_daisy16": 16}[want]
        assert not model.local[1].track_running_stats  # local_bn_mode survives the checkpoint
        body = {k: v for k, v in model.state_dict().items() if not k.startswith("local.")}
        if shared is not None:
            assert all(torch.equal(v, shared[k]) for k, v in body.items())
        shared = body
