"""Interleaved A/B timing of standalone graphs (onnxruntime, 1 thread), hot and after idling as live decoding does.

Feeds per graph: window 9 of S009's first imagery session after windows 1-8 (settled EA, full BN context), as the
graph's device-profile headset streams it (``neurofed.bench_standalone.device_sessions``; the profile is the
file's last suffix, ``model.<profile>.onnx``). Graphs are timed in rounds, in alternating order, so A and B see
the same machine load; per graph the median over rounds of each round's p50 is reported, with the thread CPU
time per call. ``--idle-rounds`` also times calls that follow a 100 ms sleep (live decoding gets one window per
0.1 s and idles in between: caches, TLB and branch predictors are cold; see docs/BENCHMARKS.md).

Usage::

    python studies/standalone/ab_time.py A/model.lab64.onnx B/model.lab64.onnx ... --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def feeds_for(graph: Path, subject: int) -> dict[str, np.ndarray]:
    from neurofed.bench_standalone import device_sessions
    from neurofed.export.decoder import StandaloneModel
    from neurofed.trainer.data.profiles import get_profile

    sm = StandaloneModel(graph)
    profile = get_profile(graph.stem.split(".")[-1])
    sessions, _, _ = device_sessions(subject, sm.meta, os.environ.get("NEUROFED_DATA"), profile)
    ws = [w for _, x, _, _ in sessions for w in x]
    state = sm.initial_state()
    for w in ws[:8]:
        _, state = sm.run(w, state)
    return {"window": ws[8].astype(np.float32), "state": state}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+", type=Path)
    ap.add_argument("--subject", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--idle-rounds", type=int, default=0)
    ap.add_argument("--idle-calls", type=int, default=30)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess, feeds = {}, {}
    for g in a.graphs:
        feeds[g] = feeds_for(g, a.subject)
        sess[g] = ort.InferenceSession(str(g), so, providers=["CPUExecutionProvider"])
        for _ in range(50):
            sess[g].run(None, feeds[g])
    hot = {g: {"p50": [], "cpu": []} for g in a.graphs}
    idle = {g: [] for g in a.graphs}
    load0 = os.getloadavg()
    for r in range(max(a.rounds, a.idle_rounds)):
        for g in a.graphs if r % 2 == 0 else a.graphs[::-1]:
            s, f = sess[g], feeds[g]
            if r < a.rounds:
                ts = np.empty(a.calls)
                c0 = time.thread_time()
                for i in range(a.calls):
                    t = time.perf_counter()
                    s.run(None, f)
                    ts[i] = time.perf_counter() - t
                hot[g]["cpu"].append(1e3 * (time.thread_time() - c0) / a.calls)
                hot[g]["p50"].append(1e3 * float(np.median(ts)))
            if r < a.idle_rounds:
                ts = np.empty(a.idle_calls)
                for i in range(a.idle_calls):
                    time.sleep(0.1)
                    t = time.perf_counter()
                    s.run(None, f)
                    ts[i] = time.perf_counter() - t
                idle[g].append(1e3 * float(np.median(ts)))
    res = {"load_average_1_5_15_start": list(load0), "load_average_1_5_15_end": list(os.getloadavg()),
           "subject": a.subject, "rounds": a.rounds, "calls": a.calls, "idle_rounds": a.idle_rounds,
           "idle_calls": a.idle_calls, "graphs": {}}
    for g in a.graphs:
        row = {"hot_p50_ms": float(np.median(hot[g]["p50"])), "hot_p50_ms_best_round": float(np.min(hot[g]["p50"])),
               "cpu_ms_per_call": float(np.median(hot[g]["cpu"]))}
        if idle[g]:
            row["after_100ms_idle_p50_ms"] = float(np.median(idle[g]))
        res["graphs"][str(g)] = row
        print(f"{g}: hot p50 {row['hot_p50_ms']:.3f} ms (best round {row['hot_p50_ms_best_round']:.3f}), "
              f"CPU {row['cpu_ms_per_call']:.3f} ms/call"
              + (f", after 100 ms idle p50 {row['after_100ms_idle_p50_ms']:.3f} ms" if idle[g] else ""), flush=True)
    print(f"load average {load0} -> {os.getloadavg()}")
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
