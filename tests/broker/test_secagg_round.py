"""The coordinator's secure-aggregation round in process (broker/secagg_round.py) with the real client sessions.

No transport: the round's ``send`` hook and the sessions' outputs are routed by hand (the MQTT paths are
tests/broker/test_secagg_mqtt.py and test_secagg_swarm.py). Checks the compact wire (schema 3): keys and
shares as base64 blobs, neighbours by roster index, and that every malformed blob is refused with one line.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neurofed.broker.protocol import (
    SaKeysMsg,
    SaRevealMsg,
    SaSharesMsg,
    SecAggSpec,
    TaskMsg,
    decode,
    encode,
    new_id,
)
from neurofed.broker.rounds import RoundState, SeenIds
from neurofed.broker.secagg_round import SecAggRound
from neurofed.broker.validation import Rejected, UpdateRules
from neurofed.edge.secagg_client import SecAggSession
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.secagg import B_SHARE_LEN, SEALED_LEN, b64, unb64

FED, N, SEED = "f", 6, 3


def _setup(n: int = N):
    ids = [f"c{i}" for i in range(1, n + 1)]
    tid = new_id()
    g0 = {"w": torch.zeros(5)}
    spec = SecAggSpec(neighbours=4, threshold=0.5, bound=8.0, n_ref=10 * n)
    rules = UpdateRules(round=0, task_id=tid, base_sha256="", selected=frozenset(ids), state_specs={}, extra_specs={},
                        global_state=g0)
    sent: list[tuple[str, bytes]] = []
    sa = SecAggRound.from_round(RoundState(0, tid, ids, rules, 60.0), federation=FED, spec=spec, collect_s=60.0,
                                phase_s=10.0, graph_seed=SEED, send=lambda t, p: sent.append((t, p)))
    task = TaskMsg(federation=FED, sender="coordinator", round=0, rounds_total=1, task_id=tid, selected=ids,
                   deadline_s=60, seed=0, strategy="fedavg", secagg=spec)
    ss = {c: SecAggSession(FED, c, task, np.random.default_rng(i)) for i, c in enumerate(ids)}
    return sa, ss, sent, g0


def _offer(sa: SecAggRound, msg, tensors=None, seen: SeenIds | None = None) -> None:
    """Through the wire format: encode, decode, offer."""
    m, t = decode(encode(msg, tensors))
    sa.offer_secagg(m, t, 0, seen if seen is not None else SeenIds())


def _deliver(sa, ss, sent, seen) -> list:
    """Every message the round sent goes to its client's session; returns what the sessions answered."""
    out = []
    for topic, payload in sent:
        cid = topic.rsplit("/", 1)[-1]
        out += [(cid, m, t) for m, t in ss[cid].step(decode(payload)[0])]
    sent.clear()
    return out


def _until_shares(sa, ss, sent, seen):
    for c, s in ss.items():
        if c not in sa.keys:
            _offer(sa, s.keys_msg(), seen=seen)
    assert sa.complete(1) is False and sa.phase == "shares"
    return _deliver(sa, ss, sent, seen)


def test_compact_round_recovers_the_exact_mean():
    rng = np.random.default_rng(0)
    sa, ss, sent, g0 = _setup()
    seen = SeenIds()
    deltas = {c: torch.from_numpy(rng.normal(0, 0.01, 5)).float() for c in ss}
    shares = _until_shares(sa, ss, sent, seen)
    assert len(sent) == 0 and all(m.kind == "sa_shares" for _, m, _ in shares)
    for cid, m, _ in shares:
        assert len(unb64(m.shares, SEALED_LEN * 4, "shares")) == SEALED_LEN * 4  # one 49-byte record per neighbour
        _offer(sa, m, seen=seen)
    sa.complete(1)
    assert sa.phase == "masked"
    for c, s in ss.items():
        s.set_update(ClientUpdate({"w": g0["w"] + deltas[c]}, 10, {}, {"loss": 0.5}), g0)
    masked = _deliver(sa, ss, sent, seen)
    assert {m.kind for _, m, _ in masked} == {"sa_masked"} and len(masked) == N
    for _, m, t in masked:
        _offer(sa, m, t, seen)
    sa.complete(1)
    for _, m, _ in _deliver(sa, ss, sent, seen):
        assert m.kind == "sa_reveal" and m.key_shares == ""
        _offer(sa, m, seen=seen)
    assert sa.complete(1) and sa.failure == ""
    want = sum(deltas.values()) / N
    np.testing.assert_allclose(sa.total.state["w"].numpy(), want.numpy(), atol=1e-6)


def test_malformed_compact_messages_get_one_line_rejections():
    sa, ss, sent, g0 = _setup()
    seen = SeenIds()
    s1 = ss["c1"]
    k = s1.keys_msg()
    with pytest.raises(Rejected) as e:  # its own pair reused
        _offer(sa, k.model_copy(update={"mask_pk": k.channel_pk, "msg_id": new_id()}), seen=seen)
    assert e.value.code == "bad_secagg" and "reused" in e.value.detail
    _offer(sa, k, seen=seen)
    with pytest.raises(Rejected) as e:  # a key another client advertised
        _offer(sa, SaKeysMsg(**ss["c2"]._head(), channel_pk=ss["c2"].keys_msg().channel_pk, mask_pk=k.mask_pk), seen=seen)
    assert e.value.code == "bad_secagg" and "another client's" in e.value.detail
    with pytest.raises(Rejected) as e:
        _offer(sa, k.model_copy(update={"msg_id": new_id()}), seen=seen)
    assert e.value.code == "duplicate"
    shares = _until_shares(sa, ss, sent, seen)
    cid, m, _ = shares[0]
    raw = unb64(m.shares, SEALED_LEN * 4, "shares")
    for bad, why in ((b64(raw[:-1]), "is 195 bytes, expected 196"), (b64(raw + raw[:SEALED_LEN]), "expected 196"),
                     ("AAAAA", "not base64")):
        with pytest.raises(Rejected) as e:
            _offer(sa, SaSharesMsg(**ss[cid]._head(), shares=bad), seen=seen)
        assert e.value.code == "bad_secagg" and why in e.value.detail and "\n" not in e.value.detail
        assert "sealed shares" in e.value.detail
    assert cid not in sa.sealed  # nothing kept from the refused messages
    for c, m, _ in shares:
        _offer(sa, m, seen=seen)
    with pytest.raises(Rejected) as e:
        _offer(sa, shares[0][1].model_copy(update={"msg_id": new_id()}), seen=seen)
    assert e.value.code == "duplicate"
    sa.complete(1)  # every member shared: the round moves on to the masked inputs
    with pytest.raises(Rejected) as e:
        _offer(sa, shares[0][1].model_copy(update={"msg_id": new_id()}), seen=seen)
    assert e.value.code == "secagg_phase"
    for s in ss.values():
        s.set_update(ClientUpdate({"w": g0["w"] + 0.01}, 10, {}, {"loss": 0.5}), g0)
    for _, m, t in _deliver(sa, ss, sent, seen):
        _offer(sa, m, t, seen)
    sa.complete(1)
    reveals = _deliver(sa, ss, sent, seen)
    cid, m, _ = reveals[0]
    raw = unb64(m.b_shares, B_SHARE_LEN * 4, "b")
    wrong_x = bytes([raw[0] % 4 + 1]) + raw[1:]  # the first share claims another holder's x-coordinate
    for bad, why in ((b64(raw[:-B_SHARE_LEN]), "revealed self-mask shares (4 x 17 bytes) is 51 bytes"),
                     (b64(wrong_x), "not this holder's")):
        with pytest.raises(Rejected) as e:
            _offer(sa, SaRevealMsg(**ss[cid]._head(), b_shares=bad, key_shares=""), seen=seen)
        assert e.value.code == "bad_secagg" and why in e.value.detail, e.value.detail
    with pytest.raises(Rejected) as e:  # a key share for a neighbour that survived
        _offer(sa, SaRevealMsg(**ss[cid]._head(), b_shares=m.b_shares, key_shares=b64(raw[:B_SHARE_LEN])), seen=seen)
    assert e.value.code == "bad_secagg" and "revealed key shares (0 x 17 bytes) is 17 bytes" in e.value.detail
    for _, m, _ in reveals:
        _offer(sa, m, seen=seen)
    assert sa.complete(1) and sa.failure == ""
    np.testing.assert_allclose(sa.total.state["w"].numpy(), 0.01, atol=1e-6)
