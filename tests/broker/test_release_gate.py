"""Federated validation, the release gate and auto-published signed releases of an asynchronous federation.

The coordinator, two training and two validating edge clients run for real over the in-memory broker (unit tier):
every 2 versions the version is a candidate, the validating clients (``--evaluate``) report its BCA (and the current
release's) on their own trials, the gate records its decision with the statistics, and each release is exported as
a standalone ONNX graph (on the coordinator's release worker thread: updates are handled meanwhile), signed with the
federation's Ed25519 key and published retained on the release topic -
where a decoder's :class:`neurofed.edge.follow.ReleaseFollower` accepts it. The gate's rule alone: a unit test
on made-up reports.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from neurofed_runtime import release as rel

from neurofed.broker.config import ConfigError, load_config
from neurofed.broker.coordinator import Coordinator
from neurofed.broker.protocol import EvalReportMsg, Topics
from neurofed.broker.registry import Registry
from neurofed.broker.release_gate import ReleaseGate, paired_stats, read_history
from neurofed.broker.validation import Rejected
from neurofed.edge.federation import EdgeClient
from neurofed.edge.follow import ReleaseFollower
from neurofed.edge.join_cli import make_loader
from neurofed.export.decoder import StandaloneModel
from neurofed.export.standalone import export_standalone
from neurofed.trainer.checkpoint import load_checkpoint
from neurofed.trainer.evaluate import bca, predict
from tests.broker.conftest import DATA_DIR, write_toml

TRAIN, VALIDATE = (1, 2), (3, 4)


def release_toml(tmp_path, fed, key, margin=1.0, every=2):
    return write_toml(tmp_path / "federation.toml", fed, rounds=4, min_clients=2, strategy="fedavg",
                      federation_extra='mode = "async"',
                      extra=f"[async]\nbuffer_k = 2\nmax_staleness = 2\n[release]\nevery = {every}\nmin_clients = 2\n"
                            f"margin = {margin}\nwait_s = 60\nkey = \"{key}\"\n")


def test_candidates_are_validated_released_signed_and_published(memory_broker, fed_name, tmp_path):
    from tests.broker.test_hostile import Bg
    from tests.broker.test_profiles_mqtt import serialise_training

    lock = threading.Lock()  # ONNX export, training, evaluation share this torch: one at a time (as separate processes)

    priv, pub = rel.keygen(tmp_path / "keys")
    cfg = release_toml(tmp_path, fed_name, priv)
    out = tmp_path / "out"
    advanced: list[bool] = []

    def exporter(ckpt, onnx):
        if not advanced:  # release 1: the coordinator's loop goes on handling messages while a release exports
            n, end = coord.handled, time.monotonic() + 60
            while coord.handled == n and time.monotonic() < end:
                time.sleep(0.05)
            advanced.append(coord.handled > n)
        locked(lock, export_standalone, ckpt, onnx)

    coord = Coordinator(load_config(cfg), memory_broker.url, out, exporter=exporter)
    ct = Bg(coord.run)
    edges = [EdgeClient(memory_broker.url, fed_name, f"S{s:03d}", make_loader(DATA_DIR, s, None), tmp_path / "state",
                        join_timeout=60, window=30, evaluate=s in VALIDATE) for s in TRAIN + VALIDATE]
    serialise_training(edges, lock)
    runs = [Bg(lambda e=e: e.run(max_seconds=240)) for e in edges]
    ct.result(300)
    trained = [r.result(60) for r in runs]
    assert trained[:2] != [0, 0] and trained[2:] == [0, 0]  # validating clients never train
    assert [e.evaluations for e in edges[2:]] == [2, 2]
    assert advanced == [True], advanced  # release 1's export did not block the loop

    history = read_history(out / "releases")
    assert [h["version"] for h in history] == [2, 4]
    first, second = history
    assert first["released"] and first["release"] == 1 and first["parent"] is None
    assert second["released"] and second["release"] == 2 and second["parent"] == 1 and second["parent_version"] == 2
    assert second["clients"] == ["S003", "S004"] and second["n_clients"] == 2
    # the figures are the validating clients' own evaluation of the released checkpoint, recomputed here
    for h in history:
        model, meta = load_checkpoint(out / "releases" / f"v{h['release']:04d}.safetensors")
        for row in h["per_client"]:
            sd = make_loader(DATA_DIR, int(row["client"][1:]), None)(coord.spec)
            assert row["n_trials"] == len(sd.y) and sum(row["class_counts"]) == len(sd.y)
            assert row["bca"] == pytest.approx(bca(sd.y, predict(model, sd.X, 8)), abs=1e-9)
        assert h == {**h, **paired_stats({r["client"]: r for r in h["per_client"]})}
    assert second["paired_diff_mean"] == pytest.approx(
        sum(r["bca"] - r["bca_release"] for r in second["per_client"]) / 2)
    # signed, kept, published retained: the last release is on the topic, and a decoder accepts it
    kept = [rel.verify_file(out / "releases" / f"v{v:04d}.onnx", pub) for v in (1, 2)]
    assert [(r.version, r.parent) for r in kept] == [(1, None), (2, 1)]
    payload = memory_broker.retained[Topics(fed_name).release]
    follower = ReleaseFollower(pub, tmp_path / "decoder", StandaloneModel)
    got = follower.offer(payload)
    assert got is not None and got.version == 2, follower.refused
    assert second["signed"]["sha256"] == rel.unpack(payload)[1]["header"]["sha256"]
    assert Topics(fed_name).eval not in memory_broker.retained or not memory_broker.retained[Topics(fed_name).eval]
    assert json.loads((out / "metrics.json").read_text())["rejections"] == {}


def _report(eid, cid, b, r=None, n=40):
    return EvalReportMsg(federation="f", sender=cid, eval_id=eid, version=3, n_trials=n, class_counts=[n // 2, n // 2],
                         bca=b, bca_release=r)


def test_the_gate_refuses_too_few_clients_and_a_worse_candidate(tmp_path):
    import torch

    from neurofed.broker.protocol import JoinMsg

    reg = Registry()
    for c in ("a", "b", "c"):
        reg.join(JoinMsg(federation="f", sender=c, n_trials=40, n_channels=2, n_times=4, sfreq=80.0, classes=["x", "y"]))
    gate = ReleaseGate(tmp_path, min_clients=2, margin=0.02, wait_s=10)
    state = {"w": torch.ones(2)}
    gate.ask("0" * 32, 3, state, 3)
    gate.offer(_report("0" * 32, "a", 0.8), reg)
    assert not gate.passes()[0] and "fewer than min_clients 2" in gate.passes()[1]
    with pytest.raises(Rejected, match="already reported"):
        gate.offer(_report("0" * 32, "a", 0.8), reg)
    with pytest.raises(Rejected, match="joined with 40"):
        gate.offer(_report("0" * 32, "b", 0.8, n=60), reg)
    gate.offer(_report("0" * 32, "b", 0.6), reg)
    assert gate.decide(1)["release"] == 1 and gate.current == 1  # first release: enough clients suffice
    gate.ask("1" * 32, 3, {"w": torch.zeros(2)}, 3)
    with pytest.raises(Rejected, match="bca_release"):
        gate.offer(_report("1" * 32, "a", 0.7), reg)
    gate.offer(_report("1" * 32, "a", 0.70, 0.80), reg)
    gate.offer(_report("1" * 32, "b", 0.60, 0.60), reg)
    assert gate.due() is False
    gate.offer(_report("1" * 32, "c", 0.70, 0.70), reg)
    assert gate.due()  # every validating client asked answered
    ok, why = gate.passes()
    assert not ok and "-0.0333" in why
    rec = gate.decide(2)
    assert not rec["released"] and rec["release"] is None and gate.current == 1
    assert rec["paired_diff_mean"] == pytest.approx(-0.1 / 3) and rec["n_paired"] == 3
    assert [h["released"] for h in read_history(tmp_path)] == [True, False]
    assert torch.equal(ReleaseGate(tmp_path, 2, 0.02, 10).current_state["w"], torch.ones(2))  # kept across restarts


def test_release_every_needs_async_mode(tmp_path):
    cfg = write_toml(tmp_path / "f.toml", "x", extra="[release]\nevery = 2\n")
    with pytest.raises(ConfigError, match="federation.mode"):
        load_config(cfg)



def test_a_release_key_without_candidates_is_refused(tmp_path):
    cfg = write_toml(tmp_path / "f.toml", "x", extra='[release]\nkey = "keys/release.key"\n')
    with pytest.raises(ConfigError, match="release.key: set release.every"):
        load_config(cfg)


def locked(lock, fn, *args):
    with lock:
        return fn(*args)


def test_a_validating_client_is_never_selected_nor_counted_for_min_clients(memory_broker, fed_name, tmp_path):
    """`edge-client join --evaluate` in a synchronous federation: with one training and one validating client online
    the coordinator still waits for ``min_clients = 2`` training clients (no task published); once a second training
    client joins, it selects only the clients that train (fraction 1.0: every client would be selected otherwise)."""
    from tests.broker.test_hostile import Bg

    cfg = write_toml(tmp_path / "federation.toml", fed_name, rounds=2, fraction=1.0, min_clients=2, strategy="fedavg")
    coord = Coordinator(load_config(cfg), memory_broker.url, tmp_path / "out")
    ct = Bg(coord.run)
    edges = {s: EdgeClient(memory_broker.url, fed_name, f"S{s:03d}", make_loader(DATA_DIR, s, None),
                           tmp_path / "state", join_timeout=60, evaluate=s == 2) for s in (1, 2, 3)}
    runs = {s: Bg(lambda e=edges[s]: e.run(max_seconds=120)) for s in (1, 2)}
    end = time.monotonic() + 60
    while coord.registry.n_online() < 2 and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(0.5)  # the coordinator has handled both joins: it must still be waiting
    assert coord.registry.n_online() == 2 and coord.registry.n_training_online() == 1
    assert not memory_broker.retained.get(Topics(fed_name).task)  # no round was opened
    runs[3] = Bg(lambda: edges[3].run(max_seconds=120))
    state = ct.result(180)
    assert state.round == 2
    assert [runs[s].result(60) for s in (1, 2, 3)][1] == 0  # the validating client trained in no round
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert all(r["participants"] == ["S001", "S003"] for r in metrics["rounds"]), metrics["rounds"]


def test_a_reconnect_republishes_the_current_release(memory_broker, fed_name, tmp_path):
    """A broker that restarted without its retained store loses the release topic: the coordinator publishes the
    newest signed release of its store again on every (re)connect, a rollback published there since included."""
    from neurofed.broker.releases import ReleaseStore
    from neurofed.broker.transport import Incoming

    priv, _ = rel.keygen(tmp_path / "keys")
    coord = Coordinator(load_config(release_toml(tmp_path, fed_name, priv)), memory_broker.url, tmp_path / "out",
                        exporter=lambda ckpt, onnx: None)
    topic = Topics(fed_name).release
    coord.transport.connect()
    try:
        coord.handle(Incoming("connected"))
        assert topic not in memory_broker.retained  # nothing released yet: nothing published
        store = ReleaseStore(coord.gate.folder)
        key = rel.load_private(priv)
        docs = [rel.sign(data, key, v, v - 1 or None, model_hash="0" * 64)  # the store and the wire only: no graph
                for v, data in ((1, b"graph one"), (2, b"graph two"))]
        for data, doc in zip((b"graph one", b"graph two"), docs):
            store.add(data, doc)
        (store.folder / "v0003.onnx").write_bytes(b"left by a crash")  # no signature: passed over, never half-sent
        coord.handle(Incoming("connected"))
        assert memory_broker.retained[topic] == rel.pack(b"graph two", docs[1])
    finally:
        coord.transport.close()


def test_an_update_after_the_run_is_refused_late(memory_broker, fed_name, tmp_path):
    """An update whose round or version is no longer open (here: none is) is refused ``late`` from its header,
    not ``bad_message`` for the delta-coded body it has no reference for; its client is told."""
    import torch

    from neurofed.broker.protocol import UpdateMsg, encode, pack
    from neurofed.broker.transport import Incoming

    priv, _ = rel.keygen(tmp_path / "keys")
    coord = Coordinator(load_config(release_toml(tmp_path, fed_name, priv)), memory_broker.url, tmp_path / "out",
                        exporter=lambda ckpt, onnx: None)
    coord.transport.connect()
    try:
        msg = UpdateMsg(federation=fed_name, sender="S001", round=3, task_id="a" * 32, n_samples=10, base_sha256="0" * 64,
                        run_id=coord.run_id)
        body = pack({"state": {"w": torch.zeros(3)}, "extra": {}})
        coord.handle(Incoming("message", Topics(fed_name).update("S001"),
                              encode(msg, body, reference=b"\0" * 64)))
        assert dict(coord.rejections) == {"late": 1}
        assert any(t == Topics(fed_name).error("S001") for _, t, _, _ in memory_broker.log)
    finally:
        coord.transport.close()
