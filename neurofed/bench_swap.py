"""``neurofed bench swap``: how long from a signed release being published to the first window it decodes (issue 55).

A simulated headset (``headset-sim``'s player, a real EEGMMIDB recording at real-time speed on LSL) feeds a real
``edge-client infer --follow`` process (sliding windows); releases signed with a fresh Ed25519 key are published
retained on the federation's release topic of a real broker every ``interval`` seconds, alternating two standalone
graphs (EEGNet, seeds 0 and 1, exported at 160 Hz). The decoder publishes every prediction on MQTT with the release
that decoded it; for each release the latency is ``t_emit`` of its first window minus the moment it was published
(both LSL local clock, the machine's monotonic clock, so comparable across the two processes). Windows lost: the
decoder's own counts (every window decoded or rejected, none skipped) and the window end times published (one step
apart across every swap).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from neurofed_runtime import release as rel

from neurofed.broker.protocol import Topics
from neurofed.broker.releases import ReleaseStore, sign_next
from neurofed.broker.transport import MqttTransport
from neurofed.export.standalone import export_standalone
from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
from neurofed.firmware_sim.recording import load_recording
from neurofed.trainer.checkpoint import ModelMeta, save_checkpoint
from neurofed.trainer.data import load_eegmmidb_subject
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS, subject_files
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.models import build_model

__all__ = ["bench_swap"]


def _models(tmp: Path, data_dir: Path | None, subject: int) -> list[Path]:
    """Two standalone graphs of the same architecture (EEGNet, seeds 0 and 1, untrained: weights do not matter
    for a swap), exported at 160 Hz."""
    cfg = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
    sd = load_eegmmidb_subject(subject, cfg, data_dir)
    out = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        net = build_model("eegnet", sd.X.shape[1], len(sd.classes), sd.X.shape[2], sd.sfreq, "batch_specific")
        meta = ModelMeta("eegnet", sd.X.shape[1], len(sd.classes), sd.X.shape[2], sd.sfreq, "batch_specific",
                         list(sd.ch_names), list(sd.classes), cfg.to_dict(), "fedbs", 8, dict(sd.file_hashes),
                         {"seed": seed})
        ck = save_checkpoint(tmp / f"m{seed}.safetensors", net.state_dict(), meta)
        export_standalone(ck, tmp / f"m{seed}.onnx", rate=160.0)
        out.append(tmp / f"m{seed}.onnx")
    return out


def bench_swap(out: Path, md: Path | None, data_dir: Path | None, subject: int = 3, releases: int = 6,
               interval: float = 3.0, step: float = 0.1, broker: str = "mqtt://127.0.0.1:1883") -> dict[str, Any]:
    """Run the benchmark; write ``out`` (JSON) and, if given, ``md`` (a short Markdown summary); return the result."""
    from pylsl import local_clock  # lazy: liblsl

    if releases < 2:
        raise NeuroFedError("--releases must be >= 2 (release 1 starts the decoder; the others are swaps)")
    tmp = Path(tempfile.mkdtemp(prefix="neurofed-swap-"))
    models = _models(tmp, data_dir, subject)
    priv, pub = rel.keygen(tmp / "keys")
    fed, name = f"swapbench-{uuid.uuid4().hex[:8]}", f"swapbench-{uuid.uuid4().hex[:8]}"
    store = ReleaseStore(tmp / "store")
    payloads = []
    for v in range(1, releases + 1):  # signed beforehand: the latency starts when the release is on the wire
        path, doc = sign_next(store, models[(v - 1) % 2].read_bytes(), priv)
        payloads.append(rel.pack(path.read_bytes(), doc))
    topic, pred_topic = Topics(fed).release, f"neurofed/predictions/{name}"
    pubt = MqttTransport(broker, f"{fed}-publisher").connect(timeout=10)
    sub = MqttTransport(broker, f"{fed}-observer").connect(timeout=10)
    sub.subscribe(pred_topic)
    t_pub = {1: local_clock()}
    pubt.publish(topic, payloads[0], retain=True, wait=10)
    rec = load_recording(subject_files(data_dir, subject, [4])[0], RUN_EVENT_LABELS[4])
    duration = 6.0 + releases * interval + 4.0
    player = HeadsetPlayer(rec, PlayerConfig(name=name, speed=1.0, loop=True, wait_consumers=30.0, markers=False))
    stats_path = tmp / "stats.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    log = open(tmp / "infer.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from neurofed.edge.cli import main; main()", "infer", "--stream", name, "--follow",
         "--pub", str(pub), "--broker", broker, "--federation", fed, "--release-dir", str(tmp / "in"), "--quiet",
         "--mode", "sliding", "--step", str(step), "--mqtt", broker, "--mqtt-topic", pred_topic, "--threads", "1",
         "--duration", f"{duration:.1f}", "--stats-out", str(stats_path), "--timeout", "30"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    msgs: list[dict] = []
    try:
        player.start()
        end = time.monotonic() + 60
        while not msgs and time.monotonic() < end and proc.poll() is None:  # the decoder runs release 1
            if (m := sub.get(0.2)) is not None and m.event == "message":
                msgs.append(json.loads(m.payload))
        if not msgs:
            raise NeuroFedError(f"the decoder produced no window within 60 s (log: {tmp / 'infer.log'})")
        for v in range(2, releases + 1):
            t_next = time.monotonic() + interval
            while time.monotonic() < t_next:
                if (m := sub.get(0.05)) is not None and m.event == "message":
                    msgs.append(json.loads(m.payload))
            t_pub[v] = local_clock()
            pubt.publish(topic, payloads[v - 1], retain=True, wait=10)
        while proc.poll() is None:
            if (m := sub.get(0.2)) is not None and m.event == "message":
                msgs.append(json.loads(m.payload))
        while (m := sub.get(0.5)) is not None:
            if m.event == "message":
                msgs.append(json.loads(m.payload))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        player.stop()
        player.join(10)
        pubt.publish(topic, b"", retain=True, wait=5)  # leave no retained release behind on a shared broker
        pubt.close()
        sub.close()
        log.close()
    if proc.returncode != 0 or not stats_path.is_file():
        raise NeuroFedError(f"edge-client infer exited {proc.returncode}: {(tmp / 'infer.log').read_text()[-1500:]}")
    stats = json.loads(stats_path.read_text())
    preds = [m for m in msgs if "model_version" in m]
    first: dict[int, dict] = {}
    for m in preds:
        first.setdefault(int(m["model_version"]), m)
    lat = {v: (first[v]["t_emit"] - t_pub[v]) * 1e3 for v in range(2, releases + 1) if v in first}
    ends = [m["t_end"] for m in msgs]  # every window decoded or rejected, in order (stream time of its last sample)
    versions = [int(m["model_version"]) for m in preds]
    # consecutive sliding windows end one step apart in stream time: a lost window leaves a gap of two steps
    diffs = np.diff(ends) if len(ends) > 1 else np.zeros(0)
    gaps = int(np.sum(diffs > 1.5 * step) + np.sum(diffs <= 0.5 * step))
    decoded = stats["predictions"] + stats["rejections"]
    arr = np.array(list(lat.values()))
    res = {
        "bench": "swap", "command": f"neurofed bench swap --releases {releases} --interval {interval} --step {step}",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0]},
        "settings": {"subject": subject, "releases": releases, "interval_s": interval, "step_s": step,
                     "speed": 1.0, "broker": broker.split("@")[-1], "model": "eegnet (21 ch, standalone, 160 Hz)"},
        "swaps": len(lat), "releases_seen": sorted(first),
        "latency_ms": {str(v): round(x, 2) for v, x in lat.items()},
        "latency_ms_p50": float(np.median(arr)) if len(arr) else None,
        "latency_ms_max": float(arr.max()) if len(arr) else None,
        "decoder_swaps": stats.get("swaps", []),
        "windows": {"decoded_or_rejected": decoded, "by_version": stats.get("windows_by_version"),
                    "skipped": stats["skipped"], "predictions_on_mqtt": len(preds), "end_gaps": gaps,
                    "window_end_step_s": [round(float(diffs.min()), 4), round(float(diffs.max()), 4)]
                    if len(diffs) else None,
                    "versions_in_order": versions == sorted(versions)},
        "windows_lost": int(stats["skipped"]) + gaps + (decoded - sum(stats.get("windows_by_version", {}).values())),
        "refused": stats.get("refused", []),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    if md is not None:
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(_markdown(res))
    return res


def _markdown(r: dict[str, Any]) -> str:
    s, w = r["settings"], r["windows"]
    rows = "\n".join(f"| {v} | {x:.1f} |" for v, x in r["latency_ms"].items())
    return f"""# Release swap latency

`{r['command']}` (JSON: [docs/bench/swap.json](../bench/swap.json); code: `neurofed/bench_swap.py`).

A simulated headset replays EEGMMIDB subject {s['subject']} (run 4) in real time on LSL; a real
`edge-client infer --follow` process decodes sliding windows every {s['step_s']} s; {s['releases']} signed releases
(two EEGNet standalone graphs alternating) are published retained on the release topic of the broker at
{s['broker']}, one every {s['interval_s']} s. Latency: release on the wire (publisher's LSL clock) to the `t_emit`
of the first window the decoder decoded with it. Machine: {r['machine']['cpus']} CPUs, 1-min load
{r['machine']['load_1min']:.2f} at the end (shared with other jobs).

| release | published -> first window decoded by it (ms) |
|---|---|
{rows}

p50 {r['latency_ms_p50']:.1f} ms, max {r['latency_ms_max']:.1f} ms over {r['swaps']} swaps. Windows: {w['decoded_or_rejected']}
decoded or rejected, {w['skipped']} skipped, {w['end_gaps']} gaps between consecutive window ends (they are
{w['window_end_step_s'][0]}-{w['window_end_step_s'][1]} s apart: one step, across every swap), versions in
publication order: {w['versions_in_order']} -> **{r['windows_lost']} windows lost**. A swap waits for the next window
boundary (one step, {s['step_s']} s), so the latency is about verification + loading + up to one step.
"""
