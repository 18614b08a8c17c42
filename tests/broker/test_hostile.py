"""Hostile clients and real faults against a real Mosquitto (issue 17): run hygiene, replayed and absurd updates,
forged messages and error replies, per-round rejection counts, resume with fewer clients, client-id takeover,
publishing while the broker is down, an unreachable broker, clear-text listener warnings."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import torch

from neurofed.background import Background
from neurofed.broker.config import FederationConfig, config_from_dict
from neurofed.broker.coordinator import Coordinator
from neurofed.broker.embedded import free_port
from neurofed.broker.protocol import (
    COORDINATOR_ID,
    JoinMsg,
    ModelMsg,
    ResultMsg,
    StatusMsg,
    TaskMsg,
    Topics,
    UpdateMsg,
    decode,
    encode,
    new_id,
    pack,
    state_sha256,
)
from neurofed.broker.transport import MqttTransport, TransportError
from neurofed.broker.validation import state_norm
from neurofed.edge.federation import EdgeClient
from neurofed.trainer.fl.server import downlink
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import build_model
from tests.broker.test_equivalence import reference_state

NEUROFED = [sys.executable, "-c", "from neurofed.cli import main; main()"]


def make_cfg(fed: str, out, **fed_kw: Any) -> FederationConfig:
    d = {"name": fed, "rounds": 1, "fraction": 1.0, "seed": 7, "min_clients": 2, "round_deadline_s": 60,
         "strategy": "fedbs", "join_timeout_s": 60}
    d.update(fed_kw)
    return config_from_dict({"federation": d, "local": {"batch_size": 16, "local_epochs": 1}, "output": {"dir": str(out)}})


Bg = Background  # the name the broker tests import


def retained(url: str, topics: list[str], wait: float = 1.0) -> dict[str, bytes]:
    """The retained messages currently held for ``topics``."""
    t = MqttTransport(url, f"peek-{new_id()[:6]}").connect()
    for tp in topics:
        t.subscribe(tp)
    got, end = {}, time.monotonic() + wait
    while time.monotonic() < end:
        i = t.get(0.1)
        if i is not None and i.event == "message" and i.retain:
            got[i.topic] = i.payload
    t.close()
    return got


def _diff(a, b) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in b)


# ------------------------------------------------------------------ A: run hygiene
@pytest.mark.slow
def test_reused_federation_name_new_run_trains_from_its_own_model(subjects4, mosquitto, fed_name, tmp_path,
                                                                   monkeypatch):
    """Run 1, then stale retained state of an old run (as a crashed coordinator leaves it), then run 2 with
    the same name and the same client state folder: run 2's clients ignore the stale final model/result/task,
    start from run 2's initial model, and non-selected clients download no weights."""
    url, topics = mosquitto.url, Topics(fed_name)
    sd = {s.subject: s for s in subjects4[:3]}
    lock, on_task = threading.Lock(), EdgeClient._on_task

    def one_at_a_time(self, *a):  # in-process clients share torch's global RNG (processes in deployment)
        with lock:
            return on_task(self, *a)

    monkeypatch.setattr(EdgeClient, "_on_task", one_at_a_time)

    def clients(ids):
        return [EdgeClient(url, fed_name, c, lambda spec, c=c: sd[c], tmp_path / "state", join_timeout=60) for c in ids]

    # run 1
    c1 = Coordinator(make_cfg(fed_name, tmp_path / "out1"), url)
    ct = Bg(c1.run)
    runs = [Bg(lambda e=e: e.run(max_seconds=120)) for e in clients(["S001", "S002"])]
    assert [r.result(150) for r in runs] == [1, 1]
    ct.result(60)
    # the coordinator cleared its retained task / model / result; its status says done for run 1
    left = retained(url, [topics.task, topics.model, topics.result, topics.status(COORDINATOR_ID)])
    assert set(left) == {topics.status(COORDINATOR_ID)}
    st, _ = decode(left[topics.status(COORDINATOR_ID)])
    assert (st.state, st.run_id) == ("done", c1.run_id)

    # what a coordinator that crashed at the end of an old run leaves behind
    old = new_id()
    with MqttTransport(url, "stale-writer") as w:
        g = {k: v * 100 for k, v in c1.server.global_state.items()}
        w.publish(topics.model, encode(ModelMsg(federation=fed_name, sender=COORDINATOR_ID, round=1, final=True,
                                                meta=c1.spec, run_id=old), g), retain=True)
        w.publish(topics.result, encode(ResultMsg(federation=fed_name, sender=COORDINATOR_ID, round=1,
                                                  participants=["S001"], rejected=0, bytes_down=0, bytes_up=0, seconds=1,
                                                  final=True, model_sha256="0" * 64, run_id=old)), retain=True)
        w.publish(topics.task, encode(TaskMsg(federation=fed_name, sender=COORDINATOR_ID, round=0, rounds_total=1,
                                              task_id=new_id(), selected=["S001", "S002", "S003"], deadline_s=60, seed=7,
                                              strategy="fedbs", run_id=old)), retain=True)

    # run 2: clients first (they see only the stale run and must wait), then the coordinator
    edges = clients(["S001", "S002", "S003"])
    runs = [Bg(lambda e=e: e.run(max_seconds=150)) for e in edges]
    end = time.monotonic() + 60
    while not all(e.finished_run == old for e in edges) and time.monotonic() < end:
        time.sleep(0.05)
    assert all(e.finished_run == old and not e.finished and e.rounds_trained == 0 for e in edges)
    c2 = Coordinator(make_cfg(fed_name, tmp_path / "out2", rounds=2, fraction=0.67, min_clients=3), url)
    assert c2.run_id != c1.run_id
    ct = Bg(c2.run)
    trained = [r.result(200) for r in runs]
    ct.result(60)
    assert all(e.finished and e.run_id == c2.run_id for e in edges)
    assert sum(trained) == sum(len(m["participants"]) for m in c2.metrics) == 4
    assert _diff(c2.server.global_state, reference_state(subjects4[:3], 2, 0.67, 7, "fedbs")) <= 1e-6
    # weights go only to clients that need them: the join download + one per round the client was selected
    model_bytes = len(encode(ModelMsg(federation=fed_name, sender=COORDINATOR_ID, round=0, meta=c2.spec,
                                      run_id=c2.run_id), c2.server.global_state, compress=True))
    for e in edges:
        n_sel = sum(e.cid in m["selected"] for m in c2.metrics)
        assert e.transport.bytes_in < (1 + n_sel) * model_bytes * 1.3 + 20_000, (e.cid, n_sel, e.transport.bytes_in)


# ------------------------------------------------------------------ B: a puppet plays (and forges) clients
class Puppet:
    """Lightweight clients on one connection whose answers the test scripts (no training)."""

    def __init__(self, url: str, fed: str, ids: list[str]) -> None:
        self.topics, self.fed, self.ids = Topics(fed), fed, ids
        self.t = MqttTransport(url, f"puppet-{new_id()[:6]}").connect()
        self.t.subscribe(self.topics.model)
        self.t.subscribe(self.topics.task)
        self.t.subscribe(self.topics.any_client("error"))
        self.errors: list[Any] = []
        self.run_id, self.global_state, self.spec = "", {}, None

    def next(self, kind: str, timeout: float = 60.0, pred=lambda m: True):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            i = self.t.get(0.1)
            if i is None or i.event != "message" or not i.payload:
                continue
            msg, tensors = decode(i.payload)
            if msg.kind == "error":
                self.errors.append((i.topic.rsplit("/", 1)[-1], msg))
            elif msg.kind == "model":
                self.run_id, self.global_state, self.spec = msg.run_id, tensors, msg.meta
            if msg.kind == kind and pred(msg):
                return msg
        raise AssertionError(f"no {kind} message in time")

    def join(self) -> None:
        self.next("model")
        s = self.spec
        for cid in self.ids:
            self.t.publish(self.topics.status(cid), encode(StatusMsg(federation=self.fed, sender=cid, state="online")),
                           retain=True)
            self.t.publish(self.topics.join(cid), encode(JoinMsg(
                federation=self.fed, sender=cid, n_trials=45, n_channels=s.n_channels, n_times=s.n_times, sfreq=s.sfreq,
                classes=list(s.classes), run_id=self.run_id)))

    def base(self, task) -> str:
        s = self.spec
        model = build_model(s.model, s.n_channels, s.n_classes, s.n_times, s.sfreq, s.bn_mode)
        return state_sha256(downlink(self.global_state, get_strategy(task.strategy), model))

    def update(self, task, cid: str, state: dict, **kw: Any) -> tuple[UpdateMsg, bytes]:
        d = {"federation": self.fed, "sender": cid, "round": task.round, "task_id": task.task_id, "n_samples": 45,
             "base_sha256": self.base(task), "run_id": self.run_id}
        d.update(kw)
        msg = UpdateMsg(**d)
        return msg, encode(msg, pack({"state": state}))

    def send(self, cid: str, payload: bytes) -> None:
        self.t.publish(self.topics.update(cid), payload)

    def honest(self, seed: int) -> dict:
        g = torch.Generator().manual_seed(seed)
        return {k: v + 1e-3 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                for k, v in self.global_state.items()}


@pytest.mark.slow
def test_absurd_replayed_and_forged_updates_are_rejected_counted_and_not_answered_to_the_innocent(
        mosquitto, fed_name, tmp_path):
    url = mosquitto.url
    coord = Coordinator(make_cfg(fed_name, tmp_path / "out", rounds=2, min_clients=2), url)
    ct = Bg(coord.run)
    p = Puppet(url, fed_name, ["S001", "S002"])
    p.join()
    g0 = {k: v.clone() for k, v in p.global_state.items()}

    # round 0: 3 garbage payloads, then a 1000x update "from S002" before the real ones
    t0 = p.next("task")
    for _ in range(3):
        p.send("S002", b"junk")
    absurd, payload = p.update(t0, "S002", {k: v * 1000 if v.is_floating_point() else v for k, v in g0.items()})
    p.send("S002", payload)
    _, pay1 = p.update(t0, "S001", p.honest(1))
    p.send("S001", pay1)
    p.send("S002", p.update(t0, "S002", p.honest(2))[1])

    # round 1: S001's round-0 body replayed under a fresh header, a forged wrong-task message as S001 after it
    # delivered, then the real updates
    t1 = p.next("task", pred=lambda m: m.round == 1)
    replay_hdr = UpdateMsg(federation=fed_name, sender="S001", round=1, task_id=t1.task_id, n_samples=45,
                           base_sha256=p.base(t1), run_id=p.run_id)
    p.send("S001", encode(replay_hdr, decode(pay1)[1]))
    p.send("S001", p.update(t1, "S001", p.honest(3))[1])
    p.send("S001", p.update(t1, "S001", p.honest(4), task_id=new_id())[1])
    p.send("S002", p.update(t1, "S002", p.honest(5))[1])
    ct.result(90)
    try:
        p.next("nothing", timeout=1.0)
    except AssertionError:
        pass
    p.t.close()

    r0, r1 = coord.metrics
    assert r0["participants"] == r1["participants"] == ["S001", "S002"]
    assert r0["rejected"] == 4 and r1["rejected"] == 2, (r0["rejected"], r1["rejected"], coord.rejections)
    assert r0["clipped"] == r1["clipped"] == 0  # the 1000x update never reached aggregation; the honest two pass whole
    assert coord.rejections["absurd_update"] == 1 and coord.rejections["replay"] == 1
    assert coord.rejections["bad_message"] == 3 and coord.rejections["wrong_task"] == 1
    assert "spoofed_sender" not in coord.rejections  # its own error replies are not read back as forgeries
    # one reply: to S002 about the absurd update (naming it); none for garbage, replays, or S001 after it delivered
    assert [(cid, e.code, e.reply_to) for cid, e in p.errors] == [("S002", "absurd_update", absurd.msg_id)]
    assert state_norm(coord.server.global_state) < 2 * state_norm(g0)


@pytest.mark.unit
def test_error_replies_about_messages_a_client_never_sent_are_ignored(caplog, tmp_path):
    """The innocent client a forger impersonated logs nothing; a reply about its own message is reported."""
    from neurofed.broker.protocol import ErrorMsg
    from neurofed.broker.transport import Incoming

    e = EdgeClient("mqtt://127.0.0.1:1", "f", "S001", lambda spec: None, tmp_path)
    e.sent.append("a" * 32)
    with caplog.at_level(logging.INFO, logger="neurofed.edge"):
        for rt in ("b" * 32, "a" * 32):
            err = ErrorMsg(federation="f", sender=COORDINATOR_ID, code="wrong_task", message="x", reply_to=rt)
            e.handle(Incoming("message", Topics("f").error("S001"), encode(err)))
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "rejected our message" in warned[0].getMessage()


@pytest.mark.slow
def test_private_metadata_keeps_participants_and_loss_off_the_retained_result(mosquitto, fed_name, tmp_path):
    coord = Coordinator(make_cfg(fed_name, tmp_path / "out", private_metadata=True), mosquitto.url)
    ct = Bg(coord.run)
    p = Puppet(mosquitto.url, fed_name, ["S001", "S002"])
    p.t.subscribe(p.topics.result)
    p.join()
    t = p.next("task")
    for i, cid in enumerate(t.selected):
        p.send(cid, p.update(t, cid, p.honest(i), metrics={"loss": 0.5, "steps": 3.0})[1])
    res = p.next("result")
    ct.result(60)
    p.t.close()
    assert res.final and res.participants == [] and res.loss is None
    assert coord.metrics[0]["participants"] == ["S001", "S002"] and coord.metrics[0]["loss"] == 0.5


@pytest.mark.slow
def test_a_late_joiner_gets_the_current_model_and_learns_the_end_from_the_coordinator_status(
        subjects4, mosquitto, fed_name, tmp_path):
    url = mosquitto.url
    coord = Coordinator(make_cfg(fed_name, tmp_path / "out", rounds=2), url)
    ct = Bg(coord.run)
    p = Puppet(url, fed_name, ["S001", "S002"])
    p.join()
    t0 = p.next("task")
    for i, cid in enumerate(t0.selected):
        p.send(cid, p.update(t0, cid, p.honest(i))[1])
    t1 = p.next("task", pred=lambda m: m.round == 1)  # round 1 open; its model is the retained one
    late = EdgeClient(url, fed_name, "S003", lambda spec: subjects4[2], tmp_path / "st", join_timeout=60)
    lr = Bg(lambda: late.run(max_seconds=120))
    end = time.monotonic() + 60
    while "S003" not in coord.registry and time.monotonic() < end:
        time.sleep(0.05)
    assert "S003" in coord.registry and late.run_id == coord.run_id and late.global_hash == t1.model_sha256
    assert p.topics.model not in late.transport.subscriptions  # fetched once, then unsubscribed
    for i, cid in enumerate(t1.selected):
        p.send(cid, p.update(t1, cid, p.honest(10 + i))[1])
    ct.result(60)
    p.t.close()
    assert lr.result(60) == 0 and late.finished  # the final result is not sent to clients: status `done` ends it


# ------------------------------------------------------------------ resume with fewer clients
@pytest.mark.slow
def test_resume_does_not_demand_min_clients_again_and_says_what_it_waits_for(mosquitto, fed_name, tmp_path, caplog):
    cfg = make_cfg(fed_name, tmp_path / "out", rounds=2, min_clients=3, join_timeout_s=30)
    first = Coordinator(cfg, mosquitto.url)
    for cid in ("S001", "S002", "S003"):
        first.registry.join(JoinMsg(federation=fed_name, sender=cid, n_trials=45, n_channels=21, n_times=320,
                                    sfreq=80.0, classes=["left_fist", "right_fist"]))
    first.registry.set_online("S003", False)  # S003 died; the run went on with two
    first.server.round = 1
    first._checkpoint()
    coord = Coordinator(cfg, mosquitto.url, resume=True)
    assert coord.run_id == first.run_id and coord.clients_needed() == 2
    with caplog.at_level(logging.INFO, logger="neurofed.broker"):
        ct = Bg(coord.run)
        p = Puppet(mosquitto.url, fed_name, ["S001", "S002"])
        p.join()
        t = p.next("task")
        for i, cid in enumerate(t.selected):
            p.send(cid, p.update(t, cid, p.honest(i))[1])
        ct.result(60)
    p.t.close()
    assert coord.server.round == 2
    waits = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert waits and "waiting for 2 training client(s)" in waits[0] and "S003" in waits[0]


# ------------------------------------------------------------------ transport faults
def test_publish_while_the_broker_is_down_is_queued_not_raised(mosquitto, fed_name):
    topic = f"neurofed/{fed_name}/model"
    t = MqttTransport(mosquitto.url, f"q-{fed_name}", reconnect_max_s=1).connect()
    mosquitto.stop()
    end = time.monotonic() + 10
    while t.connected and time.monotonic() < end:
        time.sleep(0.05)
    t.publish(topic, b"queued-1", retain=True, wait=None)  # no RuntimeError out of paho
    with pytest.raises(TransportError, match="queued"):
        t.publish(topic, b"queued-2", retain=True, wait=0.3)
    waiter = Bg(lambda: t.publish(topic, b"queued-3", retain=True, wait=30))  # acked after the broker is back
    mosquitto.start()
    assert waiter.result(40) is True
    assert retained(mosquitto.url, [topic])[topic] == b"queued-3"
    t.close()


def test_edge_client_fails_fast_and_clearly_when_no_broker_listens(tmp_path):
    port = free_port()
    e = EdgeClient(f"mqtt://127.0.0.1:{port}", "f", "S001", lambda spec: None, tmp_path)
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="cannot reach broker.*--wait-for-broker"):
        e.run()
    assert time.monotonic() - t0 < 5
    e = EdgeClient(f"mqtt://127.0.0.1:{port}", "f", "S001", lambda spec: None, tmp_path, wait_for_broker=1.5)
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="cannot reach broker"):
        e.run()
    assert time.monotonic() - t0 >= 0.5  # it retried
    r = subprocess.run([sys.executable, "-c", "from neurofed.edge.cli import main; main()", "join", "--broker",
                        f"mqtt://127.0.0.1:{port}", "--client-id", "S001", "--subject", "1", "--state-dir", str(tmp_path)],
                       check=False, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "cannot reach broker" in lines[0], r.stderr


def test_broker_listeners_outside_loopback_without_tls_warn(tmp_path):
    r = subprocess.run(NEUROFED + ["broker-config", "--out", str(tmp_path / "m"), "--federation", "lab", "--clients",
                                   "S001", "--bind", "0.0.0.0"], check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "travel in clear" in r.stderr, r.stderr
    assert "use_username_as_clientid true" in (tmp_path / "m" / "mosquitto.conf").read_text()
    r = subprocess.run(NEUROFED + ["broker-config", "--out", str(tmp_path / "n"), "--federation", "lab", "--clients",
                                   "S001"], check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "in clear" not in r.stderr
    port = free_port()
    p = subprocess.Popen(NEUROFED + ["broker", "--host", "0.0.0.0", "--port", str(port)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        first = p.stdout.readline()
        assert "without TLS" in first and "no authentication" in first, first
    finally:
        p.kill()
        p.wait(10)


@pytest.mark.slow
def test_compression_bombs_from_a_client_cost_the_coordinator_no_memory_and_no_time(mosquitto, fed_name, tmp_path):
    """Issue 54 (D1): a 39 kB frame declaring a 256 MiB body (once took the coordinator from 0.32 to 3.49 GB RSS and
    the round from 3 s to 60 s), one declaring a small body that inflates to 256 MiB, and a flood of small bombs,
    from a joined client and from one that never joined, during a real round over Mosquitto: each is refused as
    ``bad_message`` before its body costs memory, and the round closes at once with both honest updates."""
    import gc

    import psutil

    from tests.broker.test_protocol import bomb

    url = mosquitto.url
    coord = Coordinator(make_cfg(fed_name, tmp_path / "out", rounds=1, min_clients=2), url)
    ct = Bg(coord.run)
    p = Puppet(url, fed_name, ["S001", "S002"])
    p.join()
    t0 = p.next("task")
    hdr = UpdateMsg(federation=fed_name, sender="S002", round=t0.round, task_id=t0.task_id, n_samples=45,
                    base_sha256=p.base(t0), run_id=p.run_id)
    outsider = hdr.model_copy(update={"sender": "X999"})
    big = bomb(hdr, 256 << 20, 256 << 20)          # declares 256 MiB, inflates to it (the frame)
    liar = bomb(hdr, 4096, 256 << 20)              # declares 4 kB, inflates to 256 MiB
    small = bomb(outsider, 1 << 30, 8 << 20)       # not joined: declares 1 GiB, a 2 kB frame
    honest1, honest2 = p.update(t0, "S001", p.honest(1))[1], p.update(t0, "S002", p.honest(2))[1]
    assert len(big) < 64 << 10 and len(liar) < 64 << 10
    gc.collect()
    proc = psutil.Process()
    base, peak, stop = proc.memory_info().rss, [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t_send = time.monotonic()
    for _ in range(3):
        p.send("S002", big)
        p.send("S002", liar)
    for _ in range(50):
        p.send("X999", small)
    p.send("S001", honest1)
    p.send("S002", honest2)
    ct.result(90)
    elapsed = time.monotonic() - t_send
    stop.set()
    sampler.join()
    p.t.close()

    growth = peak[0] - base
    print(f"bomb test: RSS {base / 2**20:.0f} MiB -> peak {peak[0] / 2**20:.0f} MiB (+{growth / 2**20:.1f} MiB), "
          f"round closed {elapsed:.2f} s after the first bomb, round {coord.metrics[0]['seconds']:.2f} s")
    (r0,) = coord.metrics
    assert r0["participants"] == ["S001", "S002"]
    assert coord.rejections["bad_message"] == 56, coord.rejections
    assert growth < 200 << 20, growth / 2**20
    assert elapsed < 20, elapsed


@pytest.mark.slow
@pytest.mark.parametrize("flood", ["messages", "bytes"])
def test_a_flooding_client_with_valid_credentials_is_cut_off_and_the_round_closes_on_time(fed_name, tmp_path, flood):
    """Issue 54: a joined, selected client floods the coordinator during a round with messages its credentials
    allow (900 valid joins; or 20 kB frames past a 50 kB byte budget), through a Mosquitto with the limits
    `neurofed broker-config` writes. Past its per-round budget it is cut off (``rate_limited`` /
    ``volume_limited``), every further message refused unread, and not waited for: the round closes as soon as
    both honest updates are in, not at its 60 s deadline.

    Not defended here: a burst larger than the broker's queue for the coordinator (``max_queued_messages``;
    Mosquitto has no per-client publish rate limit) is dropped by the broker, honest messages queued with it
    included (4,000 joins at once through a 1,000-message queue lost an honest update); docs/security.md."""
    from neurofed.broker.secure import BrokerLimits
    from tests.broker.conftest import Mosquitto

    port = free_port()
    conf = "\n".join([f"listener {port} 127.0.0.1", "allow_anonymous true", "persistence false", "log_dest none",
                      *BrokerLimits(3).conf_lines()]) + "\n"
    broker = Mosquitto(tmp_path, extra_conf=conf, port=port).start()
    try:
        _flood_round(broker.url, fed_name, tmp_path, flood)
    finally:
        broker.stop()


def _flood_round(url: str, fed_name: str, tmp_path, flood: str) -> None:
    cfg = make_cfg(fed_name, tmp_path / "out", rounds=1, min_clients=3)
    cfg = config_from_dict({**cfg.model_dump(), "validation": {"max_client_messages": 100, "max_client_mb": 0.05}})
    coord = Coordinator(cfg, url)
    ct = Bg(coord.run)
    p = Puppet(url, fed_name, ["S001", "S002", "S003"])
    p.join()
    t0 = p.next("task")
    assert sorted(t0.selected) == ["S001", "S002", "S003"]
    s = p.spec
    join = encode(JoinMsg(federation=fed_name, sender="S003", n_trials=45, n_channels=s.n_channels, n_times=s.n_times,
                          sfreq=s.sfreq, classes=list(s.classes), run_id=p.run_id))
    if flood == "messages":
        frames, code, over = [join] * 900, "rate_limited", 900 - 100
    else:
        frames, code, over = [b"x" * 20_000] * 5, "volume_limited", 3  # the 3rd crosses 51,200 bytes
    t_flood = time.monotonic()
    for f in frames:
        p.t.publish(p.topics.join("S003") if flood == "messages" else p.topics.update("S003"), f, wait=None)
    p.send("S001", p.update(t0, "S001", p.honest(1))[1])
    p.send("S002", p.update(t0, "S002", p.honest(2))[1])
    ct.result(90)
    elapsed = time.monotonic() - t_flood
    p.t.close()
    (r0,) = coord.metrics
    print(f"flood of {len(frames)} ({flood}): round closed {elapsed:.2f} s after it began; {dict(coord.rejections)}")
    assert r0["participants"] == ["S001", "S002"] and r0["cut_off"] == ["S003"]
    assert coord.rejections[code] == over, coord.rejections
    if flood == "bytes":
        assert coord.rejections["bad_message"] == 2  # the two frames within its budget were read (and refused)
    assert elapsed < 30 and r0["seconds"] < 30  # the deadline is 60 s: S003 was not waited for


@pytest.mark.unit
def test_client_budget_counts_messages_and_bytes_per_window():
    from neurofed.broker.validation import ClientBudget, Rejected

    b = ClientBudget(max_messages=3, max_bytes=100, max_senders=2)
    for _ in range(3):
        b.charge("A", 10)
    with pytest.raises(Rejected) as ei:
        b.charge("A", 10)
    assert ei.value.code == "rate_limited" and "cut off until the next round" in ei.value.detail
    with pytest.raises(Rejected):
        b.charge("A", 0)  # stays cut off
    b.charge("B", 60)
    with pytest.raises(Rejected) as ei:
        b.charge("B", 41)
    assert ei.value.code == "volume_limited"
    with pytest.raises(Rejected, match="more than 2 distinct senders"):
        b.charge("C", 1)
    b.reset()
    b.charge("A", 10)  # a new round: budgets whole again
    off = ClientBudget(0, 0)
    for _ in range(1000):
        off.charge("A", 1 << 20)  # 0 = off
