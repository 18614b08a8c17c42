"""Load-independent cost of one standalone-graph call: callgrind instructions and CPU time per window.

The machine is shared (2 cores, other agents), so wall-clock p50 moves with the load. This script
measures what does not: the instructions onnxruntime (1 thread) executes per ``session.run`` of
the standalone graph, as the difference of two callgrind runs that differ only in the number of
calls (``(I(n_hi) - I(n_lo)) / (n_hi - n_lo)``: session creation, imports and data loading
cancel), plus the thread CPU time and wall p50 per call outside valgrind.

The feeds are a real window of a held-out subject and the state after 8 accepted windows (full BN
context, settled EA), as in ``neurofed bench standalone``.

Usage::

    python studies/standalone/cost.py GRAPH.onnx [GRAPH2.onnx ...] --subject 13 --out cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def feeds_for(graph: Path, subject: int, out: Path) -> None:
    """Window 9 of the subject's first session and the state after windows 1-8, saved as npz."""
    from neurofed.export.decoder import StandaloneModel
    from neurofed.export.standalone import eegmmidb_session_windows

    sm = StandaloneModel(graph)
    m = sm.meta
    sessions = eegmmidb_session_windows(subject, list(m.ch_names), list(m.classes), *m.window)
    ws = [w for _, x, _, _ in sessions for w in x]
    state = sm.initial_state()
    for w in ws[:8]:
        _, state = sm.run(w, state)
    np.savez(out, window=ws[8].astype(np.float32), state=state)


def run_calls(graph: Path, feeds: Path, n: int) -> dict:
    """``n`` calls of the graph in onnxruntime (1 thread); CPU time and wall time per call."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
    f = dict(np.load(feeds))
    sess.run(None, f)  # first call (allocations) outside the counted ones
    wall = np.empty(n)
    c0 = time.thread_time()
    for i in range(n):
        t = time.perf_counter()
        sess.run(None, f)
        wall[i] = time.perf_counter() - t
    cpu = time.thread_time() - c0
    return {"calls": n, "cpu_ms_per_call": 1e3 * cpu / n, "wall_p50_ms": float(1e3 * np.median(wall))}


def callgrind_instructions(graph: Path, feeds: Path, n: int, tmp: Path) -> int:
    """Total instructions (Ir) of a child process doing ``n`` calls, under callgrind."""
    out = tmp / f"cg.{n}.out"
    cmd = ["valgrind", "--tool=callgrind", "--cache-sim=no", f"--callgrind-out-file={out}",
           sys.executable, __file__, "--child", str(graph), str(feeds), str(n)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    m = re.search(r"Collected : (\d+)", r.stderr)
    if r.returncode or not m:
        raise RuntimeError(f"callgrind failed: {r.stderr[-2000:]}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+", type=Path)
    ap.add_argument("--subject", type=int, default=13)
    ap.add_argument("--calls", type=int, default=300, help="timed calls outside valgrind")
    ap.add_argument("--lo", type=int, default=5)
    ap.add_argument("--hi", type=int, default=45)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--root", type=Path, help="name each graph $T/<path relative to ROOT> (e.g. a temporary folder)")
    a = ap.parse_args()
    res: dict = {"load_average_1_5_15": list(os.getloadavg()), "subject": a.subject, "graphs": {}}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for g in a.graphs:
            feeds = tmp / f"{g.stem}.npz"
            feeds_for(g, a.subject, feeds)
            i_lo = callgrind_instructions(g, feeds, a.lo, tmp)
            i_hi = callgrind_instructions(g, feeds, a.hi, tmp)
            row = {"callgrind_instructions_per_call": (i_hi - i_lo) / (a.hi - a.lo),
                   "callgrind_calls": [a.lo, a.hi], **run_calls(g, feeds, a.calls),
                   "state_float64": int(np.load(feeds)["state"].size)}
            res["graphs"][f"$T/{g.relative_to(a.root)}" if a.root else str(g)] = row
            print(f"{g}: {row['callgrind_instructions_per_call'] / 1e6:.2f} M instructions/call, "
                  f"CPU {row['cpu_ms_per_call']:.3f} ms/call, wall p50 {row['wall_p50_ms']:.3f} ms "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    res["load_average_1_5_15_end"] = list(os.getloadavg())
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        run_calls(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
