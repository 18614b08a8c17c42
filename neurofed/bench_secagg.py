"""``neurofed bench secagg``: what secure aggregation adds to a round (time and bytes) at 24, 100, 500 clients.

For each client count the same federation (FedAvg, EEGNet 21 ch / 80 Hz, every client selected, no clip) runs
once with plain updates and once with SecAgg+ over a real broker. The clients are lightweight swarms
(:class:`SecAggSwarm`, one MQTT connection each) in ``--swarm-procs`` child processes (default: one per core),
each playing a contiguous slice of the clients in turn, so their work runs beside the coordinator's (other
interpreters, other cores) as it would on the clients' own hosts, though far less parallel: 100 clients share
two processes and the same two cores as the coordinator and the broker. Each client answers its task at once
with the global model plus seeded noise, through the real client code
(:class:`neurofed.edge.secagg_client.SecAggSession` under secure aggregation), so the numbers are the protocol's, not
training's. Measured per round:

* ``round_s``: the coordinator's round time (task published to model published);
* ``coordinator_bytes``: payload bytes the coordinator received and sent in the round (its transport counters);
* ``broker_bytes``: payload bytes through the broker in the round (coordinator + swarm, in and out; the swarm's
  share counted from one round's task to the next's);
* ``swarm_cpu_s``: CPU all swarm processes spent in secure-aggregation client code, summed over the clients
  (``swarm_cpu_s / n`` per client); each swarm thread's own CPU time (``time.thread_time``: paho's network
  threads are not counted);
* ``coordinator_cpu_s``: the coordinator's own secure-aggregation work (validation, routing, unmasking).

Also in process (no broker): the masking core alone (:func:`neurofed.trainer.fl.secagg.secure_weighted_mean`) with the
SecAgg+ graph, 0 % and 10 % dropout.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import queue
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from neurofed.broker.bench import Swarm
from neurofed.broker.config import config_from_dict
from neurofed.broker.coordinator import Coordinator
from neurofed.broker.protocol import (
    StatusMsg,
    TaskMsg,
    UpdateMsg,
    delta_reference,
    encode,
    pack,
    state_sha256,
)
from neurofed.edge.secagg_client import SecAggSession
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.secagg import SecAggError, graph_params, secure_weighted_mean
from neurofed.trainer.fl.server import downlink
from neurofed.trainer.fl.strategies import get_strategy


class SecAggSwarm(Swarm):
    """``n`` simulated clients on one connection: join, answer tasks (plain or masked), follow the secagg steps
    (:class:`neurofed.broker.bench.Swarm`'s joining and model watching, plus the secure-aggregation steps)."""

    def __init__(self, url: str, fed: str, n: int, seed: int = 0, drop_after_shares: frozenset[str] = frozenset(),
                 first: int = 0) -> None:
        super().__init__(url, fed, n, seed, first)
        self.own = frozenset(self.ids)
        for cid in self.ids:  # only its own clients' (another swarm process plays the others)
            self.t.subscribe(self.topics.secagg_down(cid))
        self.sessions: dict[str, SecAggSession] = {}
        self.cpu_s = 0.0
        self.done = False
        self.drop = drop_after_shares  # these clients vanish after sending their shares (their last will: offline)
        self.updates: dict[str, dict[str, torch.Tensor]] = {}  # what each client trained, last round
        self.tasks = 0
        self.refused: list[str] = []  # "client: reason" of every secure-aggregation step a client refused
        self.marks: list[tuple[str, int, float, int]] = []  # (kind, round, cpu_s, bytes) at each task / the end

    def _send(self, cid: str, out: list) -> None:
        for m, tensors in out:
            self.t.publish(self.topics.secagg(cid), encode(m, tensors), wait=None)

    def _on_task(self, task: TaskMsg) -> None:
        self.tasks += 1
        g = self.global_state or {}
        down = downlink(g, get_strategy(task.strategy), self.model)
        base = state_sha256(down)
        ref = delta_reference(g)
        for cid in (c for c in task.selected if c in self.own):  # another swarm process answers for the rest
            st = {k: v + 1e-3 * torch.randn(v.shape, generator=self.rng) if v.is_floating_point() else v
                  for k, v in {**g, **down}.items()}
            upd = ClientUpdate(st, 45, {}, {"loss": 0.69})
            self.updates[cid] = st
            if task.secagg is None:
                u = UpdateMsg(federation=self.fed, sender=cid, round=task.round, task_id=task.task_id, n_samples=45,
                              base_sha256=base, metrics={"loss": 0.69}, run_id=task.run_id)
                self.t.publish(self.topics.update(cid), encode(u, pack({"state": st, "extra": {}}),
                                                               compress=task.compress, reference=ref), wait=None)
                continue
            t0 = time.thread_time()
            s = self.sessions[cid] = SecAggSession(self.fed, cid, task)
            out = [(s.keys_msg(), None)] + s.set_update(upd, g)
            self.cpu_s += time.thread_time() - t0
            self._send(cid, out)

    def handle(self, item, msg, tensors) -> None:
        """:meth:`neurofed.broker.bench.Swarm.handle`, plus the secure-aggregation steps of each simulated client."""
        cid = item.topic.rsplit("/", 1)[-1]
        if msg.kind == "task" or (msg.kind == "result" and msg.final):  # a round boundary: the counters so far
            self.marks.append((msg.kind, int(msg.round), self.cpu_s, self.t.bytes_in + self.t.bytes_out))
        if not msg.kind.startswith("sa_"):
            super().handle(item, msg, tensors)
        elif cid in self.sessions:
            t0 = time.thread_time()
            try:
                out = self.sessions[cid].step(msg)
            except SecAggError as exc:  # the client refuses the round (as EdgeClient does); the coordinator
                self.refused.append(f"{cid}: {exc}")  # recovers without it or re-issues the round
                del self.sessions[cid]
                return
            finally:
                self.cpu_s += time.thread_time() - t0
            self._send(cid, out)
            if cid in self.drop and any(m.kind == "sa_shares" for m, _ in out):
                del self.sessions[cid]
                self.t.publish(self.topics.status(cid), encode(StatusMsg(federation=self.fed, sender=cid,
                                                                         state="offline")), retain=True, wait=None)

    def close(self) -> None:
        self.t.close()


def _swarm_process(url: str, fed: str, first: int, n: int, q: Any) -> None:
    """Child process: swarm clients ``first .. first + n - 1``, beside the coordinator (not its interpreter and GIL).

    Puts ``{"marks": ..., "refused": ...}`` on ``q`` when the federation's final result arrives, or
    ``{"error": ...}``.
    """
    torch.set_num_threads(1)
    try:
        swarm = SecAggSwarm(url, fed, n, seed=first, first=first)
        swarm.wait_model(120.0)
        swarm.join(swarm.spec)
        swarm.serve(threading.Event())  # returns at the final result
        q.put({"marks": swarm.marks, "refused": swarm.refused})
        swarm.close()
    except Exception as exc:  # reported by the parent, which names the federation
        q.put({"error": f"{type(exc).__name__}: {exc}"})


def _swarm_rounds(marks: list[tuple[str, int, float, int]]) -> dict[int, tuple[float, int]]:
    """Per round: the swarm's (CPU s, bytes) from the round's first task to the next round's task (or the end)."""
    starts: dict[int, int] = {}
    for i, (kind, r, _, _) in enumerate(marks):
        if kind == "task":
            starts.setdefault(r, i)
    out = {}
    for r, i in starts.items():
        j = next((j for j in range(i + 1, len(marks)) if marks[j][0] != "task" or marks[j][1] != r), None)
        if j is not None:
            out[r] = (marks[j][2] - marks[i][2], marks[j][3] - marks[i][3])
    return out


def run_rounds(url: str, n: int, secure: bool, rounds: int, phase_s: float = 60.0, procs: int = 1, *,
               fed: str | None = None, swarm_urls: list[str] | None = None,
               federation: dict[str, Any] | None = None, profiler: Any = None, model: str = "eegnet"
               ) -> dict[str, Any]:
    """One federation of ``n`` swarm clients, ``rounds`` rounds; per-round time, bytes, the coordinator's CPU and RSS.

    The coordinator runs here (a thread), the clients in ``procs`` child processes (each plays a contiguous
    slice of them in turn): on the critical path of a round the clients' work then overlaps the coordinator's,
    and each other's, as it would with clients on their own hosts, although here ``n`` clients share
    ``procs`` processes on the same cores as the coordinator and the broker (``swarm_cpu_s`` is their total).

    ``fed``: the federation's name (default: a fresh one); ``swarm_urls``: one broker URL per swarm process
    (e.g. each with its own credentials; default ``url`` for all); ``federation``: overrides of its
    ``[federation]`` section; ``model``: the model's name; ``profiler``: a :class:`cProfile.Profile` the coordinator's thread runs under. A
    coordinator that fails (e.g. not every client joined in time) is raised here.
    """
    import psutil

    fed = fed or f"sa{uuid.uuid4().hex[:6]}"
    cfg = config_from_dict({"federation": {"name": fed, "rounds": rounds, "fraction": 1.0, "min_clients": n,
                                           "round_deadline_s": 600, "strategy": "fedavg", "join_timeout_s": 300,
                                           "strategy_overrides": {"clip_mult": 0.0}, "secure_aggregation": secure,
                                           **(federation or {})},
                            "secagg": {"phase_s": phase_s}, "model": {"name": model},
                            "output": {"dir": f"/tmp/neurofed-bench/{fed}"}})
    me = psutil.Process()
    rss0 = me.memory_info().rss
    coord = Coordinator(cfg, url)
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            if profiler is not None:
                profiler.runcall(coord.run, stop)
            else:
                coord.run(stop)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            failed.append(exc)

    ct = threading.Thread(target=run, daemon=True)
    t_start = time.monotonic()
    ct.start()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    cuts = np.linspace(0, n, max(1, min(procs, n)) + 1).astype(int)
    urls = swarm_urls or [url] * (len(cuts) - 1)
    kids = [ctx.Process(target=_swarm_process, args=(urls[i], fed, int(a), int(b - a), q), daemon=True)
            for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
    for p in kids:
        p.start()
    snaps, seen, peak, t_joined = [], 0, rss0, None
    cpu = [me.cpu_times()]
    while ct.is_alive():  # the coordinator's per-round counters: snapshot at every round's end
        peak = max(peak, me.memory_info().rss)
        if t_joined is None and coord.current is not None:  # the first round opened: the join phase is over
            t_joined, cpu[0] = time.monotonic(), me.cpu_times()
        if len(coord.metrics) > seen:
            seen = len(coord.metrics)
            snaps.append(coord.transport.bytes_in + coord.transport.bytes_out)
            cpu.append(me.cpu_times())
        time.sleep(0.005)
    ct.join()
    if failed:
        for p in kids:
            p.terminate()
            p.join(10)
        raise failed[0]
    reps = []
    try:
        for _ in kids:
            reps.append(q.get(timeout=60))
    except queue.Empty:
        reps.append({"error": "a swarm process sent nothing within 60 s of the federation's end"})
    finally:
        for p in kids:
            p.join(10)
            if p.is_alive():
                p.terminate()
    if errors := [r["error"] for r in reps if "error" in r]:
        raise RuntimeError(f"bench secagg, federation {fed} ({n} clients): swarm failed: {'; '.join(errors)}")
    per = [_swarm_rounds([tuple(m) for m in r["marks"]]) for r in reps]
    rows = []
    prev = 0
    for m, snap in zip(coord.metrics, snaps):
        r = int(m["round"]) - 1  # task r is the round that ends as r + 1
        got = [p[r] for p in per if r in p]
        cpu_s = sum(c for c, _ in got) if len(got) == len(per) else float("nan")
        sb = sum(b for _, b in got)
        c0, c1 = cpu[len(rows)], cpu[len(rows) + 1]
        rows.append({"round": m["round"], "round_s": round(m["seconds"], 3), "participants": len(m["participants"]),
                     "coordinator_bytes": snap - prev, "broker_bytes": snap - prev + sb,
                     "swarm_cpu_s": round(cpu_s, 3), "secagg": m.get("secagg"),
                     # this process: the coordinator, its transport's network thread (and this loop's polling)
                     "coordinator_process_cpu_s": round(c1.user + c1.system - c0.user - c0.system, 3)})
        prev = snap
    return {"clients": n, "secure": secure, "swarm_processes": len(kids), "rounds": rows,
            "joined": len(coord.registry), "rejections": dict(coord.rejections),
            "join_s": round(t_joined - t_start, 2) if t_joined is not None else None,  # start to the first task
            "coordinator_rss_mb": {"before": round(rss0 / 2**20, 1), "peak": round(peak / 2**20, 1)},
            "refused": [x for r in reps for x in r["refused"]]}


def core_cost(n: int, drop: float, d: int = 1653) -> dict[str, Any]:
    """The masking core alone, in process, SecAgg+ graph: every client's and the server's work, serially."""
    rng = np.random.default_rng(0)
    ups = {c: (rng.normal(0, 0.05, d), 45) for c in range(1, n + 1)}
    k, t = graph_params(n)
    dropout = list(range(1, round(drop * n) + 1))
    t0 = time.perf_counter()
    got = secure_weighted_mean(ups, t=t, neighbours=k, dropout=dropout)
    sec = time.perf_counter() - t0
    keep = [c for c in ups if c not in dropout]
    err = float(np.abs(got - sum(ups[c][0] for c in keep) / len(keep)).max())
    return {"clients": n, "dropout": drop, "k": k, "t": t, "seconds_total": round(sec, 3),
            "max_abs_error_vs_plain_mean": err}


def bench_secagg(sizes: list[int], rounds: int = 2, broker: str = "mqtt://127.0.0.1:1883",
                 out: Path = Path("docs/bench/secagg_mqtt.json"), core: bool = True, swarm_procs: int = 0,
                 clients: str | None = None) -> None:
    """Secure aggregation's round overhead over MQTT (time, bytes) vs plain FedAvg rounds, for ``sizes`` clients;
    results to ``out`` (``clients``: the option as typed, for the recorded command)."""
    torch.set_num_threads(1)
    procs = swarm_procs or os.cpu_count() or 1
    clients = clients if clients is not None else ",".join(map(str, sizes))
    res: dict[str, Any] = {
        "command": f"neurofed bench secagg --clients {clients} --rounds {rounds} --broker {broker} --out {out}"
                   + ("" if core else " --no-core") + (f" --swarm-procs {swarm_procs}" if swarm_procs else ""),
        "swarm_processes": procs,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_average_start": os.getloadavg(), "torch": torch.__version__},
        "setting": "FedAvg (clip_mult 0), EEGNet 21 ch 80 Hz (1653 floating entries), fraction 1.0, swarm clients "
                   "(no training) in swarm_processes child processes, k and t from [secagg] defaults (neighbours 0 = 2 ceil(1.5 log2 n), threshold 0.5)",
        "mqtt": [], "core_in_process": []}
    for n in sizes:
        row: dict[str, Any] = {"clients": n}
        for secure in (False, True):
            r = run_rounds(broker, n, secure, rounds, procs=procs)
            row["secagg" if secure else "plain"] = r
            print(json.dumps({"clients": n, "secure": secure, "rounds": r["rounds"]}), flush=True)
        def med(rows, key):
            return float(np.median([x[key] for x in rows]))

        p, s = row["plain"]["rounds"], row["secagg"]["rounds"]
        row["summary"] = {
            "plain_round_s": med(p, "round_s"), "secagg_round_s": med(s, "round_s"),
            "time_ratio": round(med(s, "round_s") / med(p, "round_s"), 2),
            "plain_broker_bytes": med(p, "broker_bytes"), "secagg_broker_bytes": med(s, "broker_bytes"),
            "bytes_ratio": round(med(s, "broker_bytes") / med(p, "broker_bytes"), 2),
            "plain_coordinator_bytes": med(p, "coordinator_bytes"), "secagg_coordinator_bytes": med(s, "coordinator_bytes"),
            "swarm_cpu_s_all_clients": med(s, "swarm_cpu_s"),
            "client_cpu_s_each": round(med(s, "swarm_cpu_s") / n, 4),
            "coordinator_cpu_s": float(np.median([x["secagg"]["coordinator_cpu_s"] for x in s])),
            "k": s[0]["secagg"]["k"], "t": s[0]["secagg"]["t"]}
        res["mqtt"].append(row)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1))
    if core:
        for n in sizes:
            for drop in (0.0, 0.1):
                res["core_in_process"].append(core_cost(n, drop))
                print(json.dumps(res["core_in_process"][-1]), flush=True)
    res["machine"]["load_average_end"] = os.getloadavg()
    out.write_text(json.dumps(res, indent=1))
