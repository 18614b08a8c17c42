"""Server-side weight averaging (``swa_decay``, :mod:`neurofed.trainer.fl.algorithms.swa`): training unchanged, the
released model is the exponential moving average of the global models, it goes last among the server rules, and it
is what a run evaluates and saves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import ServerState, server_update
from neurofed.trainer.fl.strategies import get_strategy

pytestmark = pytest.mark.unit


def _run(subjects, rounds: int, **overrides):
    clients = {sd.subject: sd for sd in subjects}
    return run_federated(clients, "eegnet", get_strategy("safe", **overrides), LocalConfig(local_epochs=1), rounds,
                         0.5, 3)


def test_off_by_default_and_range():
    assert not get_strategy("safe").releases_average
    assert get_strategy("fedbs", swa_decay=0.9).releases_average
    for bad in (1.0, 1.5):
        with pytest.raises(ValueError, match="swa_decay"):
            get_strategy("fedbs", swa_decay=bad)


def test_training_unchanged_and_release_is_the_moving_average(subjects4):
    plain, _ = _run(subjects4, 2)
    model, info = _run(subjects4, 2, swa_decay=0.25)
    trained = info["trained_states"][""]
    ref = plain.state_dict()
    assert all(torch.equal(trained[k], ref[k]) for k in ref)  # the clients trained exactly the same weights
    # the average by hand: the global states after rounds 1 and 2 (the same run stopped earlier, and this one)
    states = [_run(subjects4, 1)[0].state_dict(), ref]
    for k, v in model.state_dict().items():
        if not v.is_floating_point():
            assert torch.equal(v, states[-1][k])
            continue
        want = 0.25 * states[0][k].double() + 0.75 * states[1][k].double()
        assert torch.allclose(v.double(), want, atol=1e-6), k
    assert any(not torch.allclose(model.state_dict()[k], ref[k]) for k in ref if ref[k].is_floating_point())
    assert all("bca_global" not in p for p in info["curve"])  # no held-out subjects given: nothing evaluated


def test_average_goes_after_server_momentum():
    """With FedAvgM the average is taken of the round's final state (after the momentum step)."""
    g = {"w": torch.zeros(3), "n": torch.tensor(0)}
    st = get_strategy("fedavg", swa_decay=0.5, server_momentum=0.9)
    server = ServerState(dict(g))
    for r in range(2):
        upd = ClientUpdate({"w": torch.full((3,), float(r + 1)), "n": torch.tensor(r + 1)}, 10, {}, {})
        server = server_update(server, [("a", upd)], st, 1)
        if r == 0:
            first = server.global_state["w"].clone()
    released = st.released_state(server.global_state, server.extras)
    assert torch.allclose(released["w"], 0.5 * first + 0.5 * server.global_state["w"])
    assert int(released["n"]) == int(server.global_state["n"])
    assert np.isclose(float(first[0]), 1.0)  # round 1: the momentum step equals the average update


def test_initial_state_released_before_any_round():
    st = get_strategy("fedavg", swa_decay=0.9)
    g = {"w": torch.ones(2)}
    assert torch.equal(st.released_state(g, {})["w"], g["w"])
    with pytest.raises(ValueError, match="lacks"):
        st.released_state({"w": torch.ones(2), "v": torch.ones(1)}, {"swa.w": torch.ones(2)})
