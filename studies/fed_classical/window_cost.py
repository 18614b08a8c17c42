"""Cost of one window in the classical pipelines' standalone graphs (onnxruntime), written to window_cost.json.

Usage: ``python studies/fed_classical/window_cost.py CSP_STANDALONE.onnx TANGENT_STANDALONE.onnx [SUBJECT]``
(graphs from ``neurofed export --standalone``, see the README's commands). Feeds SUBJECT's (default 37) three
imagery sessions window by window from raw microvolts, three passes after 5 warm-up windows; reports p50/p95 ms,
the graph's node count and the load average.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from neurofed.export.decoder import StandaloneModel
from neurofed.export.standalone import eegmmidb_session_windows


def cost(path: str, subject: int) -> dict:
    m = StandaloneModel(path)
    sessions = eegmmidb_session_windows(subject, list(m.meta.ch_names), list(m.meta.classes), 0.0, 4.0, None)
    ws = [w.astype(np.float32) for _, windows, _, _ in sessions for w in windows]
    state = m.initial_state()
    for w in ws[:5]:
        _, state = m.run(w, state)
    t = []
    for _ in range(3):
        for w in ws:
            t0 = time.perf_counter()
            _, state = m.run(w, state)
            t.append(time.perf_counter() - t0)
    return {"model": m.meta.model, "p50_ms": 1e3 * float(np.median(t)), "p95_ms": 1e3 * float(np.percentile(t, 95)),
            "windows": len(t), "graph_nodes": len(onnx.load(path).graph.node),
            "file_kb": round(os.path.getsize(path) / 1024, 1)}


def main() -> None:
    paths, subject = sys.argv[1:3], int(sys.argv[3]) if len(sys.argv) > 3 else 37
    out = {"graphs": [cost(p, subject) for p in paths], "subject": subject,
           "load_average_1_5_15": list(os.getloadavg()), "cpus": os.cpu_count()}
    Path(__file__).with_name("window_cost.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
