"""FedBM over a real Mosquitto: a task whose frozen classifier or generator does not fit the clients' model is
refused by every client with one clear error, and nothing is trained or uploaded; the round's metrics report
the strategy extras' bytes per component."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from neurofed.broker import coordinator as coordinator_mod
from neurofed.broker.coordinator import Coordinator, FederationError
from neurofed.broker.protocol import Topics, decode
from neurofed.broker.transport import MqttTransport
from neurofed.edge.federation import EdgeClient
from neurofed.trainer.fl.server import server_extras_for_clients
from tests.broker.test_hostile import Bg, make_cfg

GEN = {"fedbm_gen_every": 1, "fedbm_gen_iters": 1}


def _three_classes(extras: dict) -> dict:
    d = extras["fedbm_cls.mean"].shape[1]
    return {**extras, "fedbm_cls.mean": torch.randn(3, d), "fedbm_cls.var": torch.rand(3, d)}


def _small_generator(extras: dict) -> dict:  # hidden 32 where the task's fedbm_gen_hidden says 64
    w = extras["fedbm_gen.net.0.weight"]
    out = {k: v for k, v in extras.items() if not k.startswith("fedbm_gen.net.")}
    out.update({"fedbm_gen.net.0.weight": torch.zeros(32, w.shape[1]), "fedbm_gen.net.0.bias": torch.zeros(32),
                "fedbm_gen.net.2.weight": torch.zeros(extras["fedbm_gen.net.2.weight"].shape[0], 32),
                "fedbm_gen.net.2.bias": extras["fedbm_gen.net.2.bias"]})
    return out


def _no_classifier(extras: dict) -> dict:
    return {k: v for k, v in extras.items() if not k.startswith("fedbm_cls.")}


@pytest.mark.slow
@pytest.mark.parametrize(("corrupt", "expect"), [
    (_three_classes, "the frozen classifier has 3 classes, the model 2"),
    (_small_generator, "generator payload of shapes"),
    (_no_classifier, "without the frozen concept classifier"),
], ids=["classifier-3-classes", "generator-wrong-shape", "classifier-missing"])
def test_bad_fedbm_task_extras_are_refused_and_nothing_is_trained(subjects4, mosquitto, fed_name, tmp_path,
                                                                 monkeypatch, corrupt, expect):
    url = mosquitto.url
    monkeypatch.setattr(coordinator_mod, "server_extras_for_clients",
                        lambda server, strategy: corrupt(server_extras_for_clients(server, strategy)))
    cfg = make_cfg(fed_name, tmp_path / "out", strategy="fedbm", strategy_overrides=GEN, round_deadline_s=8,
                   max_round_retries=0)
    topics = Topics(fed_name)
    spy = MqttTransport(url, "spy").connect()
    spy.subscribe(topics.any_client("error"))
    spy.subscribe(topics.any_client("update"))
    coord = Coordinator(cfg, url)
    ct = Bg(coord.run)
    sd = {s.subject: s for s in subjects4[:2]}
    stop = threading.Event()
    edges = [EdgeClient(url, fed_name, cid, lambda spec, cid=cid: sd[cid], tmp_path / "state", join_timeout=60)
             for cid in sorted(sd)]
    runs = [Bg(lambda e=e: e.run(stop=stop, max_seconds=90)) for e in edges]
    try:
        with pytest.raises(FederationError, match="fewer than 1 updates"):
            ct.result(120)
    finally:
        stop.set()
    assert [r.result(30) for r in runs] == [0, 0]  # no client trained a round
    # the clients have stopped: whatever they published is on its way; read until both errors are in, then
    # whatever else is queued
    errors, updates, end = {}, [], time.monotonic() + 15
    while True:
        item = spy.get(0.1 if set(errors) != set(sd) and time.monotonic() < end else 0.0)
        if item is None:
            if set(errors) == set(sd) or time.monotonic() >= end:
                break
            continue
        if item.event != "message" or not item.payload:
            continue
        msg, _ = decode(item.payload)
        if msg.kind == "error" and msg.sender in sd:
            errors[msg.sender] = msg
        elif msg.kind == "update":
            updates.append(msg.sender)
    spy.close()
    assert updates == []
    assert set(errors) == set(sd)
    for e in errors.values():
        assert e.code == "task_failed" and expect in e.message and e.round == 0, e
    assert coord.server.round == 0 and coord.metrics == []


@pytest.mark.slow
def test_generator_is_sent_only_when_it_changes_and_its_bytes_are_reported(subjects4, mosquitto, fed_name, tmp_path):
    """fedbm_gen_every 2 over 3 rounds: the generator goes out in round 1 (initial) and round 3 (retrained after
    round 2), not in round 2; the frozen classifier rides in every task; bytes per component in the metrics."""
    url = mosquitto.url
    cfg = make_cfg(fed_name, tmp_path / "out", rounds=3, strategy="fedbm",
                   strategy_overrides={"fedbm_gen_every": 2, "fedbm_gen_iters": 1, "fedbm_gen_hidden": 16})
    coord = Coordinator(cfg, url)
    ct = Bg(coord.run)
    sd = {s.subject: s for s in subjects4[:2]}
    edges = [EdgeClient(url, fed_name, cid, lambda spec, cid=cid: sd[cid], tmp_path / "state", join_timeout=60)
             for cid in sorted(sd)]
    runs = [Bg(lambda e=e: e.run(max_seconds=120)) for e in edges]
    ct.result(150)
    assert [r.result(30) for r in runs] == [3, 3]
    s = coord.spec
    net = 4 * (16 * (384 + 16) + 16 + s.n_channels * s.n_times * 16 + s.n_channels * s.n_times)
    stats = 4 * 2 * 2 * 384  # the concept mean and variance the generator samples from
    ready = 8  # the int64 `fedbm_gen.ready` flag rides in every task
    assert [m["bytes_extras"]["fedbm_gen"] for m in coord.metrics] == [net + stats + ready, ready, net + stats + ready]
    assert all(m["bytes_extras"]["fedbm_cls"] == 4 * (2 * 2 * 384 + 1) for m in coord.metrics)
    # the retained extras message is counted in the round it is published
    assert coord.metrics[0]["bytes_down"] - coord.metrics[1]["bytes_down"] > 0.5 * (net + stats)
    # both clients hold the final generator, the one the coordinator has
    want = {k: v for k, v in coord.server.extras.items() if k.startswith(("fedbm_gen.net.", "fedbm_gen.concept_"))}
    for e in edges:
        assert e.cached.keys() == want.keys()
        assert all(torch.equal(e.cached[k], want[k]) for k in want)
