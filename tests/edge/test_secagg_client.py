"""The client's side of a secure-aggregation round refuses what would weaken it (edge/secagg_client.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neurofed.broker.protocol import SaInboxMsg, SaRosterMsg, SaUnmaskMsg, SecAggSpec, TaskMsg, new_id
from neurofed.edge.secagg_client import SecAggSession
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.secagg import SEALED_LEN, SecAggError, b64, graph_params, neighbour_graph, unb64

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
    keys = b"".join(unb64(ss[f"c{v}"].keys_msg().channel_pk, 32, "c") + unb64(ss[f"c{v}"].keys_msg().mask_pk, 32, "m")
                    for v in sorted(g[me]))
    fields = {"federation": FED, "sender": "coordinator", "round": 0, "task_id": task.task_id, "size": N, "index": me,
              "graph_seed": SEED, "neighbours": k, "threshold": t, "keys": b64(keys)}
    fields.update(change)
    return SaRosterMsg(**fields)


def _sealed(task, ss) -> dict[int, dict[int, bytes]]:
    """Every client's roster step: sender index -> {recipient index: sealed share} (the coordinator's routing)."""
    out = {}
    for c, s in ss.items():
        blob = s.step(_roster(task, ss, c))[0][0].shares
        raw = unb64(blob, SEALED_LEN * len(s.neighbours), "shares")
        out[s.index] = {v: raw[SEALED_LEN * j:SEALED_LEN * (j + 1)] for j, v in enumerate(s.neighbours)}
    return out


def _inbox(task, sealed, me: int, swap: bool = False) -> SaInboxMsg:
    senders = sorted(u for u, sh in sealed.items() if me in sh)
    shares = [sealed[u][me] for u in senders]
    if swap:  # the first sender's share sealed to another client instead
        shares[0] = next(v for to, v in sealed[senders[0]].items() if to != me)
    return SaInboxMsg(federation=FED, sender="coordinator", round=0, task_id=task.task_id, senders=senders,
                      shares=b64(b"".join(shares)))


def _through_masked(task, ss):
    """Roster -> shares -> inbox -> masked for every client; returns the sessions' masked outputs."""
    sealed = _sealed(task, ss)
    out = {}
    for c, s in ss.items():
        s.step(_inbox(task, sealed, s.index))
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
    keys = unb64(_roster(task, ss, "c1").keys, 64 * 2, "keys")  # c1's 2 neighbours' key pairs
    with pytest.raises(SecAggError, match="neighbour keys .* is 192 bytes, expected 128"):
        ss["c1"].step(_roster(task, ss, "c1", keys=b64(keys + keys[:64])))  # a third neighbour c1 does not have
    with pytest.raises(SecAggError, match="repeats a public key"):
        ss["c1"].step(_roster(task, ss, "c1", keys=b64(keys[:64] * 2)))
    with pytest.raises(SecAggError, match="not base64"):
        ss["c1"].step(_roster(task, ss, "c1", keys="A"))
    assert not ss["c1"].index  # nothing was taken from the refused rosters
    assert ss["c1"].step(_roster(task, ss, "c1"))[0][0].kind == "sa_shares"
    assert ss["c1"].neighbours == sorted(neighbour_graph(N, 2, SEED)[1])  # from the seeded graph, not the roster


def test_unmask_requests_that_would_reveal_both_shares_or_too_little_are_refused():
    task = _task()
    ss = _sessions(task)
    _through_masked(task, ss)
    s = ss["c1"]
    nb = s.neighbours
    head = {"federation": FED, "sender": "coordinator", "round": 0, "task_id": task.task_id}
    with pytest.raises(SecAggError, match="names a client twice"):
        s.step(SaUnmaskMsg(**head, survivors=nb, dropped=nb[:1]))  # b and key share of the same neighbour
    with pytest.raises(SecAggError, match="ascending"):
        s.step(SaUnmaskMsg(**head, survivors=nb[::-1], dropped=[]))
    with pytest.raises(SecAggError, match="threshold"):
        s.step(SaUnmaskMsg(**head, survivors=nb[:1], dropped=nb[1:]))  # 1 survivor < t = 2
    reveal = s.step(SaUnmaskMsg(**head, survivors=nb, dropped=[]))[0][0]
    b = unb64(reveal.b_shares, 17 * len(nb), "b shares")  # index + 16 bytes per surviving neighbour, in order
    assert [b[17 * j] for j in range(len(nb))] == [s.inbox[v].b_share[0] for v in nb] and reveal.key_shares == ""
    with pytest.raises(SecAggError, match="second one"):
        s.step(SaUnmaskMsg(**head, survivors=nb[:1], dropped=nb[1:]))  # asked again, now to reveal a key share


def test_an_inbox_with_a_forged_share_is_refused():
    task = _task()
    ss = _sessions(task)
    sealed = _sealed(task, ss)
    with pytest.raises(SecAggError, match="does not authenticate"):
        ss["c1"].step(_inbox(task, sealed, 1, swap=True))
    good = _inbox(task, sealed, 1)
    with pytest.raises(SecAggError, match="sealed shares .* expected 98"):
        ss["c1"].step(good.model_copy(update={"shares": good.shares[:-8]}))  # a truncated blob
    with pytest.raises(SecAggError, match="not this client's neighbours"):
        ss["c1"].step(good.model_copy(update={"senders": [1, 2]}))  # itself is not its neighbour
    assert not ss["c1"].inbox
    ss["c1"].step(good)
    assert sorted(ss["c1"].inbox) == good.senders
