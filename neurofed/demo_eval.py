"""Phases of ``neurofed demo`` that judge the result: held-out curve, live decoding, evaluation, no-EEG audit."""

from __future__ import annotations

import json
import time

import numpy as np

from neurofed.demo_run import Run, console, recording_seconds
from neurofed.supervise import DemoError, command


def _progress(tap, curve, rounds: int) -> None:
    """Print one line per finished round (coordinator's result message + held-out BCA of its model)."""
    from broker.protocol import decode

    curve.poll()
    while not tap.results.empty():
        msg, _ = decode(tap.results.get())
        r = curve.get(msg.round, {})
        console.print(f"  round {msg.round:>3}/{rounds}  {', '.join(msg.participants)}  "
                      f"loss {msg.loss if msg.loss is not None else float('nan'):.3f}  "
                      f"up {msg.bytes_up / 1e3:.0f} kB  down {msg.bytes_down / 1e3:.0f} kB  {msg.seconds:.1f} s"
                      + (f"  held-out BCA {100 * r['bca']:.1f} %" if "bca" in r else ""))


class HeldOutCurve:
    """Held-out BCA of every global model the coordinator published (taken off the wire by the wiretap)."""

    def __init__(self, run: Run, tap) -> None:
        self.run, self.tap = run, tap
        self.points: dict[int, dict] = {}
        self.data = None

    def get(self, r: int, default=None):
        return self.points.get(r, default)

    def poll(self) -> None:
        import torch

        from broker.protocol import decode
        from trainer.data import load_eegmmidb_subject
        from trainer.data.config import PreprocessConfig
        from trainer.evaluate import bca, predict
        from trainer.models import build_model

        while not self.tap.models.empty():
            _, payload = self.tap.models.get()
            msg, tensors = decode(payload)
            m = msg.meta
            if self.data is None:
                self.data = load_eegmmidb_subject(self.run.cfg.heldout, PreprocessConfig.from_dict(m.preprocess),
                                                  self.run.data_dir)
            torch.manual_seed(0)
            model = build_model(m.model, m.n_channels, m.n_classes, m.n_times, m.sfreq, m.bn_mode)
            model.load_state_dict(tensors)
            self.points[msg.round] = {"round": msg.round, "bca": bca(self.data.y, predict(model, self.data.X, 8))}


def live(run: Run) -> dict:
    from neurofed.livewatch import LiveWatch
    from trainer.evaluate import bca

    cfg, t = run.cfg, time.monotonic()
    h = cfg.heldout
    stream = f"{run.stream}-heldout"
    dur = recording_seconds(run, [h])
    console.print(f"[bold]live[/]: held-out S{h:03d} streams {dur:.0f} s at {cfg.live_speed:g}x; "
                  "edge-client infer decodes each cue window with model.onnx")
    go = run.dir / "live.go"
    run.sup.start("infer", command("edge-client", "infer", "--model", str(run.dir / "model.onnx"), "--stream", stream,
                                   "--quiet", "--timeout", "90", "--duration", str(int(dur / cfg.live_speed + 240))))
    watch = LiveWatch(stream, f"{stream}-predictions", timeout=run.budget(120))
    watch.start()
    run.sup.start("headset-heldout", command("headset-sim", "--subjects", str(h), "--data-dir",
                                                    str(run.data_dir), "--runs", cfg.runs, "--speed", str(cfg.live_speed),
                                                    "--name", stream, "--wait-consumers", "120", "--lead-in", "0.5",
                                                    "--go-file", str(go)))
    end = time.monotonic() + run.budget(120)
    while not watch.ready.is_set() and time.monotonic() < end and watch.is_alive():
        run.sup.check_alive(["infer", "headset-heldout"], "live phase")
        time.sleep(0.1)
    go.touch()  # decoder and watch are connected: stream
    try:
        run.sup.wait(["headset-heldout"], run.budget(dur / cfg.live_speed + 120), "held-out headset")
        run.sup.check_alive(["infer"], "edge-client infer")
        n, end = -1, time.monotonic() + run.budget(15)
        while len(watch.preds) != n and time.monotonic() < end:  # let the last windows through
            n = len(watch.preds)
            time.sleep(2.0)
    finally:
        run.sup.stop("infer")
        watch.stop_evt.set()
        watch.join(5)
    if watch.error:
        raise DemoError(f"live watch: {watch.error}")
    from export.metadata import read_onnx_meta

    meta = read_onnx_meta(run.dir / "model.onnx")
    y, p = watch.labelled(list(meta.classes), float(meta.preprocess.get("tmax", 4.0)))
    lat = watch.latencies_ms()
    np.save(run.dir / "latency_ms.npy", lat)
    n_cues = sum(1 for _, lab in watch.markers if lab in meta.classes)
    res = {"stream": stream, "cues": n_cues, "predictions": len(watch.preds), "matched": len(y),
           "bca_live": bca(y, p) if len(y) and len(set(y.tolist())) > 1 else None,
           "latency_ms": {"p50": float(np.percentile(lat, 50)) if len(lat) else None,
                          "p99": float(np.percentile(lat, 99)) if len(lat) else None,
                          "max": float(lat.max()) if len(lat) else None, "n": len(lat)}}
    if not watch.preds:
        raise DemoError(f"no live prediction arrived from edge-client infer (log {run.dir}/logs/infer.log)")
    run.phase("live", t)
    return res


def offline(run: Run) -> dict:
    """``neurofed evaluate`` clean on every demo subject, and under attack on the held-out one (in parallel)."""
    cfg, t = run.cfg, time.monotonic()
    ev = run.dir / "eval"
    ev.mkdir(exist_ok=True)
    model, ckpt = str(run.dir / "model.onnx"), str(run.dir / "coordinator" / "global_model.safetensors")
    subs = ",".join(map(str, [*cfg.subjects, cfg.heldout]))
    console.print(f"[bold]evaluate[/]: neurofed evaluate (clean: subjects {subs}; {cfg.attack} at eps "
                  f"{', '.join(map(str, cfg.eps)) or '-'} on S{cfg.heldout:03d})")
    names = ["eval-clean"]
    run.sup.start("eval-clean", command("neurofed", "evaluate", "--model", model, "--data-dir", str(run.data_dir),
                                        "--subjects", subs, "--json", str(ev / "clean.json")))
    for e in cfg.eps:
        n = f"eval-{cfg.attack}-{e:g}"
        run.sup.start(n, command("neurofed", "evaluate", "--model", model, "--data-dir", str(run.data_dir),
                                 "--subjects", str(cfg.heldout), "--attack", cfg.attack, "--eps", str(e),
                                 "--checkpoint", ckpt, "--json", str(ev / f"{cfg.attack}-{e:g}.json")))
        names.append(n)
    run.sup.wait(names, run.budget(400), "neurofed evaluate")
    clean = json.loads((ev / "clean.json").read_text())
    attacks = [{"eps": 0.0, "bca": clean["per_subject"][f"S{cfg.heldout:03d}"]["bca"]}]
    for e in cfg.eps:
        a = json.loads((ev / f"{cfg.attack}-{e:g}.json").read_text())
        attacks.append({"eps": e, "bca": a["per_subject"][f"S{cfg.heldout:03d}"]["bca_attacked"]})
    run.phase("evaluate", t)
    return {"per_subject": {s: r["bca"] for s, r in clean["per_subject"].items()},
            "heldout": f"S{cfg.heldout:03d}", "bca_offline": clean["per_subject"][f"S{cfg.heldout:03d}"]["bca"],
            "attack": cfg.attack, "bca_vs_eps": attacks}


def check_wire(run: Run, tap, spec) -> dict:
    """The no-EEG audit (neurofed.wiretap) over everything seen on the broker."""
    from edge.store import LocalStore
    from neurofed.wiretap import EegFingerprint, audit
    from trainer.data.config import PreprocessConfig
    from trainer.models import build_model

    t = time.monotonic()
    pre = PreprocessConfig.from_dict(spec.preprocess)
    trials = []
    for s in run.cfg.subjects:
        st = LocalStore(run.store(s))
        raw, _ = st.raw_trials()
        trials += [raw, st.load_subject_data(pre, classes=list(spec.classes)).X]
    fp = EegFingerprint(trials)
    model = build_model(spec.model, spec.n_channels, spec.n_classes, spec.n_times, spec.sfreq, spec.bn_mode)
    specs = {k: (tuple(v.shape), str(v.dtype)) for k, v in model.state_dict().items()}
    res = audit(tap, specs, fp).to_dict()
    # positive control: the detector must find 8 samples of a captured trial planted in random bytes
    rng = np.random.default_rng(0)
    planted = rng.bytes(512) + np.ascontiguousarray(trials[1][0, 3, 40:48]).tobytes() + rng.bytes(512)
    planted_raw = rng.bytes(301) + np.ascontiguousarray(trials[0][0, :, 100]).tobytes()[:64] + rng.bytes(300)
    res["detector_self_test"] = bool(fp.hits(planted) > 0 and fp.hits(planted_raw) > 0 and fp.hits(rng.bytes(4096)) == 0)
    res["ok"] = bool(res["ok"] and res["detector_self_test"])
    with open(run.dir / "wire_traffic.jsonl", "w") as fh:
        fh.writelines(json.dumps({"t": m.t, "topic": m.topic, "bytes": len(m.payload)}) + "\n" for m in tap.ours)
    res["largest_payload_bytes"] = tap.traffic()["largest_payload"]
    res["one_raw_trial_bytes"] = int(trials[0][0].nbytes)
    res["one_preprocessed_trial_bytes"] = int(trials[1][0].nbytes)
    run.phase("wire_audit", t)
    return res
