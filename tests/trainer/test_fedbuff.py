"""Buffered asynchronous aggregation (:mod:`neurofed.trainer.fl.fedbuff`): the staleness rule, rejection, refusal."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from neurofed.cli import app
from neurofed.trainer.experiments.spec import parse_options
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.fedbuff import (
    FUTURE,
    STALE,
    AsyncRefused,
    BufferedServer,
    check_async,
    staleness_weight,
)
from neurofed.trainer.fl.server import ServerState
from neurofed.trainer.fl.strategies import get_strategy


def _upd(w: float, n: int) -> ClientUpdate:
    return ClientUpdate({"w": torch.tensor([w]), "nbt": torch.tensor(n)}, n)


def _server(k: int, s: int, lr: float = 1.0) -> BufferedServer:
    """Version 2 with the history of versions 0, 1, 2 (w = 0, 2, 4)."""
    hist = {v: {"w": torch.tensor([2.0 * v]), "nbt": torch.tensor(0)} for v in range(3)}
    return BufferedServer(ServerState(dict(hist[2]), round=2), k, s, lr, history=hist)


def test_staleness_rule():
    assert staleness_weight(0) == 1.0
    assert staleness_weight(3) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        staleness_weight(-1)


@pytest.mark.parametrize("lr", [1.0, 0.5])
def test_three_updates_by_hand(lr):
    """w_i = n_i / sqrt(1 + tau_i); new = current + lr * sum w_i delta_i / sum w_i."""
    srv = _server(3, 5, lr)
    a = srv.submit("a", _upd(6.0, 10), 2)  # delta 2, tau 0, weight 10
    b = srv.submit("b", _upd(5.0, 20), 1)  # delta 3 (5 - 2), tau 1, weight 20 / sqrt 2
    assert (a.code, a.staleness, a.weight, a.aggregated) == ("accepted", 0, 10.0, False)
    assert b.weight == pytest.approx(20 / math.sqrt(2)) and not b.aggregated
    c = srv.submit("c", _upd(1.0, 30), 0)  # delta 1 (1 - 0), tau 2, weight 30 / sqrt 3
    assert c.aggregated and c.staleness == 2
    w = [10.0, 20 / math.sqrt(2), 30 / math.sqrt(3)]
    expected = 4.0 + lr * (w[0] * 2 + w[1] * 3 + w[2] * 1) / sum(w)  # lr 1: 5.92335...
    assert srv.version == 3
    assert float(srv.server.global_state["w"]) == pytest.approx(expected, abs=1e-6)
    assert int(srv.server.global_state["nbt"]) == 30  # integer entries: the maximum
    assert srv.buffer == [] and srv.accepted == 3


def test_stale_beyond_bound_rejected():
    srv = _server(2, 1)
    v = srv.submit("a", _upd(4.0, 5), 0)  # tau 2 > 1
    assert (v.code, v.staleness, v.weight) == (STALE, 2, 0.0)
    assert srv.submit("b", _upd(4.0, 5), 3).code == FUTURE
    assert srv.submit("c", _upd(4.0, 5), 1).code == "accepted"  # tau 1: at the bound
    assert srv.rejected == {STALE: 1, FUTURE: 1} and srv.accepted == 1 and srv.version == 2
    srv.submit("d", _upd(6.0, 5), 2)
    assert srv.version == 3 and sorted(srv.history) == [2, 3]  # only the states an accepted base can name


@pytest.mark.parametrize("name", ["fedavg", "fedbn", "fedprox", "fedbs", "safe"])
def test_local_training_strategies_accepted(name):
    check_async(get_strategy(name))


@pytest.mark.parametrize("name,what", [("scaffold", "Scaffold"), ("fedavgm", "assumes synchronous rounds"),
                                       ("fedmedian", "its own aggregation rule"), ("ga", "assumes synchronous"),
                                       ("ct", "centralised")])
def test_synchronous_strategies_refused_in_one_line(name, what):
    with pytest.raises(AsyncRefused) as exc:
        check_async(get_strategy(name))
    assert what.lower() in str(exc.value).lower() and "\n" not in str(exc.value)


def test_secure_aggregation_refused():
    with pytest.raises(AsyncRefused, match="secure aggregation cannot run asynchronously") as exc:
        check_async(get_strategy("fedavg"), secure_aggregation=True)
    assert "\n" not in str(exc.value)


def test_cli_refuses_scaffold_before_any_work(tmp_path):
    with pytest.raises(AsyncRefused, match="strategy scaffold cannot run asynchronously"):
        parse_options({"mode": "async", "algorithm": "scaffold", "subjects": "1-4"}).to_sim_config()
    res = CliRunner().invoke(app, ["simulate", "--mode", "async", "--algorithm", "scaffold", "--subjects", "1-4",
                                   "--out", str(tmp_path / "r")])
    assert res.exit_code != 0 and isinstance(res.exception, AsyncRefused)
    assert not (tmp_path / "r").exists()


def test_adaptive_clip_on_the_buffer():
    """The default norm clip (k x the buffer's median delta norm) scales an outlier down, as in a synchronous round."""
    hist = {0: {"w": torch.tensor([0.0]), "nbt": torch.tensor(0)}}
    srv = BufferedServer(ServerState(dict(hist[0])), 3, 0, 1.0, 1.5, history=hist)
    for cid, w in (("a", 1.0), ("b", 1.0), ("c", 100.0)):
        srv.submit(cid, _upd(w, 10), 0)
    assert srv.clipped == 1
    assert float(srv.server.global_state["w"]) == pytest.approx((1 + 1 + 1.5) / 3)


def test_value_entries_move_from_the_current_model_not_the_stale_base():
    """A BN running variance is the client's estimate, not a step from its base: averaged as a value it stays a
    convex combination (the old rule, current + (value - stale base), went below zero here)."""
    hist = {v: {"w": torch.tensor([2.0 * v]), "bn.running_var": torch.tensor([1.0 - 0.45 * v]),
                "nbt": torch.tensor(0)} for v in range(3)}  # var 1.0, 0.55, 0.1
    keys = frozenset({"bn.running_var"})
    srv = BufferedServer(ServerState(dict(hist[2]), round=2), 2, 5, 1.0, value_keys=keys, history=hist)
    srv.submit("a", ClientUpdate({"w": torch.tensor([5.0]), "bn.running_var": torch.tensor([0.2]),
                                  "nbt": torch.tensor(3)}, 10), 0)  # tau 2: w delta 5 - 0
    srv.submit("b", ClientUpdate({"w": torch.tensor([4.0]), "bn.running_var": torch.tensor([0.3]),
                                  "nbt": torch.tensor(3)}, 10), 2)  # tau 0
    w = [10 / math.sqrt(3), 10.0]
    g = srv.server.global_state
    assert float(g["w"]) == pytest.approx(4.0 + (w[0] * 5.0 + w[1] * 0.0) / sum(w))  # trained: from its base
    assert float(g["bn.running_var"]) == pytest.approx((w[0] * 0.2 + w[1] * 0.3) / sum(w))  # value: mean of values


@pytest.mark.parametrize("lr", [1.0, 0.5])
def test_value_entries_equal_the_delta_rule_at_zero_staleness(lr):
    """Without staleness the two rules are the same bits (every committed synchronous-equivalent result holds)."""
    out = []
    for keys in (frozenset(), frozenset({"w"})):
        srv = _server(2, 5, lr)
        srv.value_keys = keys
        srv.submit("a", _upd(6.0, 10), 2)
        srv.submit("b", _upd(3.0, 20), 2)
        out.append(srv.server.global_state["w"])
    assert torch.equal(out[0], out[1])


def test_value_keys_are_bn_statistics_and_what_stays_on_the_clients():
    """FedAvg (standard BN): the running statistics; FedBS (batch-specific BN kept on the clients, no running
    statistics): every BN entry; never an integer counter or a trained convolution."""
    from neurofed.trainer.fl.fedbuff import async_value_keys
    from neurofed.trainer.fl.server import downlink
    from neurofed.trainer.models import build_model

    want = {"fedavg": {f"{bn}.{s}" for bn in ("bnorm_temporal", "bnorm_1", "bnorm_2")
                       for s in ("running_mean", "running_var")},
            "fedbs": {f"{bn}.{s}" for bn in ("bnorm_temporal", "bnorm_1", "bnorm_2") for s in ("weight", "bias")}}
    for name, keys in want.items():
        st = get_strategy(name)
        model = build_model("eegnet", n_channels=4, n_classes=2, n_times=160, sfreq=80.0, bn_mode=st.bn_mode)
        state = dict(model.state_dict())
        assert async_value_keys(state, downlink(state, st, model)) == keys


def test_sam_under_async_carries_its_measured_caveat(caplog):
    """FedBS with SAM runs asynchronously (not refused) with one warning line naming the study; without SAM, none."""
    from neurofed.trainer.fl.fedbuff import async_caveat

    with caplog.at_level("WARNING", logger="neurofed.trainer"):
        check_async(get_strategy("fedbs"))
    assert len(caplog.records) == 1 and "studies/async" in caplog.records[0].message
    assert "\n" not in caplog.records[0].message
    assert async_caveat(get_strategy("fedbs", sam_rho=0.0)) is None and async_caveat(get_strategy("fedavg")) is None
