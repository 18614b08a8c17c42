"""FedAvgM (server momentum): the rule on a hand-computed case, FedAvg as its special case, composition."""

from __future__ import annotations

import torch

from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import ServerState, server_extras_for_clients, server_update
from neurofed.trainer.fl.strategies import get_strategy


def _round(server, values, st):
    ups = [(f"c{i}", ClientUpdate({"w": torch.tensor(v), "n": torch.tensor(3)}, 1)) for i, v in enumerate(values)]
    return server_update(server, ups, st, 2)


def test_momentum_rule_by_hand():
    st = get_strategy("fedavgm", server_momentum=0.5, server_lr=2.0)
    s0 = ServerState({"w": torch.tensor([1.0, 0.0]), "n": torch.tensor(0)})
    s1 = _round(s0, [[0.0, 0.0], [0.0, 2.0]], st)  # mean (0, 1): d = (1, -1), v = d, w = w - 2v
    torch.testing.assert_close(s1.global_state["w"], torch.tensor([-1.0, 2.0]))
    torch.testing.assert_close(s1.extras["fedavgm_v.w"], torch.tensor([1.0, -1.0]))
    assert s1.global_state["n"].item() == 3  # integer counters: the aggregated value
    s2 = _round(s1, [[-1.0, 2.0], [-1.0, 2.0]], st)  # mean = w: d = 0, v = 0.5 v, w = w - 2 * 0.5 v
    torch.testing.assert_close(s2.global_state["w"], torch.tensor([-2.0, 3.0]))
    assert server_extras_for_clients(s2, st) == {}  # the momentum buffer stays on the server


def test_zero_momentum_unit_lr_is_fedavg():
    assert get_strategy("fedavgm", server_momentum=0.0, clip_mult=0).components == ()
    s0 = ServerState({"w": torch.tensor([1.0, 0.0]), "n": torch.tensor(0)})
    a = _round(s0, [[0.0, 0.5], [2.0, 1.0]], get_strategy("fedavgm", server_momentum=0.0))
    b = _round(s0, [[0.0, 0.5], [2.0, 1.0]], get_strategy("fedavg"))
    assert torch.equal(a.global_state["w"], b.global_state["w"])


def test_composes_with_fedbs_on_real_data(subjects4):
    clients = {sd.subject: sd for sd in subjects4}
    st = get_strategy("fedbs", server_momentum=0.9)
    assert [type(c).__name__ for c in st.components] == ["SAM", "ServerMomentum", "Robust"]
    model, info = run_federated(clients, "eegnet", st, LocalConfig(local_epochs=1), 2, 0.5, 0)
    v = {k: t for k, t in info["server"].extras.items() if k.startswith("fedavgm_v.")}
    assert set(v) == {f"fedavgm_v.{k}" for k, t in model.state_dict().items() if t.is_floating_point()}
    assert all(torch.isfinite(t).all() for t in model.state_dict().values() if t.is_floating_point())
