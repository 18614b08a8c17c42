"""Secure aggregation over a real Mosquitto with real edge clients (threads, real EEGMMIDB trials).

* the secagg round's global model equals the plain FedAvg aggregation (``server_update``) of the same client
  updates to fixed-point precision (floating entries; see docs/security.md for integer buffers);
* a wire audit (a subscriber on ``neurofed/<fed>/#``) finds every client's update in clear in the plain run
  (so the audit works) and in none of the secagg run's messages (no body holds it; masked inputs do not
  correlate with it);
* a client killed after sharing (socket dropped, last will) is recovered: the round completes and the sum
  equals the survivors' trial-weighted mean;
* malformed, forged and out-of-phase secagg messages are rejected with their codes, and nothing of them is
  aggregated.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from neurofed.broker.config import ConfigError, config_from_dict
from neurofed.broker.coordinator import Coordinator
from neurofed.broker.protocol import (
    SCHEMA_VERSION,
    SaKeysMsg,
    SaMaskedMsg,
    SaSharesMsg,
    Topics,
    decode,
    encode,
)
from neurofed.broker.transport import MqttTransport
from neurofed.edge.federation import EdgeClient
from neurofed.trainer.fl.secagg import b64, masked_keys, unb64
from neurofed.trainer.fl.server import ServerState, server_update

ATOL = 1e-6  # fixed point: 2^-27 per coordinate and client, then float32


def _cfg(name: str, out: Path, secure: bool, phase_s: float = 5.0, strategy: str = "fedavg",
         overrides: dict | None = None):
    return config_from_dict({
        "federation": {"name": name, "rounds": 1, "fraction": 1.0, "seed": 7, "min_clients": 4, "join_timeout_s": 120,
                       "round_deadline_s": 90, "strategy": strategy,
                       "strategy_overrides": {"clip_mult": 0.0} if overrides is None else overrides,
                       "secure_aggregation": secure},
        "secagg": {"phase_s": phase_s},
        "local": {"batch_size": 16, "local_epochs": 1},
        "output": {"dir": str(out)}})


class KilledAfterSharing(EdgeClient):
    """Sends its keys and shares, then vanishes like a killed process (socket gone, no DISCONNECT: last will)."""

    def _secagg_send(self, out: list) -> None:
        super()._secagg_send(out)
        if any(m.kind == "sa_shares" for m, _ in out):
            # the broker acknowledged the shares (paho keeps a QoS-1 message until its PUBACK)
            end = time.monotonic() + 10
            while self.transport.describe()["out_queued"] and time.monotonic() < end:
                time.sleep(0.01)
            c, self.transport._client = self.transport._client, None
            c.loop_stop()
            c.socket().close()
            self.secagg = None
            self.finished = True  # leave the run loop without a clean disconnect


def _run(url: str, name: str, subjects, tmp: Path, secure: bool, kill: str | None = None, inject=None):
    cfg = _cfg(name, tmp / name, secure)
    coord = Coordinator(cfg, url, keepalive=5)
    data = {sd.subject: sd for sd in subjects}
    edges = [(KilledAfterSharing if cid == kill else EdgeClient)(url, name, cid, lambda spec, cid=cid: data[cid],
                                                                   tmp / "state" / name, keepalive=5)
             for cid in sorted(data)]
    tap = MqttTransport(url, f"tap-{name}").connect()
    tap.subscribe(Topics(name).all())
    stop = threading.Event()
    ct = threading.Thread(target=coord.run, kwargs={"stop": stop}, daemon=True)
    ets = [threading.Thread(target=e.run, kwargs={"stop": stop, "max_seconds": 240}, daemon=True) for e in edges]
    for t in [ct, *ets]:
        t.start()
    if inject is not None:
        inject(coord, url, name)
    ct.join(240)
    stop.set()
    for t in ets:
        t.join(20)
    seen = []
    while (item := tap.get(0.5)) is not None:
        if item.event == "message" and item.payload:
            seen.append((item.topic, item.payload))
    tap.close()
    assert not ct.is_alive(), "the coordinator did not finish"
    assert coord.server.round == 1, coord.metrics
    return coord, edges, seen


def _global0(cfg) -> dict[str, torch.Tensor]:
    from neurofed.broker.coordinator import initial_model

    return {k: v.detach().clone() for k, v in initial_model(cfg).state_dict().items()}


def _weighted_mean(edges, keep, keys):
    ups = {e.cid: e.state.update for e in edges if e.cid in keep}
    n = sum(u.n_samples for u in ups.values())
    return {k: sum(u.state[k].double() * u.n_samples for u in ups.values()) / n for k in keys}


def _max_diff(a, b, keys) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in keys)


def _audit(seen, edges, g0) -> tuple[int, float]:
    """(messages holding a client's update values, max |correlation| of a masked input with its client's update)."""
    from neurofed.broker.protocol import delta_reference

    keys = masked_keys(g0)
    big = max(keys, key=lambda k: g0[k].numel())  # a run of 8 float32 of each client's largest trained tensor
    fingerprints = [e.state.update.state[big].flatten()[:8].numpy().astype(np.float32).tobytes() for e in edges]
    found, corr = 0, 0.0
    for topic, payload in seen:
        msg, tensors = decode(payload, reference=delta_reference(g0) if "/update/" in topic else None)
        blobs = [payload] + [t.numpy().tobytes() for t in (tensors or {}).values()]
        found += any(fp in b for b in blobs for fp in fingerprints)
        if msg.kind == "sa_masked":
            e = next(e for e in edges if e.cid == msg.sender)
            delta = np.concatenate([(e.state.update.state[k].double() - g0[k].double()).flatten().numpy() for k in keys])
            y = tensors["masked"].numpy().view(np.uint32).astype(np.float64)
            corr = max(corr, abs(float(np.corrcoef(y[:-2], delta)[0, 1])))
    return found, corr


@pytest.mark.slow
def test_secagg_round_equals_plain_round_and_the_wire_shows_no_update(subjects4, mosquitto, fed_name, tmp_path):
    torch.set_num_threads(1)
    plain, pe, pseen = _run(mosquitto.url, fed_name + "p", subjects4, tmp_path, secure=False)
    sec, se, sseen = _run(mosquitto.url, fed_name + "s", subjects4, tmp_path, secure=True)
    g0 = _global0(sec.cfg)
    keys = masked_keys(g0)
    # the plain FedAvg aggregation (neurofed.trainer.fl.server.server_update) of the very updates the clients trained
    # (threads share torch's RNG, so two runs' updates differ; each run is compared with its own updates)
    for coord, edges in ((plain, pe), (sec, se)):
        want = server_update(ServerState(g0), [(e.cid, e.state.update) for e in edges], coord.strategy, 4)
        diff = _max_diff(coord.server.global_state, want.global_state, keys)
        assert diff <= (ATOL if coord is sec else 1e-7), diff
    assert _max_diff(sec.server.global_state, g0, keys) > 1e-3  # and the model moved
    m = sec.metrics[0]
    assert m["participants"] == sorted(sd.subject for sd in subjects4) and m["secagg"]["failure"] is None
    assert m["secagg"]["k"] == 3 and m["secagg"]["t"] == 2
    assert m["loss"] == pytest.approx(sum(e.state.update.metrics["loss"] * e.state.update.n_samples for e in se)
                                      / sum(e.state.update.n_samples for e in se), abs=1e-5)
    # wire audit: the plain run carries every client's update (the audit sees it) ...
    found, _ = _audit(pseen, pe, g0)
    assert found >= 4
    # ... the secagg run carries none: no update message, no body with its bytes, masked inputs uncorrelated
    kinds = [decode(p)[0].kind for _, p in sseen]
    assert "update" not in kinds and kinds.count("sa_masked") == 4 and kinds.count("sa_reveal") == 4
    found, corr = _audit(sseen, se, g0)
    assert found == 0
    assert corr < 0.12, corr  # 1654 coordinates: |r| of independent vectors is ~0.025


@pytest.mark.slow
def test_a_client_killed_after_sharing_is_recovered(subjects4, mosquitto, fed_name, tmp_path):
    torch.set_num_threads(1)
    gone = sorted(sd.subject for sd in subjects4)[1]
    sec, se, seen = _run(mosquitto.url, fed_name, subjects4, tmp_path, secure=True, kill=gone)
    m = sec.metrics[0]
    survivors = [c for c in sorted(sd.subject for sd in subjects4) if c != gone]
    assert m["participants"] == survivors, m
    assert m["secagg"]["shared"] == 4 and m["secagg"]["masked"] == 3 and m["secagg"]["failure"] is None
    keys = masked_keys(sec.server.global_state)
    want = _weighted_mean(se, survivors, keys)
    assert _max_diff(sec.server.global_state, want, keys) <= ATOL
    # the dropped client trained but its update is not in the sum, and the survivors revealed its key shares
    gone_index = sorted(sd.subject for sd in subjects4).index(gone) + 1  # its roster index
    asks = [decode(p)[0] for _, p in seen if decode(p)[0].kind == "sa_unmask"]
    assert len(asks) == 3 and all(a.dropped == [gone_index] and gone_index not in a.survivors for a in asks)
    reveals = [decode(p)[0] for _, p in seen if decode(p)[0].kind == "sa_reveal"]
    assert len(reveals) == 3 and all(len(unb64(r.key_shares, 17, "key share")) == 17 for r in reveals)


def _key(i: int) -> str:
    return b64(bytes([i]) * 32)


def _inject(coord, url, name):
    """While the round's keys phase is open, publish malformed and forged secagg messages."""
    t = Topics(name)
    end = time.monotonic() + 60
    while coord.current is None and time.monotonic() < end:
        time.sleep(0.05)
    rs = coord.current
    rogue = MqttTransport(url, f"rogue-{name}").connect()
    head = {"federation": name, "round": rs.index, "task_id": rs.task_id, "run_id": coord.run_id}
    target = rs.selected[0]
    bad = [
        (t.secagg(target), encode(SaKeysMsg(sender=target, **{**head, "task_id": "0" * 32},
                                            channel_pk=_key(1), mask_pk=_key(2)))),   # wrong_task
        (t.secagg("intruder"), encode(SaKeysMsg(sender="intruder", **head, channel_pk=_key(3),
                                                mask_pk=_key(4)))),                    # not_selected
        (t.secagg(target), encode(SaSharesMsg(sender=target, **head, shares="AAAA"))),  # secagg_phase
        (t.secagg(target), encode(SaMaskedMsg(sender=target, **head), {"masked": torch.zeros(3, dtype=torch.int32)})),
        (t.secagg(target), b"NF" + bytes([SCHEMA_VERSION, 0]) + (40).to_bytes(4, "big") + b'{"kind": "sa_keys", "channel_pk": "zz"}'),
        (t.secagg(target), encode(SaKeysMsg(sender="S004", **head, channel_pk=_key(5), mask_pk=_key(6)))),  # spoofed
    ]
    for topic, payload in bad:
        rogue.publish(topic, payload, wait=5)
    rogue.close()


@pytest.mark.slow
def test_malformed_secagg_messages_are_rejected_and_not_aggregated(subjects4, mosquitto, fed_name, tmp_path):
    torch.set_num_threads(1)
    sec, se, _ = _run(mosquitto.url, fed_name, subjects4, tmp_path, secure=True, inject=_inject)
    for code in ("wrong_task", "not_selected", "secagg_phase", "bad_message", "spoofed_sender"):
        assert sec.rejections[code] >= 1, dict(sec.rejections)
    keys = masked_keys(sec.server.global_state)
    want = _weighted_mean(se, [e.cid for e in se], keys)
    assert _max_diff(sec.server.global_state, want, keys) <= ATOL
    assert sec.metrics[0]["secagg"]["roster"] == 4


@pytest.mark.unit
def test_secagg_refuses_rules_that_need_single_updates(tmp_path):
    with pytest.raises(ConfigError, match="clip_mult = 0"):
        Coordinator(_cfg("x", tmp_path, True, overrides={}), "mqtt://127.0.0.1:1")
    with pytest.raises(ConfigError, match="clip_mult = 0"):
        Coordinator(_cfg("x", tmp_path, True, overrides={"clip_mult": 0.0, "aggregator": "median"}), "mqtt://127.0.0.1:1")
    with pytest.raises(ConfigError, match="uploads extra tensors"):
        Coordinator(_cfg("x", tmp_path, True, strategy="scaffold"), "mqtt://127.0.0.1:1")
    Coordinator(_cfg("x", tmp_path, True, strategy="fedbs"), "mqtt://127.0.0.1:1")  # local BN rule: fine
