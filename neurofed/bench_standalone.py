"""``neurofed bench standalone``: the standalone graph against the Python pipeline (edge engine).

Lives in neurofed/ because it joins export/ (the graph) and edge/ (the engine it must equal).
On every held-out subject's whole sessions (cue-locked windows in time order, state carried
across the subject's runs): max |dprob| and class mismatches in onnxruntime and tract (and
onnx.reference on the first session), BCA of both paths, and per-window p50 latency of the
standalone graph (onnxruntime, 1 thread) and of the engine.

A checkpoint for a device profile (e.g. ``seed0_fold00.unicorn8.safetensors`` of ``neurofed simulate
--profiles``) is exported for that profile's rate and unit, and every window is what its headset streams
(:func:`device_sessions`: the recording through the profile, as ``headset-sim --profile`` plays it).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from neurofed.export.bench import time_calls
from neurofed.trainer.bench import BENCH_DIR, write_result
from neurofed.trainer.data.profiles import noise_rng, to_device
from neurofed.trainer.errors import NeuroFedError


def device_sessions(subject: int, meta, data_dir: str | None, profile=None) -> tuple[list, float, list[str] | None]:
    """The subject's imagery sessions as cue-locked raw windows (``eegmmidb_session_windows``), the rate and the
    channel units a stream of them has; with a device profile, each window as that headset streams it
    (:func:`neurofed.trainer.data.profiles.to_device`: its rate, unit and gain, seeded noise)."""
    from neurofed.export.standalone import eegmmidb_session_windows  # lazy: onnx, torch

    sessions = eegmmidb_session_windows(subject, list(meta.ch_names), list(meta.classes), *meta.window, data_dir)
    if profile is None:
        return sessions, sessions[0][3], None
    rng = noise_rng(0, subject, profile)
    out = [(name, to_device(w, rate, list(meta.ch_names), profile, rng), y, profile.sfreq)
           for name, w, y, rate in sessions]
    return out, profile.sfreq, [profile.unit] * len(meta.ch_names)


def compare_subject(plain: Path, standalone: Path, subject: int, data_dir: str | None, reference: bool,
                    profile=None) -> dict:
    """One subject's sessions through the engine, onnxruntime, tract (and onnx.reference on run 1);
    ``profile``: as that device profile's headset streams them (:func:`device_sessions`)."""
    import onnx
    import tract
    from onnx.reference import ReferenceEvaluator

    from neurofed.edge.infer import InferenceEngine  # lazy: onnx, onnxruntime (loaded only when used)
    from neurofed.export.decoder import StandaloneModel  # lazy: onnx, onnxruntime (loaded only when used)
    from neurofed.export.runtime import OnnxModel  # lazy: onnx, onnxruntime (loaded only when used)
    from neurofed.trainer.evaluate import bca  # lazy: torch (loaded only when used)

    om, sm = OnnxModel(plain), StandaloneModel(standalone)
    m = sm.meta
    sessions, rate, units = device_sessions(subject, m, data_dir, profile)
    engine = InferenceEngine(om, m.ch_names, rate, stream_units=units)
    tr = tract.onnx().load(str(standalone)).into_model().into_runnable()
    ref = ReferenceEvaluator(onnx.load(str(standalone))) if reference else None
    runners: dict[str, Callable] = {
        "onnxruntime": lambda w, s: sm.run(w, s),
        "tract": lambda w, s: tuple(t.to_numpy() for t in tr.run([w, s]))[:2],
    }
    if ref is not None:
        runners["onnx_reference"] = lambda w, s: tuple(ref.run(None, {"window": w, "state": s}))[:2]
    states = {k: sm.initial_state() for k in runners}
    want, got, y = [], {k: [] for k in runners}, []
    for i, (_, ws, labels, _) in enumerate(sessions):
        for w in ws:
            want.append(engine.process(w, 0.0).probabilities)
            w32 = w.astype(np.float32)
            for k, run in runners.items():
                if k == "onnx_reference" and i > 0:
                    continue
                p, states[k] = run(w32, states[k])
                got[k].append(p)
        y += list(labels)
    want_a, y_a = np.array(want), np.array(y)
    out: dict = {"subject": f"S{subject:03d}", "windows": len(want_a), "sessions": len(sessions), "runtimes": {}}
    for k, ps in got.items():
        p = np.array(ps)
        n = len(p)
        out["runtimes"][k] = {
            "windows": n,
            "max_abs_prob_diff": float(np.abs(p - want_a[:n]).max()),
            "class_mismatches": int((p.argmax(1) != want_a[:n].argmax(1)).sum()),
        }
    out["bca_python_pipeline"] = bca(y_a, want_a.argmax(1))
    out["bca_standalone_onnxruntime"] = bca(y_a, np.array(got["onnxruntime"]).argmax(1))
    return out


def browsertime_calls(checkpoint: Path, subject: int, data_dir: str | None, web: Path = Path("apps/web")) -> dict:
    """Replay a bundle in headless Chromium (onnxruntime-web, WASM, 1 thread): p50 per window."""
    import shutil
    import socket

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from neurofed.export.apps import (  # lazy: onnx, onnxruntime, torch (loaded only when used)
        make_bundle,
        serve,
    )

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        raise RuntimeError("chromium/chromedriver not installed (apt-get install chromium chromium-driver)")
    with tempfile.TemporaryDirectory() as tmp:
        bundle, page = Path(tmp) / "bundle", Path(tmp) / "web"
        make_bundle(checkpoint, subject, bundle, data_dir)
        shutil.copytree(web, page, ignore=shutil.ignore_patterns("node_modules", "data"))
        (page / "node_modules").symlink_to((web / "node_modules").resolve())
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        httpd = serve(page, bundle, port=port)
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
            opts.add_argument(a)
        d = webdriver.Chrome(service=Service(driver), options=opts)
        try:
            d.get(f"http://127.0.0.1:{port}/index.html?speed=0")
            t = time.monotonic()
            while time.monotonic() - t < 600:
                st = d.execute_script("return window.neurofed && window.neurofed.done ? "
                                      "{error: window.neurofed.error, ms: window.neurofed.ms} : null")
                if st:
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError("the page did not finish within 600 s")
            if st["error"]:
                raise RuntimeError(f"page error: {st['error']}")
            ms = np.array(st["ms"])
            return {"runtime": "onnxruntime-web (WASM, 1 thread), headless Chromium", "windows": len(ms),
                    "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}
        finally:
            d.quit()
            httpd.shutdown()


def bench_standalone(checkpoint: Path, subs: list[int], data_dir: str | None = None, reps: int = 500,
                     warmup: int = 50, out_dir: Path = BENCH_DIR, browser: bool = True,
                     name: str = "standalone") -> None:
    """Standalone graph == Python pipeline on real held-out sessions (ORT, tract, onnx.reference); p50 per window."""
    from rich.console import Console

    from neurofed.edge.infer import InferenceEngine  # lazy: onnx, onnxruntime (loaded only when used)
    from neurofed.export.decoder import StandaloneModel  # lazy: onnx, onnxruntime (loaded only when used)
    from neurofed.export.onnx_export import export_checkpoint  # lazy: onnx, torch (loaded only when used)
    from neurofed.export.runtime import OnnxModel  # lazy: onnx, onnxruntime (loaded only when used)
    from neurofed.export.standalone import export_standalone  # lazy: onnx, torch (loaded only when used)
    from neurofed.trainer.checkpoint import device_of, read_meta  # lazy: torch (loaded only when used)

    console = Console()
    cmeta = read_meta(checkpoint)
    dev = device_of(cmeta)
    if dev is not None and browser:
        raise NeuroFedError(f"{checkpoint} is for device profile {dev.name}: the browser page replays 160 Hz "
                            "recordings; use --no-browser")
    trained = {n[:4] for n in cmeta.data_hashes}
    overlap = [s for s in subs if f"S{s:03d}" in trained]
    if overlap:
        raise NeuroFedError(f"subjects {overlap} were used to train {checkpoint}; pick held-out subjects")
    with tempfile.TemporaryDirectory() as tmp:
        plain, sa = Path(tmp) / "m.onnx", Path(tmp) / "m.standalone.onnx"
        with console.status("exporting..."):
            export_checkpoint(checkpoint, plain, data_dir, verify=False)
            export_standalone(checkpoint, sa)  # the device profile's rate and unit, else 160 Hz, uV
        rows = []
        for i, s in enumerate(subs):
            with console.status(f"S{s:03d}: engine vs standalone graph..."):
                rows.append(compare_subject(plain, sa, s, data_dir, reference=(i == 0), profile=dev))
            r = rows[-1]
            console.print(
                f"S{s:03d}: " + ", ".join(f"{k} |dp| {v['max_abs_prob_diff']:.1e} ({v['class_mismatches']} mism.)"
                                          for k, v in r["runtimes"].items())
                + f"; BCA pipeline {100 * r['bca_python_pipeline']:.1f} %, standalone "
                f"{100 * r['bca_standalone_onnxruntime']:.1f} %"
            )
        sm, om = StandaloneModel(sa, threads=1), OnnxModel(plain, threads=1)
        sessions, rate, units = device_sessions(subs[0], sm.meta, data_dir, dev)
        ws = [w for _, x, _, _ in sessions for w in x]
        state = sm.initial_state()
        for w in ws[:8]:  # a full BN context and a settled EA state
            _, state = sm.run(w, state)
        w32 = ws[8].astype(np.float32)
        feeds = {"window": w32, "state": state}
        with console.status("timing..."):
            lat_graph = time_calls(lambda: sm.session.run(None, feeds), reps, warmup)
            lat_run = time_calls(lambda: sm.run(w32, state), reps, warmup)
            engine = InferenceEngine(om, om.meta.ch_names, rate, stream_units=units)
            for w in ws[:8]:
                engine.process(w, 0.0)
            lat_engine = time_calls(lambda: engine.process(ws[8], 0.0), reps, warmup)
    lat_browser = None
    if browser:
        with console.status("browser (onnxruntime-web)..."):
            lat_browser = browsertime_calls(checkpoint, subs[0], data_dir)
    bca_p = float(np.mean([r["bca_python_pipeline"] for r in rows]))
    bca_s = float(np.mean([r["bca_standalone_onnxruntime"] for r in rows]))
    result = {
        "checkpoint": {"model": cmeta.model, "bn_mode": cmeta.bn_mode, "strategy": cmeta.strategy,
                       "trained_on": sorted(trained)},
        "device_profile": dev.to_dict() if dev is not None else None,
        "threads": 1,
        "load_average_1_5_15": list(os.getloadavg()),
        "subjects": rows,
        "max_abs_prob_diff": {k: max(r["runtimes"][k]["max_abs_prob_diff"] for r in rows if k in r["runtimes"])
                              for k in rows[0]["runtimes"]},
        "class_mismatches": {k: sum(r["runtimes"][k]["class_mismatches"] for r in rows if k in r["runtimes"])
                             for k in rows[0]["runtimes"]},
        "bca_mean": {"python_pipeline": bca_p, "standalone": bca_s, "difference": bca_s - bca_p},
        "latency_per_window": {"standalone_graph_onnxruntime": lat_graph,
                               "standalone_run_with_checks": lat_run, "python_engine": lat_engine,
                               "browser": lat_browser},
        "targets_met": {"parity_le_1e-4": all(
            v["max_abs_prob_diff"] <= 1e-4 and v["class_mismatches"] == 0
            for r in rows for v in r["runtimes"].values()),
            "bca_difference_0": bca_s == bca_p,
            "standalone_p50_le_1ms": lat_graph["p50_ms"] <= 1.0},
    }
    p = write_result(name, result, out_dir)
    console.print(
        f"BCA pipeline {100 * bca_p:.2f} % vs standalone {100 * bca_s:.2f} %; p50 per window: graph "
        f"{lat_graph['p50_ms']:.3f} ms, run() {lat_run['p50_ms']:.3f} ms, Python engine {lat_engine['p50_ms']:.3f} ms "
        + (f", browser {lat_browser['p50_ms']:.2f} ms" if lat_browser else "")
        + f" (load {os.getloadavg()[0]:.1f})\nwrote {p}"
    )
