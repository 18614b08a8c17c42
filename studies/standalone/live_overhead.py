"""Where a live window's time goes besides the graph (issue 19): per-window Python of the decoder, and idling.

1. Hot, per window: ``CueWindower.poll`` cutting the window from the decoder's ring buffer (30 s + one window,
   as ``edge-client infer`` sizes it) and ``InferenceEngine.process_window`` with the standalone graph
   (stream layout, unit conversion, ``StandaloneModel.check``, the graph, the Prediction), against the bare
   ``session.run`` on the same feeds.
2. After 100 ms of idling (live decoding gets one window per 0.1 s): a 1-node onnxruntime graph (64 x 64 Add)
   and a numpy 64 x 64 add, hot and right after a sleep, with and without 2 ms of spinning first (whether the
   CPU's idle state or cold caches cost the time).

Usage::

    python studies/standalone/live_overhead.py GRAPH.onnx [GRAPH2.onnx ...]
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np


def python_overhead(path: str, reps: int = 300) -> None:
    from neurofed.edge.infer import InferenceEngine, StandaloneStep
    from neurofed.edge.infer_cli import make_buffer
    from neurofed.edge.windowing import CueWindower
    from neurofed.export.decoder import StandaloneModel

    sm = StandaloneModel(path)
    m, rate = sm.meta, sm.info.rate
    eng = InferenceEngine(sm, m.ch_names, rate, stream_units=[sm.info.unit] * len(m.ch_names),
                          decoder=StandaloneStep(sm, rate))
    buf = make_buffer(eng)  # float64, as edge-client infer
    rng = np.random.default_rng(0)
    n = buf.capacity + 100
    buf.append(rng.standard_normal((n, len(m.ch_names))) * 20 / sm.info.unit_to_uv, np.arange(n) / rate, 0.0)
    wdw = CueWindower(eng.window_samples, rate, eng.cfg.tmin, marker_timeout=60)
    t_cue = (n - 1) / rate - 5.0

    def cut():
        wdw.add_cue(t_cue, "x", 0.0)
        return wdw.poll(buf, 0.0)[0]

    for _ in range(20):
        eng.process_window(cut())
    w0 = cut()
    feeds = {"window": np.ascontiguousarray(eng.layout.select(w0.data) / sm.info.unit_to_uv, np.float32),
             "state": eng.state}
    tc, tp, tg = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        w = cut()
        t1 = time.perf_counter()
        eng.process_window(w)
        t2 = time.perf_counter()
        sm.session.run(None, feeds)
        t3 = time.perf_counter()
        tc.append(t1 - t0)
        tp.append(t2 - t1)
        tg.append(t3 - t2)
    def med(v):
        return 1e3 * float(np.median(v))

    print(f"{path}: poll+cut {med(tc):.3f} ms, process_window {med(tp):.3f} ms, bare graph {med(tg):.3f} ms "
          f"-> Python around the graph {med(tc) + med(tp) - med(tg):.3f} ms per window "
          f"(load {os.getloadavg()[0]:.1f})", flush=True)


def idle_cost(n: int = 30) -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
                          [helper.make_tensor("c", TensorProto.FLOAT, [1], [1.0])])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    s = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
                             .SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = {"x": np.ones((64, 64), np.float32)}
    calls = {"onnxruntime 1-node graph": lambda: s.run(None, x), "numpy 64x64 add": lambda: x["x"] + 1.0}

    def spin(sec: float) -> None:
        t = time.perf_counter()
        while time.perf_counter() - t < sec:
            pass

    for name, fn in calls.items():
        res = {"hot": [], "after 100 ms sleep": [], "after 100 ms sleep + 2 ms spin": []}
        for _ in range(200):
            t = time.perf_counter()
            fn()
            res["hot"].append(time.perf_counter() - t)
        for _ in range(n):
            time.sleep(0.1)
            t = time.perf_counter()
            fn()
            res["after 100 ms sleep"].append(time.perf_counter() - t)
            time.sleep(0.1)
            spin(0.002)
            t = time.perf_counter()
            fn()
            res["after 100 ms sleep + 2 ms spin"].append(time.perf_counter() - t)
        print(f"{name}: " + ", ".join(f"{k} {1e3 * np.median(v):.3f} ms" for k, v in res.items()), flush=True)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        python_overhead(p)
    idle_cost()
    print(f"load average {os.getloadavg()}")
