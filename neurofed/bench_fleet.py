"""``neurofed bench fleet``: rounds of 100 / 1,000 / 10,000 clients through a real Mosquitto (issue 54).

Each size runs one federation (plain FedAvg, EEGNet, fraction 1.0, no training) on a Mosquitto of its own,
started here with the limits ``neurofed broker-config`` writes for that many clients
(:class:`neurofed.broker.secure.BrokerLimits`; anonymous, loopback). The coordinator runs in this process (a
thread); the clients are :class:`neurofed.bench_secagg.SecAggSwarm` swarms in ``swarm_procs`` child processes
(:func:`neurofed.bench_secagg.run_rounds`), each answering its tasks at once with the global model plus seeded
noise. Per size: time per round, the coordinator's peak RSS and CPU per update, bytes through the broker,
joins and updates accounted for, and Mosquitto's own CPU (to tell whether the broker or the coordinator is the
limit). ``profile``: the coordinator's thread runs under cProfile and its top functions are kept.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from neurofed.bench_secagg import run_rounds
from neurofed.broker.config import config_from_dict
from neurofed.broker.coordinator import initial_model, largest_body
from neurofed.broker.embedded import free_port, port_open
from neurofed.broker.protocol import UpdateMsg, decode, delta_reference, encode, pack
from neurofed.broker.secure import BrokerLimits
from neurofed.broker.validation import UpdateRules, check_update, tensor_specs
from neurofed.trainer.errors import NeuroFedError

#: the federation every size runs (:func:`neurofed.bench_secagg.run_rounds`'s plain rounds)
SETTING = ("FedAvg (clip_mult 0), EEGNet 21 ch 80 Hz, fraction 1.0, plain aggregation, swarm clients (no training) "
           "in swarm_processes child processes; a Mosquitto of its own per size with broker-config's limits")


class SizedMosquitto:
    """A Mosquitto on a free loopback port with :class:`BrokerLimits` for ``clients`` (anonymous: a bench)."""

    def __init__(self, clients: int, max_body: int) -> None:
        if shutil.which("mosquitto") is None:
            raise NeuroFedError("bench fleet needs mosquitto (apt-get install mosquitto)")
        self.port = free_port()
        self.limits = BrokerLimits(clients, max_body)
        self.dir = Path(tempfile.mkdtemp(prefix="neurofed-fleet-"))
        os.chmod(self.dir, 0o755)  # run as root, mosquitto drops to its own user
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text("\n".join([f"listener {self.port} 127.0.0.1", "allow_anonymous true",
                                        "persistence false", "set_tcp_nodelay true", "log_dest none",
                                        *self.limits.conf_lines()]) + "\n")
        self.proc = subprocess.Popen(["mosquitto", "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        end = time.monotonic() + 10
        while not port_open("127.0.0.1", self.port):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.close()
                raise NeuroFedError("bench fleet: mosquitto did not start")
            time.sleep(0.05)
        self.ps = psutil.Process(self.proc.pid)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def top_functions(prof: cProfile.Profile, n: int = 25) -> list[dict[str, Any]]:
    """The coordinator thread's ``n`` most expensive functions by cumulative time (cProfile)."""
    st = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({fn})", "calls": nc, "tottime_s": round(tt, 3),
                     "cumtime_s": round(ct, 3)})
    return sorted(rows, key=lambda r: -r["cumtime_s"])[:n]


def codec_cost(model: str, reps: int = 5) -> dict[str, Any]:
    """Per update, in process: the bytes of one swarm update of ``model`` and the time to encode it (a client)
    and decode it (the coordinator), with the default compression (delta, bit-shuffle, LZMA2) and without, and
    the coordinator's validation of it (``validate_ms``)."""
    cfg = config_from_dict({"model": {"name": model}})
    g = {k: v.detach().clone() for k, v in initial_model(cfg).state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    st = {k: v + 1e-3 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v for k, v in g.items()}
    msg = UpdateMsg(federation="f", sender="c1", round=0, task_id="0" * 32, n_samples=45, base_sha256="0" * 64)
    body, ref = pack({"state": st, "extra": {}}), delta_reference(g)
    out: dict[str, Any] = {"model": model}
    for name, kw in (("compressed", {"compress": True, "reference": ref}), ("uncompressed", {})):
        t0 = time.perf_counter()
        for _ in range(reps):
            payload = encode(msg, body, **kw)
        t1 = time.perf_counter()
        for _ in range(reps):
            decode(payload, reference=kw.get("reference"))
        t2 = time.perf_counter()
        out[name] = {"bytes": len(payload), "encode_ms": round(1000 * (t1 - t0) / reps, 2),
                     "decode_ms": round(1000 * (t2 - t1) / reps, 2)}
    # the coordinator's validation of one decoded update (shapes, finiteness, the absurd-update distance)
    rules = UpdateRules(round=0, task_id="0" * 32, base_sha256="0" * 64, selected=frozenset({"c1"}),
                        state_specs=tensor_specs(g), extra_specs={}, global_state=g, max_update_ratio=10.0)
    got = decode(encode(msg, body))
    t0 = time.perf_counter()
    for _ in range(reps):
        check_update(got[0], got[1], rules, set(), set())
    out["validate_ms"] = round(1000 * (time.perf_counter() - t0) / reps, 3)
    return out


def run_size(n: int, rounds: int, procs: int, profile: bool, model: str = "eegnet",
             compress: bool = True) -> dict[str, Any]:
    """One federation of ``n`` clients on its own sized Mosquitto; the measurements of :mod:`this bench
    <neurofed.bench_fleet>`."""
    fed = f"fleet{n}-{os.getpid()}"
    body = largest_body(config_from_dict({"federation": {"name": fed, "strategy": "fedavg",
                                                         "strategy_overrides": {"clip_mult": 0.0}},
                                          "model": {"name": model}}))
    broker = SizedMosquitto(n, body)
    prof = cProfile.Profile() if profile else None
    try:
        b0 = broker.cpu_s()
        res = run_rounds(broker.url, n, False, rounds, procs=procs, fed=fed, model=model,
                         federation={"join_timeout_s": max(300, n * 0.1), "round_deadline_s": max(300, n * 0.1),
                                     "compress": compress},
                         profiler=prof)
        res["broker_cpu_s_total"] = round(broker.cpu_s() - b0, 2)
        res["broker_peak_rss_mb"] = round(broker.ps.memory_info().rss / 2**20, 1)
        res["broker_limits"] = {"max_packet_size": broker.limits.max_packet_size,
                                "max_queued_messages": broker.limits.max_queued_messages,
                                "max_queued_bytes": broker.limits.max_queued_bytes}
    finally:
        broker.close()
    rs = res["rounds"]
    res["summary"] = {
        "clients": n, "joined": res["joined"], "updates_per_round": [r["participants"] for r in rs],
        "all_accounted": res["joined"] == n and all(r["participants"] == n for r in rs),
        "round_s": [r["round_s"] for r in rs], "join_s": res["join_s"],
        "coordinator_peak_rss_mb": res["coordinator_rss_mb"]["peak"],
        "coordinator_cpu_ms_per_update": [round(1000 * r["coordinator_process_cpu_s"] / max(r["participants"], 1), 3)
                                          for r in rs],
        "broker_bytes_per_round": [r["broker_bytes"] for r in rs],
        "coordinator_bytes_per_round": [r["coordinator_bytes"] for r in rs],
        "broker_cpu_s_total": res["broker_cpu_s_total"]}
    if prof is not None:
        res["profile_top"] = top_functions(prof)
    return res


def bench_fleet(sizes: list[int], rounds: int = 2, out: Path = Path("docs/bench/fleet_scale.json"),
                swarm_procs: int = 0, profile: bool = False, clients: str | None = None, model: str = "eegnet",
                compress: bool = True) -> dict[str, Any]:
    """Run :func:`run_size` for each of ``sizes``; results (appended per size as they finish) to ``out``."""
    torch.set_num_threads(1)
    procs = swarm_procs or os.cpu_count() or 1
    clients = clients if clients is not None else ",".join(map(str, sizes))
    res: dict[str, Any] = {
        "command": f"neurofed bench fleet --clients {clients} --rounds {rounds} --out {out}"
                   + (f" --swarm-procs {swarm_procs}" if swarm_procs else "") + (" --profile" if profile else "")
                   + (f" --model {model}" if model != "eegnet" else "") + ("" if compress else " --no-compress"),
        "setting": SETTING.replace("EEGNet 21 ch", f"{model} 21 ch") + ("" if compress else "; compress = false"),
        "swarm_processes": procs, "codec_per_update": codec_cost(model),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_average_start": os.getloadavg(), "torch": torch.__version__},
        "sizes": []}
    out.parent.mkdir(parents=True, exist_ok=True)
    for n in sizes:
        row = run_size(n, rounds, procs, profile, model, compress)
        row["load_average_after"] = os.getloadavg()
        res["sizes"].append(row)
        print(json.dumps(row["summary"]), flush=True)
        out.write_text(json.dumps(res, indent=1))
    res["machine"]["load_average_end"] = os.getloadavg()
    out.write_text(json.dumps(res, indent=1))
    return res
