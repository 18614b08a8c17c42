"""``neurofed bench mqtt``: wire overhead, round overhead vs in-process, many clients, publish latency.

Lightweight simulated clients (:class:`Swarm`) share one MQTT connection and answer each task at
once with the global state plus seeded noise, so the numbers are the protocol's, not training's.
"""

from __future__ import annotations

import itertools
import json
import platform
import resource
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from neurofed.broker.config import config_from_dict
from neurofed.broker.coordinator import Coordinator
from neurofed.broker.embedded import EmbeddedBroker
from neurofed.broker.protocol import (
    JoinMsg,
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
from neurofed.broker.transport import MqttTransport
from neurofed.edge.federation import EdgeClient
from neurofed.trainer.data import PreprocessConfig, list_subjects, load_subjects
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.server import ServerState, downlink, select_clients, server_update
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import build_model


def mqtt_publish_overhead(topic: str, payload_len: int, v5: bool = True) -> int:
    """Bytes an MQTT PUBLISH (QoS 1) adds around a payload: fixed header, topic, packet id, v5 properties."""
    rest = 2 + len(topic.encode()) + 2 + (1 if v5 else 0) + payload_len
    varint = 1 if rest < 128 else 2 if rest < 16384 else 3 if rest < 2097152 else 4
    return 1 + varint + rest - payload_len


def wire_bytes() -> list[dict[str, Any]]:
    """Per-client bytes on the wire per round (task down + update up) vs raw tensor bytes."""
    rows = []
    t = Topics("bench")
    for name, ch, n_times, sfreq in [("eegnet", 21, 320, 80.0), ("eegnet", 64, 640, 160.0), ("shallow", 21, 320, 80.0),
                                     ("deep", 64, 640, 160.0)]:
        torch.manual_seed(0)
        model = build_model(name, ch, 2, n_times, sfreq, "batch_specific")
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for strat in ("fedavg", "fedbs"):
            s = get_strategy(strat)
            down = downlink(state, s, model)
            task = TaskMsg(federation="bench", sender="coordinator", round=12, rounds_total=100, task_id=new_id(),
                           selected=[f"S{i:03d}" for i in range(15)], deadline_s=120, seed=0, strategy=strat,
                           local={"lr": 0.005, "momentum": 0.9, "weight_decay": 1e-4, "batch_size": 32, "local_epochs": 2})
            upd = UpdateMsg(federation="bench", sender="S001", round=12, task_id=task.task_id, n_samples=45,
                            base_sha256="0" * 64, metrics={"loss": 0.69, "steps": 4.0})
            for compress in (False, True):
                p_down = encode(task, pack({"down": down, "extra": {}}), compress=compress)
                p_up = encode(upd, pack({"state": state, "extra": {}}), compress=compress)
                raw_down = sum(v.numel() * v.element_size() for v in down.values())
                raw_up = sum(v.numel() * v.element_size() for v in state.values())
                wire = (len(p_down) + mqtt_publish_overhead(t.task, len(p_down))
                        + len(p_up) + mqtt_publish_overhead(t.update("S001"), len(p_up)))
                rows.append({"model": f"{name}-{ch}ch-{int(sfreq)}Hz", "strategy": strat, "zlib": compress,
                             "raw_bytes": raw_down + raw_up, "wire_bytes": wire,
                             "ratio": round(wire / (raw_down + raw_up), 4)})
    return rows


class Swarm:
    """N simulated clients on one connection (anonymous broker): join, answer tasks, watch the model."""

    def __init__(self, url: str, fed: str, n: int, seed: int = 0, first: int = 0) -> None:
        self.topics, self.fed = Topics(fed), fed
        self.ids = [f"sim{i:04d}" for i in range(first, first + n)]  # several swarms can share a federation
        self.t = MqttTransport(url, f"swarm-{uuid.uuid4().hex[:6]}").connect()
        for topic in (self.topics.model, self.topics.task, self.topics.result):
            self.t.subscribe(topic)
        self.rng = torch.Generator().manual_seed(seed)
        self.global_state: dict[str, torch.Tensor] | None = None
        self.spec = None  # the model's ModelSpec, from the coordinator's retained model message
        self.run_id = ""
        self.model: torch.nn.Module | None = None
        self.model_times: list[tuple[int, float]] = []
        self.last_sent: dict[int, float] = {}
        self.done = False

    def wait_model(self, timeout: float = 60.0) -> None:
        """Block until the coordinator's retained model arrives (it subscribes to joins before publishing it)."""
        end = time.monotonic() + timeout
        while self.global_state is None and time.monotonic() < end:
            item = self.t.get(0.1)
            if item is not None and item.event == "message" and item.payload:
                msg, tensors = decode(item.payload)
                if msg.kind == "model":
                    self.global_state, self.run_id, self.spec = tensors, msg.run_id, msg.meta
        if self.global_state is None:
            raise TimeoutError("no model from the coordinator")

    def join(self, spec) -> None:
        self.model = build_model(spec.model, spec.n_channels, spec.n_classes, spec.n_times, spec.sfreq, spec.bn_mode)
        for cid in self.ids:
            self.t.publish(self.topics.status(cid), encode(StatusMsg(federation=self.fed, sender=cid, state="online")),
                           retain=True, wait=None)
            self.t.publish(self.topics.join(cid), encode(JoinMsg(
                federation=self.fed, sender=cid, n_trials=45, n_channels=spec.n_channels, n_times=spec.n_times,
                sfreq=spec.sfreq, classes=list(spec.classes), run_id=self.run_id)), wait=None)

    def serve(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self.done:
            item = self.t.get(0.1)
            if item is None or item.event != "message" or not item.payload:
                continue
            msg, tensors = decode(item.payload)
            self.handle(item, msg, tensors)

    def handle(self, item, msg, tensors) -> None:
        """One decoded message: keep the model, stop at the final result, answer tasks (:meth:`_on_task`)."""
        if msg.kind == "model":
            self.global_state = tensors
            self.model_times.append((msg.round, time.monotonic()))
        elif msg.kind == "result" and msg.final:
            self.done = True
        elif msg.kind == "task":
            self._on_task(msg)

    def _on_task(self, msg) -> None:
        down = downlink(self.global_state or {}, get_strategy(msg.strategy), self.model)
        base = state_sha256(down)
        full = {**(self.global_state or {}), **down}
        for cid in msg.selected:
            st = {k: v + 1e-3 * torch.randn(v.shape, generator=self.rng) if v.is_floating_point() else v
                  for k, v in full.items()}
            u = UpdateMsg(federation=self.fed, sender=cid, round=msg.round, task_id=msg.task_id, n_samples=45,
                          base_sha256=base, metrics={"loss": 0.69}, run_id=msg.run_id)
            body = pack({"state": st, "extra": {}})
            self.t.publish(self.topics.update(cid), encode(u, body, compress=msg.compress), wait=None)
        self.last_sent[msg.round] = time.monotonic()

    def close(self) -> None:
        self.t.close()


def run_federation(url: str, n: int, rounds: int, model: str, aggregation: str) -> dict[str, Any]:
    """Coordinator (thread) + swarm of ``n`` clients, fraction 1.0; per-round metrics and peak RSS growth."""
    fed = f"bench{uuid.uuid4().hex[:6]}"
    cfg = config_from_dict({"federation": {"name": fed, "rounds": rounds, "fraction": 1.0, "min_clients": n,
                                           "round_deadline_s": 120, "strategy": "fedavg", "aggregation": aggregation,
                                           "join_timeout_s": 120},
                            "model": {"name": model}, "output": {"dir": f"/tmp/neurofed-bench/{fed}"}})
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    coord = Coordinator(cfg, url)
    stop = threading.Event()
    ct = threading.Thread(target=coord.run, kwargs={"stop": stop}, daemon=True)
    ct.start()
    swarm = Swarm(url, fed, n)
    swarm.wait_model()
    swarm.join(coord.spec)
    st = threading.Thread(target=swarm.serve, args=(stop,), daemon=True)
    st.start()
    ct.join(600)
    stop.set()
    st.join(10)
    swarm.close()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    lat = [t for r, t in swarm.model_times if r >= 1]
    observed = [t - swarm.last_sent[r - 1] for r, t in swarm.model_times if r >= 1 and (r - 1) in swarm.last_sent]
    del lat
    return {"clients": n, "model": model, "aggregation": aggregation, "rounds": coord.metrics,
            "peak_rss_growth_mb": round((rss1 - rss0) / 1024, 1),
            "swarm_last_update_to_model_s": observed}


#: Flower 1.41's gRPC deployment, same setting (FedAvg, EEGNet, 24 clients, half per round, loopback):
#: measured side by side on this machine (the lead's run, /work/shared/REFERENCE.md)
FLOWER_GRPC_BYTES_PER_ROUND = 229_000


def bytes_per_round(url: str, n_clients: int = 24, fraction: float = 0.5, rounds: int = 3, strategy: str = "fedavg",
                    data_dir: Path | None = None, local: dict[str, Any] | None = None) -> dict[str, Any]:
    """Bytes through the broker per round with real edge clients (in-process threads, real EEGMMIDB trials).

    Every message is counted where it enters the broker (publisher's payload) and again where it leaves
    it (each subscriber's payload): ``payload_bytes``. ``wire_bytes`` adds the MQTT framing of each
    PUBLISH (:func:`mqtt_publish_overhead`) and its 4-byte PUBACK on both legs.
    """

    fed = f"bytes{uuid.uuid4().hex[:6]}"
    local = local or {"batch_size": 8, "local_epochs": 2}
    cfg = config_from_dict({"federation": {"name": fed, "rounds": rounds, "fraction": fraction, "min_clients": n_clients,
                                           "round_deadline_s": 300, "strategy": strategy, "join_timeout_s": 300},
                            "local": local, "output": {"dir": f"/tmp/neurofed-bench/{fed}"}})
    subjects = list_subjects(data_dir)[:n_clients]
    data = {sd.subject: sd for sd in load_subjects(subjects, PreprocessConfig.from_dict(cfg.model_spec().preprocess),
                                                   data_dir)}
    coord = Coordinator(cfg, url)
    edges = [EdgeClient(url, fed, cid, lambda spec, cid=cid: data[cid], f"/tmp/neurofed-bench/{fed}/state")
             for cid in sorted(data)]
    stop = threading.Event()
    threads = [threading.Thread(target=coord.run, kwargs={"stop": stop}, daemon=True)]
    threads += [threading.Thread(target=e.run, kwargs={"stop": stop, "max_seconds": 1800}, daemon=True) for e in edges]
    for t in threads:
        t.start()

    topics = Topics(fed)

    def totals() -> tuple[int, int, dict[str, list[int]]]:
        ts = [x.transport for x in (coord, *edges) if x.transport is not None]
        kinds: dict[str, list[int]] = {}  # topic kind -> [messages, payload bytes] (legs into and out of the broker)
        for tr in ts:
            for topic, (m, b) in tr.traffic().items():
                row = kinds.setdefault(topics.parse(topic)[0], [0, 0])
                row[0], row[1] = row[0] + m, row[1] + b
        return sum(t.bytes_in + t.bytes_out for t in ts), sum(t.msgs_in + t.msgs_out for t in ts), kinds

    snaps, seen, model_bytes = [], 0, 0
    while threads[0].is_alive():
        model_bytes = len(coord._model_payload or b"") or model_bytes
        if len(coord.metrics) > seen:
            seen = len(coord.metrics)
            snaps.append(totals())
        time.sleep(0.01)
    threads[0].join()
    for t in threads[1:]:
        t.join(60)
    stop.set()
    per_round = []
    for (b0, m0, k0), (b1, m1, k1) in itertools.pairwise(snaps):  # round k+1: from round k's result to round k+1's
        # framing: fixed header + topic (~30-40 B) + packet id (+ v5 properties) per PUBLISH leg, PUBACK 4 B per leg
        framing = (m1 - m0) * (mqtt_publish_overhead(topics.update("S001"), 8000) + 4)
        by_kind = {k: {"messages": m - k0.get(k, [0, 0])[0], "payload_bytes": b - k0.get(k, [0, 0])[1]}
                   for k, (m, b) in sorted(k1.items())}
        per_round.append({"payload_bytes": b1 - b0, "messages": m1 - m0, "wire_bytes": b1 - b0 + framing,
                          "by_topic": {k: v for k, v in by_kind.items() if v["messages"]}})
    wire = [r["wire_bytes"] for r in per_round]
    return {"clients": n_clients, "fraction": fraction, "strategy": strategy, "model": "eegnet", "local": local,
            "rounds": rounds, "per_round_after_the_first": per_round,
            "wire_bytes_per_round_median": float(np.median(wire)) if wire else None,
            "flower_grpc_bytes_per_round": FLOWER_GRPC_BYTES_PER_ROUND,
            "model_payload_bytes": model_bytes,
            "note": "payload bytes counted entering and leaving the broker; rounds after the first (the first "
                    "includes every client's initial model download at join)"}


def in_process_round_seconds(n: int, model_name: str, reps: int = 5) -> float:
    """The same round in process: selection, downlink, server_update over n ready updates."""
    torch.manual_seed(0)
    model = build_model(model_name, 21, 2, 320, 80.0, "standard")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    s = get_strategy("fedavg")
    ids = [f"sim{i:04d}" for i in range(n)]
    ups = [(c, ClientUpdate({k: v + 1e-3 for k, v in state.items()}, 45)) for c in ids]
    times = []
    for r in range(reps):
        t0 = time.perf_counter()
        select_clients(ids, 1.0, r, 0)
        downlink(state, s, model)
        server_update(ServerState(state, r), ups, s, n)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run_bytes_bench(out: Path, data_dir: Path | None, broker: str) -> dict[str, Any]:
    """``neurofed bench mqtt --only-bytes``: :func:`bytes_per_round` in Flower's setting, written to ``out``."""

    torch.set_num_threads(1)
    emb = EmbeddedBroker().start() if broker == "embedded" else None
    try:
        res = bytes_per_round(emb.url if emb else "mqtt://127.0.0.1:1883", 24, 0.5, 4, "fedavg", data_dir)
    finally:
        if emb:
            emb.stop()
    res["command"] = f"neurofed bench mqtt --only-bytes --broker {broker} --out {out}"
    res["summary"] = {"bytes_per_round": res["wire_bytes_per_round_median"],
                      "flower_grpc_bytes_per_round": FLOWER_GRPC_BYTES_PER_ROUND,
                      "ratio_to_flower": round(res["wire_bytes_per_round_median"] / FLOWER_GRPC_BYTES_PER_ROUND, 3)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    return res


def run_bench(out: Path, data_dir: Path | None, many: int, broker: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    emb = EmbeddedBroker().start() if broker == "embedded" else None
    url = emb.url if emb else "mqtt://127.0.0.1:1883"
    try:
        wire = wire_bytes()
        per_round = bytes_per_round(url, 24, 0.5, 4, "fedavg", data_dir)
        small = run_federation(url, 4, 5, "eegnet", "exact")
        mq = [m["seconds"] for m in small["rounds"][1:]]
        inproc = in_process_round_seconds(4, "eegnet")
        big_stream = run_federation(url, many, 1, "shallow", "streaming")
        big_exact = run_federation(url, many, 1, "shallow", "exact")
    finally:
        if emb:
            emb.stop()
    torch.manual_seed(0)
    m21 = build_model("eegnet", 21, 2, 320, 80.0, "standard")
    raw21 = 2 * sum(v.numel() * v.element_size() for v in m21.state_dict().values())
    r1 = small["rounds"][1]
    measured = (r1["bytes_down"] + r1["bytes_up"] / len(r1["participants"])) / raw21
    e21 = next(r for r in wire if r["model"] == "eegnet-21ch-80Hz" and r["strategy"] == "fedbs" and not r["zlib"])
    res = {
        "command": f"neurofed bench mqtt --many {many} --broker {broker}",
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "broker": broker, "torch": torch.__version__},
        "wire_bytes": wire,
        "bytes_per_round_24_clients": per_round,
        "round_overhead": {"clients": 4, "mqtt_round_s_median": float(np.median(mq)),
                           "in_process_round_s_median": inproc,
                           "overhead_s": float(np.median(mq)) - inproc, "note": "lightweight clients, no training"},
        "many_clients": {"streaming": big_stream, "exact": big_exact},
        "latency_last_update_to_model_s": {
            "coordinator_4_clients": [m["publish_latency_s"] for m in small["rounds"]],
            f"coordinator_{many}_clients_streaming": [m["publish_latency_s"] for m in big_stream["rounds"]],
            "swarm_observed_4_clients": small["swarm_last_update_to_model_s"]},
    }
    res["measured_round_payload_ratio_eegnet21_fedavg_zlib"] = round(measured, 4)
    res["summary"] = {
        "wire_ratio_eegnet21_fedbs_raw": e21["ratio"],
        "bytes_per_round_24_clients_half": per_round["wire_bytes_per_round_median"],
        "flower_grpc_bytes_per_round": FLOWER_GRPC_BYTES_PER_ROUND,
        "measured_payload_ratio_eegnet21_zlib": round(measured, 4),
        "mqtt_round_overhead_ms": round(1000 * res["round_overhead"]["overhead_s"], 1),
        f"round_{many}_clients_s": round(big_stream["rounds"][0]["seconds"], 2),
        f"updates_accepted_{many}": len(big_stream["rounds"][0]["participants"]),
        "rss_growth_mb_streaming_vs_exact": f"{big_stream['peak_rss_growth_mb']} vs {big_exact['peak_rss_growth_mb']}",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    return res
