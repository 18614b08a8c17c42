"""GA (generalisation adjustment, FedDG-GA): the weight rule on hand cases, the server's per-client weights,
the client's gap, refusal of partial participation, and a short real-data run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from neurofed.trainer.evaluate import mean_loss
from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl.algorithms import ga
from neurofed.trainer.fl.client import ClientUpdate, client_update, init_client_state
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import (
    RoundAggregator,
    ServerState,
    downlink,
    server_extras_for_clients,
    server_update,
)
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import build_model


def test_adjust_by_hand():
    # a: 0.5 + (0.2 / 2) * 0.2 / 0.2 = 0.6; b: 0.5 + 0.1 * (-0.1 / 0.2) = 0.45; renormalised by 1.05
    w = ga.adjust({"a": 0.5, "b": 0.5}, {"a": 0.2, "b": -0.1}, d=0.2, n_clients=2)
    assert w == pytest.approx({"a": 0.6 / 1.05, "b": 0.45 / 1.05})
    # clipping at 0, then renormalising; a client without a gap this round keeps its (renormalised) weight
    w = ga.adjust({"a": 0.05, "b": 0.45, "c": 0.5}, {"a": -1.0, "b": 0.5}, d=0.4, n_clients=2)
    assert w == pytest.approx({"a": 0.0, "b": 0.55 / 1.05, "c": 0.5 / 1.05})
    # every gap 0: nothing moves
    assert ga.adjust({"a": 0.3, "b": 0.7}, {"a": 0.0, "b": 0.0}, 0.2, 2) == pytest.approx({"a": 0.3, "b": 0.7})


def test_step_decays_linearly_over_the_run():
    assert [ga.step_size(0.2, t, 4) for t in range(4)] == pytest.approx([0.2, 0.15, 0.1, 0.05])


def _round(server, gaps, st, rounds=10):
    ups = [(cid, ClientUpdate({"w": torch.tensor([v]), "n": torch.tensor(1)}, n,
                              {ga.GAP: torch.tensor([g], dtype=torch.float32)}))
           for cid, (v, n, g) in gaps.items()]
    return server_update(server, ups, st, len(gaps), rounds)


def test_server_weights_replace_trial_counts_and_follow_the_gaps():
    st = get_strategy("ga", ga_step=0.2, clip_mult=0)
    s0 = ServerState({"w": torch.tensor([0.0]), "n": torch.tensor(0)})
    # round 0: equal weights 1/2 (not the trial counts 1 and 3): the mean of 0 and 4 is 2
    s1 = _round(s0, {"a": (0.0, 1, 0.2), "b": (4.0, 3, -0.1)}, st)
    assert s1.global_state["w"].item() == pytest.approx(2.0)
    assert float(s1.extras["ga_w.a"]) == pytest.approx(0.6 / 1.05)  # d_0 = 0.2, as in test_adjust_by_hand
    assert float(s1.extras["ga_w.b"]) == pytest.approx(0.45 / 1.05)
    assert server_extras_for_clients(s1, st) == {}  # the weights stay on the server
    # round 1 aggregates with them; d_1 = 0.2 * (1 - 1/10) = 0.18
    s2 = _round(s1, {"a": (0.0, 1, 0.0), "b": (4.0, 3, 0.3)}, st)
    wa, wb = 0.6 / 1.05, 0.45 / 1.05
    assert s2.global_state["w"].item() == pytest.approx(4.0 * wb / (wa + wb), rel=1e-6)
    nb = wb + 0.18 / 2 * 1.0
    assert float(s2.extras["ga_w.b"]) == pytest.approx(nb / (wa + nb))
    assert s2.global_state["n"].item() == 1


def test_needs_ids_rounds_and_every_client():
    st = get_strategy("ga")
    s0 = ServerState({"w": torch.tensor([0.0])})
    with pytest.raises(ValueError, match="total rounds"):
        _round(s0, {"a": (0.0, 1, 0.1)}, st, rounds=0)
    with pytest.raises(ValueError, match="carries no ga.gap"):
        server_update(s0, [("a", ClientUpdate({"w": torch.tensor([1.0])}, 1))], st, 1, 10)
    agg = RoundAggregator(s0, st, 1, 10)
    with pytest.raises(ValueError, match="by its id"):
        agg.add(ClientUpdate({"w": torch.tensor([1.0])}, 1, {ga.GAP: torch.tensor([0.1])}))
    with pytest.raises(ValueError, match="needs every client in every round"):
        st.check_participation(0.5)
    st.check_participation(1.0)
    get_strategy("fedavg").check_participation(0.5)
    from neurofed.broker.config import ConfigError, config_from_dict
    with pytest.raises(ConfigError, match="needs every client"):
        config_from_dict({"federation": {"strategy": "ga", "fraction": 0.5}})
    config_from_dict({"federation": {"strategy": "ga", "fraction": 1.0}})


def test_client_uploads_its_generalisation_gap(subjects4):
    sd = subjects4[0]
    st = get_strategy("ga")
    torch.manual_seed(0)
    m = build_model("eegnet", sd.X.shape[1], 2, sd.X.shape[2], sd.sfreq, "standard")
    g = {k: v.clone() for k, v in m.state_dict().items()}
    cfg = LocalConfig(local_epochs=1)
    before = mean_loss(m, sd.X, sd.y, cfg.batch_size)
    upd, _ = client_update(m, downlink(g, st, m), init_client_state(g, m, st), sd.X, sd.y, st, cfg, 3)
    after = mean_loss(m, sd.X, sd.y, cfg.batch_size)
    assert upd.metrics["loss_global"] == pytest.approx(before) and upd.metrics["loss_local"] == pytest.approx(after)
    assert float(upd.extras[ga.GAP]) == pytest.approx(before - after, abs=1e-6)
    assert set(upd.extras) == set(st.upload_specs(m)) == {ga.GAP}


def test_two_rounds_on_real_subjects_learn(subjects4):
    clients = {sd.subject: sd for sd in subjects4}
    st = get_strategy("ga")
    with pytest.raises(ValueError, match="needs every client"):
        run_federated(clients, "eegnet", st, LocalConfig(), 2, 0.5, 0)
    model, info = run_federated(clients, "eegnet", st, LocalConfig(), 2, 1.0, 0)
    w = {k: float(v) for k, v in info["server"].extras.items() if k.startswith("ga_w.")}
    assert set(w) == {f"ga_w.{c}" for c in clients} and sum(w.values()) == pytest.approx(1.0)
    assert max(w.values()) - min(w.values()) > 1e-4  # the gaps moved them away from 1/4
    loss = [p["loss"] for p in info["curve"]]
    assert loss[1] < loss[0] < 1.5 * math.log(2)
    X = np.concatenate([sd.X for sd in subjects4])
    y = np.concatenate([sd.y for sd in subjects4])
    assert mean_loss(model, X, y) < math.log(2)  # the global model fits its clients' trials better than chance


def test_simulate_options_refuse_partial_participation_and_the_baseline_grid_parses(tmp_path):
    from pathlib import Path

    from neurofed.trainer.errors import NeuroFedError
    from neurofed.trainer.experiments.grid import parse_spec

    bad = tmp_path / "bad.txt"
    bad.write_text("ga --algorithm ga --subjects 1-4 --rounds 2\n")  # the preset's fraction 0.5
    with pytest.raises(NeuroFedError, match="needs every client in every round"):
        parse_spec(bad, tmp_path)
    spec = Path(__file__).resolve().parents[2] / "studies" / "table46" / "spec.toml"
    runs = {r.name: r.cfg for r in parse_spec(spec, tmp_path, group="baselines46")}
    assert sorted(runs) == ["ct_at", "fal", "fedfa", "fedprox_mu1", "ga"]
    assert runs["ga"].fraction == 1.0 and runs["fedfa"].fraction == 0.5
    assert runs["fedprox_mu1"].strategy_overrides == {"prox_mu": 1.0} and runs["ct_at"].ct_batch_size == 64
    assert all(c.rounds == 50 and c.seeds == [0, 1, 2] and len(c.subjects) == 46 for c in runs.values())
