"""Robust aggregation (clipping, median, trimmed mean, Krum), client-level DP and simulated attackers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl.algorithms.dp import dp_epsilon, noise_for_epsilon
from neurofed.trainer.fl.byzantine import Byzantine
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import CLIPPED_KEY, ServerState, server_update
from neurofed.trainer.fl.strategies import get_strategy

G = {"w": torch.zeros(3), "n": torch.tensor(0)}


def _agg(values, weights=None, **over):
    """One round of ``fedavg`` with ``over``; clipping off unless asked (the rules are pinned alone)."""
    over.setdefault("clip_mult", 0.0)
    weights = weights or [1] * len(values)
    ups = [(f"c{i}", ClientUpdate({"w": torch.tensor(v, dtype=torch.float32), "n": torch.tensor(i)}, n))
           for i, (v, n) in enumerate(zip(values, weights))]
    return server_update(ServerState(dict(G)), ups, get_strategy("fedavg", **over), len(values)).global_state


def test_median_trimmed_mean_and_krum_by_hand():
    vals = [[1.0, 0.0, 5.0], [2.0, 0.0, 5.0], [3.0, 0.0, 5.0], [1000.0, -1000.0, 5.0]]
    torch.testing.assert_close(_agg(vals, aggregator="median")["w"], torch.tensor([2.5, 0.0, 5.0]))
    torch.testing.assert_close(_agg(vals, aggregator="trimmed_mean", trim_fraction=0.25)["w"],
                               torch.tensor([2.5, 0.0, 5.0]))
    # Krum (f = 1 needs n >= 2f + 3 = 5): the outlier is never chosen; the most central honest update is
    vals5 = [[1.0, 0.0, 5.0], [2.0, 0.0, 5.0], [3.0, 0.0, 5.0], [2.0, 0.0, 5.0], [1000.0, -1000.0, 5.0]]
    torch.testing.assert_close(_agg(vals5, aggregator="krum", krum_f=1)["w"], torch.tensor([2.0, 0.0, 5.0]))
    # Multi-Krum keeps the n - f = 4 best and weights them by trial counts
    torch.testing.assert_close(_agg(vals5, [1, 1, 2, 1, 1], aggregator="multi_krum", krum_f=1)["w"],
                               torch.tensor([(1 + 2 + 6 + 2) / 5, 0.0, 5.0]))
    # too few updates for the assumed f: f is clamped to (n - 3) // 2 (here 0: Multi-Krum = mean)
    torch.testing.assert_close(_agg(vals, aggregator="multi_krum", krum_f=1)["w"], _agg(vals)["w"])
    assert _agg(vals, aggregator="median")["n"].item() == 3  # integer counters: the maximum


def test_adaptive_clipping_bounds_outliers_and_leaves_honest_updates_bit_exact():
    vals = [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [400.0, 0.0, 0.0]]
    out = _agg(vals, clip_mult=2.0)["w"]  # median norm 2.5 -> bound 5: the last update is scaled to norm 5
    torch.testing.assert_close(out, torch.tensor([(1 + 5) / 4, 2 / 4, 3 / 4]))
    same = [[1.0, 0.5, 0.0], [0.0, 2.0, 0.25]]
    assert torch.equal(_agg(same, clip_mult=3.0)["w"], _agg(same)["w"])


def test_clipping_is_on_by_default_and_dp_replaces_it():
    assert [type(c).__name__ for c in get_strategy("fedbs").components] == ["SAM", "Robust"]
    assert get_strategy("fedavg", clip_mult=0).components == ()
    assert [type(c).__name__ for c in get_strategy("fedavg", dp_clip=1.0).components] == ["ClientDP"]
    ups = [(f"c{i}", ClientUpdate({"w": torch.tensor(v)}, 1)) for i, v in enumerate([[1.0, 0.0], [0.0, 2.0], [90.0, 0.0]])]
    out = server_update(ServerState({"w": torch.zeros(2)}), ups, get_strategy("fedavg"), 3).global_state["w"]
    torch.testing.assert_close(out, torch.tensor([(1 + 3) / 3, 2 / 3]))  # 90 clipped to 1.5 x median norm 2


def test_clipped_updates_are_counted_over_the_run_and_only_when_clipping_is_on():
    def ups(vals):
        return [(f"c{i}", ClientUpdate({"w": torch.tensor(v)}, 1)) for i, v in enumerate(vals)]

    s = ServerState({"w": torch.zeros(2)})
    s = server_update(s, ups([[1.0, 0.0], [0.0, 2.0], [90.0, 0.0]]), get_strategy("fedavg"), 3)
    assert int(s.extras[CLIPPED_KEY]) == 1  # the 90 of round 1
    honest = [[v + s.global_state["w"][0].item(), s.global_state["w"][1].item()] for v in (1.0, 1.5, 2.0)]
    s = server_update(s, ups(honest), get_strategy("fedavg"), 3)
    assert int(s.extras[CLIPPED_KEY]) == 1  # round 2 clipped none: the count runs on, unchanged
    s = server_update(s, ups([[0.0, 1.0], [0.0, 1.2], [-50.0, 0.0], [0.0, 80.0]]), get_strategy("fedavg"), 4)
    assert int(s.extras[CLIPPED_KEY]) == 3  # two more in round 3
    off = server_update(ServerState({"w": torch.zeros(2)}), ups([[1.0, 0.0], [90.0, 0.0]]),
                        get_strategy("fedavg", clip_mult=0), 2)
    assert CLIPPED_KEY not in off.extras  # no clipping rule: no count (not a misleading 0)


def test_only_one_aggregation_rule():
    with pytest.raises(ValueError, match="both replace the server's aggregation rule"):
        get_strategy("fedavg", aggregator="median", dp_clip=1.0)
    with pytest.raises(ValueError, match="dp_noise needs dp_clip"):
        get_strategy("fedavg", dp_noise=1.0)


def test_dp_fedavg_clips_adds_seeded_noise_and_accounts():
    vals = [[3.0, 4.0, 0.0], [0.0, 0.0, 0.5]]  # norms 5 and 0.5; clip 1 -> (0.6, 0.8, 0) and (0, 0, 0.5)
    exact = _agg(vals, dp_clip=1.0, dp_noise=0.0)["w"]
    torch.testing.assert_close(exact, torch.tensor([0.3, 0.4, 0.25]))  # unweighted mean of clipped updates
    a = _agg(vals, [5, 1], dp_clip=1.0, dp_noise=1.0)["w"]
    assert torch.equal(a, _agg(vals, [5, 1], dp_clip=1.0, dp_noise=1.0)["w"])  # seeded (dp_seed, round)
    assert not torch.equal(a, _agg(vals, dp_clip=1.0, dp_noise=1.0, dp_seed=1)["w"])
    assert dp_epsilon(2.0, 0.5, 50, 1e-5) < dp_epsilon(1.0, 0.5, 50, 1e-5)  # more noise, less privacy loss
    z = noise_for_epsilon(8.0, 0.5, 20, 1e-5)
    assert dp_epsilon(z, 0.5, 20, 1e-5) <= 8.0 < dp_epsilon(z - 0.01, 0.5, 20, 1e-5)


def test_byzantine_specs_and_poisoning():
    b = Byzantine.parse("0.25:scale:10", seed=3)
    ids = [f"S{i:03d}" for i in range(1, 9)]
    assert len(b.attackers(ids)) == 2 and b.attackers(ids) == b.attackers(list(reversed(ids)))
    g = {"w": torch.ones(2)}
    up = ClientUpdate({"w": torch.tensor([2.0, 1.0])}, 5)
    torch.testing.assert_close(b.poison(up, g).state["w"], torch.tensor([11.0, 1.0]))
    torch.testing.assert_close(Byzantine.parse("0.1:signflip").poison(up, g).state["w"], torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(Byzantine.parse("0.1:huge").poison(up, g).state["w"], torch.tensor([2000.0, 1000.0]))
    np.testing.assert_array_equal(Byzantine.parse("0.1:labelflip").labels(np.array([0, 1, 1]), 2), [1, 0, 0])
    with pytest.raises(ValueError, match="FRACTION:ATTACK"):
        Byzantine.parse("0.2:boom")


def test_median_survives_a_1000x_client_on_real_data(subjects4):
    clients = {sd.subject: sd for sd in subjects4}
    cfg = LocalConfig(local_epochs=1)
    byz = Byzantine.parse("0.25:huge")
    plain, _ = run_federated(clients, "eegnet", get_strategy("fedavg", clip_mult=0), cfg, 2, 1.0, 0, byzantine=byz)
    robust, info = run_federated(clients, "eegnet", get_strategy("fedavg", aggregator="median"), cfg, 2, 1.0, 0,
                                 byzantine=byz)
    norm = lambda m: float(sum(p.detach().double().norm() ** 2 for p in m.parameters()) ** 0.5)  # noqa: E731
    assert len(info["attackers"]) == 1
    assert norm(plain) > 50 * norm(robust)  # the mean takes a 1000x update; the median does not
    # the default clip (on under the median too) caught the attacker in both rounds, no honest client; counted for the job
    assert info["server_cost"]["robust.stat_clipped"] == 2
