"""``neurofed bench lsl``: ingestion latency, CPU of the ingestion loop, samples lost with many headsets.

Headsets run in a separate process (firmware_sim players on synthetic data with a ``Samples`` counter
channel); the ingestion loop (pull -> ring buffer, as :class:`neurofed.edge.capture.LiveCapture` does) runs here.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import time
import uuid

import numpy as np

from neurofed.edge.buffer import RingBuffer
from neurofed.edge.lsl_config import use_private_session
from neurofed.firmware_sim.recording import Recording

CONFIGS = ((64, 160.0, 4), (256, 1000.0, 10))  # channels, Hz, samples per push


def _private_lsl() -> None:
    """Own LSL session so the benchmark never sees (or disturbs) other streams."""
    if "LSLAPICFG" in os.environ:
        return
    use_private_session("bench")


def _serve(specs: list[tuple[str, int, float, int]], seconds: float, counts) -> None:
    """Child process: one headset per spec (name, channels, rate, chunk); reports samples pushed."""
    from neurofed.firmware_sim.player import (  # lazy: pylsl (loaded after this process's LSL session config is set)
        HeadsetPlayer,
        PlayerConfig,
    )

    players = []
    for name, n_ch, sfreq, chunk in specs:
        n = int(sfreq * 20)
        data = np.random.default_rng(0).normal(0, 20, (n, n_ch - 1)).astype(np.float32)
        rec = Recording(data, sfreq, [f"E{i}" for i in range(n_ch - 1)], [], "synthetic")
        cfg = PlayerConfig(name=name, chunk_size=chunk, speed=1.0, loop=True, counter=True, markers=False,
                           max_samples=int(seconds * sfreq), wait_consumers=20.0, linger=3.0)
        players.append(HeadsetPlayer(rec, cfg))
    for p in players:
        p.start()
    for i, p in enumerate(players):
        p.join(timeout=seconds + 60)
        counts[i] = p.n_pushed


def _ingest(names: list[str], seconds: float, poll: float = 0.005, warmup: float = 1.0) -> dict:
    """Pull every stream into a ring buffer until each is quiet; latency, CPU and counter checks."""
    from neurofed.edge.lsl_io import (  # lazy: pylsl (loaded after this process's LSL session config is set)
        Inlet,
        find_stream,
        local_clock,
    )

    inlets = [Inlet(find_stream(name=n, timeout=20)) for n in names]
    bufs = [RingBuffer(i.meta.n_channels, int(i.meta.sfreq * 30)) for i in inlets]
    counters = [[] for _ in inlets]
    lat_all, lat_newest = [], []
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    last_data = time.monotonic()
    while time.monotonic() - last_data < 1.5 and time.perf_counter() - wall0 < seconds + 30:
        got = False
        for k, (inlet, buf) in enumerate(zip(inlets, bufs)):
            data, ts = inlet.pull()
            if len(ts):
                buf.append(data, ts)
                now = local_clock()
                if time.perf_counter() - wall0 > warmup:  # skip the backlog queued while inlets were opening
                    lat_all.append(now - ts)
                    lat_newest.append(now - ts[-1])
                counters[k].append(data[:, 0].astype(np.int64))
                got = True
        if got:
            last_data = time.monotonic()
        else:
            time.sleep(poll)
    wall = time.perf_counter() - wall0 - 1.5
    cpu = time.thread_time() - cpu0
    for i in inlets:
        i.close()
    got = [np.concatenate(c) if c else np.empty(0, np.int64) for c in counters]
    if not lat_all:
        raise RuntimeError("no samples arrived after the warm-up; run longer (--seconds)")
    lat_all_a, lat_new_a = np.concatenate(lat_all) * 1e3, np.array(lat_newest) * 1e3
    return {
        "received": [len(g) for g in got],
        "gaps": [int(np.sum(np.diff(g) != 1)) if len(g) else 0 for g in got],
        "first": [int(g[0]) if len(g) else -1 for g in got],
        "latency_ms_all_samples": {"p50": float(np.percentile(lat_all_a, 50)), "p99": float(np.percentile(lat_all_a, 99))},
        "latency_ms_newest_sample": {"p50": float(np.percentile(lat_new_a, 50)), "p99": float(np.percentile(lat_new_a, 99))},
        "cpu_percent_one_core": 100.0 * cpu / max(wall, 1e-9),
        "wall_s": wall,
    }


def _run(specs: list[tuple[str, int, float, int]], seconds: float) -> tuple[dict, list[int]]:
    ctx = mp.get_context("spawn")
    counts = ctx.Array("l", len(specs))
    proc = ctx.Process(target=_serve, args=(specs, seconds, counts), daemon=True)
    proc.start()
    try:
        res = _ingest([s[0] for s in specs], seconds, warmup=min(1.0, 0.25 * seconds))
    finally:
        proc.join(timeout=seconds + 90)
        if proc.is_alive():
            proc.terminate()
    return res, list(counts)


def run_bench(seconds: float = 10.0, headsets: int = 8) -> dict:
    """Run the three measurements and return the results (see module docstring)."""
    _private_lsl()
    tag = uuid.uuid4().hex[:6]
    out: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
                 "seconds_per_run": seconds, "poll_interval_s": 0.005, "latency_warmup_s": min(1.0, 0.25 * seconds), "single": [], "multi": {}}
    for n_ch, sfreq, chunk in CONFIGS:
        res, pushed = _run([(f"bench-{tag}-{n_ch}x{int(sfreq)}", n_ch, sfreq, chunk)], seconds)
        out["single"].append({"channels": n_ch, "sfreq": sfreq, "chunk": chunk, "pushed": pushed[0], **res})
    specs = [(f"bench-{tag}-h{i}", 64, 160.0, 4) for i in range(headsets)]
    res, pushed = _run(specs, seconds)
    lost = [p - r for p, r in zip(pushed, res["received"])]
    out["multi"] = {"headsets": headsets, "channels": 64, "sfreq": 160.0, "pushed": pushed,
                    "samples_lost_total": int(sum(lost)), "samples_lost": lost, **res}
    return out
