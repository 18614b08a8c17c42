"""``neurofed bench e2e``: live decoding latency, last EEG sample of a window in -> prediction out, over LSL.

Three real processes on a private LSL session, as on a headset host:

- ``headset-sim`` replays a recorded EEGMMIDB subject in real time (chunks of ``--chunk`` samples);
- ``edge-client infer`` decodes it with an exported ONNX model (guard, online EA, batch-specific BN
  context of the last B windows, onnxruntime on one thread) and publishes each prediction on its
  LSL output stream;
- this process watches the EEG stream and the prediction stream (:class:`neurofed.livewatch.LiveWatch`).

Latency of one prediction = arrival here of the prediction sample - arrival here of the EEG sample that
ends its window (both stamped with the LSL clock by one polling thread). It covers the LSL hop to the
decoder, windowing, preprocessing, EA, the forward pass and the LSL hop back. ``--load N`` adds N more
simulated 64-channel headsets on the same host, each ingested by its own ``edge-client record``
process, so the decoder shares the CPU with a busy host.

Without ``--model`` an EEGNet (batch-specific BN, 21 sensorimotor channels, 80 Hz, 4 s window: the
demo's layout) is exported with random weights (seed 0), verified against torch on the streamed
subject's trials like every export: latency does not depend on weight values.

``--profile P`` streams the subject as device profile P's headset (``headset-sim --profile P``: its
channels, rate, unit and noise) and needs ``--model``: the model for that profile (``neurofed export``
of a hierarchical checkpoint writes one per profile; plain or ``--standalone``).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from neurofed.edge.bench_lsl import _private_lsl
from neurofed.livewatch import LiveWatch
from neurofed.supervise import Supervisor, command
from neurofed.trainer.bench import write_result
from neurofed.trainer.data import PreprocessConfig, load_eegmmidb_subject
from neurofed.trainer.errors import NeuroFedError


def build_latency_model(out: Path, subject: int, data_dir: Path | None) -> Path:
    """Export a random-init EEGNet with the demo's preprocessing and the subject's real channel layout."""
    import torch

    from neurofed.export.onnx_export import export_model  # lazy: onnx, torch (loaded only when used)
    from neurofed.trainer.checkpoint import ModelMeta  # lazy: torch (loaded only when used)
    from neurofed.trainer.models import build_model  # lazy: torch (loaded only when used)

    cfg = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
    sd = load_eegmmidb_subject(subject, cfg, data_dir)
    torch.manual_seed(0)
    net = build_model("eegnet", sd.X.shape[1], len(sd.classes), sd.X.shape[2], sd.sfreq, "batch_specific")
    meta = ModelMeta("eegnet", sd.X.shape[1], len(sd.classes), sd.X.shape[2], sd.sfreq, "batch_specific",
                     list(sd.ch_names), list(sd.classes), cfg.to_dict(), "untrained (latency benchmark)", 8,
                     dict(sd.file_hashes), {"seed": 0})
    export_model(net, meta, out, sd.X[:16], [sd.subject], held_out=False)
    return out


def _stats(ms: np.ndarray) -> dict:
    return {
        "n": len(ms),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
    }


def run_e2e(
    model: Path,
    subject: int,
    data_dir: Path | None,
    seconds: float,
    mode: str = "sliding",
    step: float = 0.1,
    chunk: int = 16,
    load: int = 0,
    log_dir: Path | None = None,
    speed: float = 1.0,
    profile: str | None = None,
) -> dict:
    """Stream ``seconds`` of the subject live, decode, and return latency statistics (see module doc).

    ``speed`` > 1 replays the recording faster than real time (its stream timestamps then run ahead of the
    LSL clock; both latencies reported are real time: the watcher's, and the decoder's own from
    ``edge-client infer --stats-out``). The machine's load averages before and after the run are recorded.
    ``profile``: the decoded headset streams as that device profile (``headset-sim --profile``).
    """

    if mode not in ("sliding", "cue"):
        raise NeuroFedError(f"mode {mode!r}: use sliding or cue")
    if seconds <= 0:
        raise NeuroFedError(f"--seconds must be > 0, got {seconds}")
    if speed <= 0:
        raise NeuroFedError(f"--speed must be > 0, got {speed}")
    load_before = os.getloadavg()
    _private_lsl()
    tag = uuid.uuid4().hex[:8]
    stream = f"bench-e2e-{tag}"
    logs = Path(log_dir or tempfile.mkdtemp(prefix="neurofed-bench-e2e-"))
    sup = Supervisor(logs, dict(os.environ))
    go = logs / f"{tag}.go"
    data_args = ["--data-dir", str(data_dir)] if data_dir else []
    try:
        if load:
            load_subjects = ",".join(str(s) for s in range(1, load + 1))
            sup.start("load-headsets", command("headset-sim", "--subjects", load_subjects, *data_args,
                                               "--name", f"{stream}-load", "--loop", "--wait-consumers", "60"))
            for s in range(1, load + 1):
                sup.start(f"load-record-{s}", command(
                    "edge-client", "record", "--stream", f"{stream}-load-S{s:03d}",
                    "--store", str(logs / f"store-load-{s}"), "--subject", f"S{s:03d}", "--sfreq", "160",
                    "--resolve-timeout", "60", "--duration", str(int(seconds + 120))))
        stats_path = logs / f"{tag}-infer-stats.json"
        sup.start("infer", command("edge-client", "infer", "--model", str(model), "--stream", stream,
                                   "--mode", mode, "--step", str(step), "--quiet", "--timeout", "60",
                                   "--duration", str(int(seconds + 120)), "--stats-out", str(stats_path)))
        watch = LiveWatch(stream, f"{stream}-predictions", timeout=90.0)
        watch.start()
        sup.start("headset", command("headset-sim", "--subject", str(subject), *data_args, "--name", stream,
                                     *(["--profile", profile] if profile else []),
                                     "--chunk-size", str(chunk), "--speed", str(speed), "--loop",
                                     "--wait-consumers", "90",
                                     "--lead-in", "0.5", "--go-file", str(go)))
        end = time.monotonic() + 120
        while not watch.ready.is_set() and watch.is_alive() and time.monotonic() < end:
            sup.check_alive(["infer", "headset"], "bench e2e start-up")
            time.sleep(0.1)
        if not watch.ready.is_set():
            raise NeuroFedError(f"bench e2e: streams never connected ({watch.error or 'timeout'}; logs in {logs})")
        go.touch()
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            sup.check_alive(list(sup.children), "bench e2e")
            time.sleep(0.2)
        watch.stop_evt.set()
        watch.join(timeout=10)
        load_after = os.getloadavg()
    finally:
        sup.stop_all()
    lat = watch.latencies_ms()
    if len(lat) == 0:
        raise NeuroFedError(f"bench e2e: no prediction arrived in {seconds:g} s (logs in {logs})")
    warm = lat[min(len(lat) - 1, 8):]  # the first windows wait for the BN context to fill (not steady state)
    decoder = json.loads(stats_path.read_text()) if stats_path.is_file() else None
    return {
        "mode": mode,
        "speed": speed,
        "step_s": step if mode == "sliding" else None,
        "chunk_samples": chunk,
        "subject": subject,
        "profile": profile,
        "seconds": seconds,
        "load_headsets": load,
        "predictions": len(watch.preds),
        "matched": len(lat),
        "latency_ms": _stats(warm),
        "latency_ms_including_first_8": _stats(lat),
        # the decoder's own log: emission - arrival of the window's last sample (LSL clock, one process)
        "decoder_stats": decoder,
        "load_average_before": list(load_before),  # 1, 5, 15 min
        "load_average_after": list(load_after),
        "cpu_count": os.cpu_count(),
        "logs": str(logs),
    }


def model_targets(model: Path | None) -> dict[str, float]:
    """The latency targets of the path a model runs: the standalone graph's (issue 18: p50 <= 3 ms, p99 <= 5 ms)
    if every model given is a standalone export, else the Python engine's (p50 <= 10 ms, p99 <= 30 ms)."""
    from neurofed.export.runtime import read_onnx_meta  # lazy: onnx, onnxruntime (loaded only when used)

    files = ([] if model is None else sorted(model.glob("*.onnx")) if model.is_dir() else [model])
    if files and all(read_onnx_meta(f).standalone for f in files):
        return {"p50_ms": 3.0, "p99_ms": 5.0}
    return {"p50_ms": 10.0, "p99_ms": 30.0}


def bench_e2e(model: Path | None, subject: int, data_dir: Path | None, seconds: float, mode: str, step: float,
              chunk: int, loads: list[int], speed: float, profiles: list[str | None], out: Path) -> Path:
    """End-to-end live decoding latency: window's last EEG sample in -> prediction out (LSL), one run per load
    (extra busy headsets) and device profile (None: the plain model); results to ``out`` (returned)."""
    with tempfile.TemporaryDirectory(prefix="neurofed-bench-e2e-") as tmp:
        m = model
        if m is None:
            print("exporting a random-init EEGNet (demo layout) for the latency run ...")
            m = build_latency_model(Path(tmp) / "latency.onnx", subject, data_dir)
        elif not (m.is_file() or (profiles != [None] and m.is_dir())):
            raise NeuroFedError(f"{m}: ONNX model not found")
        targets = model_targets(model)
        runs = []
        for p in profiles:
            for n in loads:
                r = run_e2e(m, subject, data_dir, seconds, mode, step, chunk, n,
                            Path(tmp) / f"load{n}-{p or 'plain'}", speed, p)
                r.pop("logs")
                lat = r["latency_ms"]
                dec = r["decoder_stats"] or {}
                r["targets_met"] = {"p50": lat["p50_ms"] <= targets["p50_ms"],
                                    "p99": lat["p99_ms"] <= targets["p99_ms"]}
                print(f"{f'profile {p}, ' if p else ''}load {n} headsets: {r['matched']} predictions, latency p50 "
                      f"{lat['p50_ms']:.2f} ms, p90 {lat['p90_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms, max "
                      f"{lat['max_ms']:.2f} ms; decoder's own p50 {dec.get('latency_ms_p50')} ms; load average "
                      f"before/after {r['load_average_before'][0]:.2f}/{r['load_average_after'][0]:.2f}")
                runs.append(r)
    res = {"model": str(model) if model else "random-init EEGNet, 21 ch, 80 Hz, 4 s window, BN context 8",
           "targets": targets, "runs": runs}
    p = write_result(out.stem, res, out.parent)
    print(f"-> {p}")
    return p
