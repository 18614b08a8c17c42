"""The client's side of a secure-aggregation round refuses what would weaken it (edge/secagg_client.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from broker.protocol import SaInboxMsg, SaRosterMsg, SaUnmaskMsg, SecAggSpec, TaskMsg, new_id
from edge.secagg_client import SecAggSession
from trainer.fl.client import ClientUpdate
from trainer.fl.secagg import SecAggError, graph_params, neighbour_graph

FED, N, SEED = "f", 6, 11


def _task(threshold: float = 0.5) -> TaskMsg:
    return TaskMsg(federation=FED, sender="coordinator", round=0, rounds_total=1, task_id=new_id(),
                   selected=[f"c{i}" for i in range(1, N + 1)], deadline_s=10, seed=0, strategy="fedavg",
                   secagg=SecAggSpec(neighbours=2, threshold=threshold, bound=8.0, n_ref=N * 10))


def _sessions(task: TaskMsg) -> dict[str, SecAggSession]:
    return {f"c{i}": SecAggSession(FED, f"c{i}", task, np.random.default_rng(i)) for i in range(1, N + 1)}


def _roster(task: TaskMsg, ss: dict[str, SecAggSession], cid: str, **change) -> SaRosterMsg:
    k, t = graph_params(N, 2, 0.5)
    g = neighbour_graph(N, k, SEED)
    me = int(cid[1:])
    keys = {f"c{v}": (v, ss[f"c{v}"].keys_msg().channel_pk, ss[f"c{v}"].keys_msg().mask_pk) for v in g[me]}
    fields = {"federation": FED, "sender": "coordinator", "round": 0, "task_id": task.task_id, "size": N, "index": me,
              "graph_seed": SEED, "neighbours": k, "threshold": t, "keys": keys}
    fields.update(change)
    return SaRosterMsg(**fields)


def _through_masked(task, ss):
    """Roster -> shares -> inbox -> masked for every client; returns the sessions' masked outputs."""
    sealed = {c: s.step(_roster(task, ss, c))[0][0].shares for c, s in ss.items()}
    out = {}
    for c, s in ss.items():
        inbox = {sender: sh[c] for sender, sh in sealed.items() if c in sh}
        s.step(SaInboxMsg(federation=FED, sender="coordinator", round=0, task_id=task.task_id, shares=inbox))
        upd = ClientUpdate({"w": torch.full((4,), 0.1)}, 10, {}, {"loss": 0.5})
        out[c] = s.set_update(upd, {"w": torch.zeros(4)})
    return out


def test_a_full_round_of_sessions_sends_one_masked_input_each():
    task = _task()
    ss = _sessions(task)
    out = _through_masked(task, ss)
    assert all(len(o) == 1 and o[0][0].kind == "sa_masked" and o[0][1]["masked"].dtype == torch.int32
               for o in out.values())


def test_a_roster_with_a_lowered_threshold_or_foreign_neighbours_is_refused():
    task = _task()
    ss = _sessions(task)
    with pytest.raises(SecAggError, match="is not the task's"):
        ss["c1"].step(_roster(task, ss, "c1", threshold=1))
    g = neighbour_graph(N, 2, SEED)
    stranger = min(set(range(2, N + 1)) - g[1])
    keys = dict(_roster(task, ss, "c1").keys)
    name, (_, c, m) = min(keys.items())
    keys[name] = (stranger, c, m)  # claims a neighbour the seeded graph does not give c1
    with pytest.raises(SecAggError, match="not this client's neighbours"):
        ss["c1"].step(_roster(task, ss, "c1", keys=keys))
    assert not ss["c1"].index  # nothing was taken from the refused roster


def test_unmask_requests_that_would_reveal_both_shares_or_too_little_are_refused():
    task = _task()
    ss = _sessions(task)
    _through_masked(task, ss)
    s = ss["c1"]
    nb = s.neighbours
    head = {"federation": FED, "sender": "coordinator", "round": 0, "task_id": task.task_id}
    with pytest.raises(SecAggError, match="names a client twice"):
        s.step(SaUnmaskMsg(**head, survivors=nb, dropped=nb[:1]))  # b and key share of the same neighbour
    with pytest.raises(SecAggError, match="threshold"):
        s.step(SaUnmaskMsg(**head, survivors=nb[:1], dropped=nb[1:]))  # 1 survivor < t = 2
    reveal = s.step(SaUnmaskMsg(**head, survivors=nb, dropped=[]))[0][0]
    assert set(reveal.b_shares) == set(nb) and not reveal.key_shares
    with pytest.raises(SecAggError, match="second one"):
        s.step(SaUnmaskMsg(**head, survivors=nb[:1], dropped=nb[1:]))  # asked again, now to reveal a key share


def test_an_inbox_with_a_forged_share_is_refused():
    task = _task()
    ss = _sessions(task)
    sealed = {c: s.step(_roster(task, ss, c))[0][0].shares for c, s in ss.items()}
    inbox = {sender: sh["c1"] for sender, sh in sealed.items() if "c1" in sh}
    sender = min(inbox)
    inbox[sender] = next(v for to, v in sealed[sender].items() if to != "c1")  # sealed to another client
    with pytest.raises(SecAggError, match="does not authenticate"):
        ss["c1"].step(SaInboxMsg(federation=FED, sender="coordinator", round=0, task_id=task.task_id, shares=inbox))
