"""Phases of ``neurofed demo`` that judge the result: held-out curve, live decoding, evaluation, no-EEG audit."""

from __future__ import annotations

import json
import time

import numpy as np

from neurofed.broker.protocol import decode
from neurofed.demo import Run, console, recording_seconds
from neurofed.edge.store import LocalStore
from neurofed.livewatch import LiveWatch
from neurofed.supervise import DemoError, command
from neurofed.trainer.data import load_eegmmidb_subject
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.evaluate import bca, predict
from neurofed.trainer.models import build_model
from neurofed.wiretap import EegFingerprint, audit


def print_progress(tap, curve, rounds: int) -> None:
    """Print one line per finished round (coordinator's result message + held-out BCA of its model)."""

    curve.poll()
    while not tap.results.empty():
        msg, _ = decode(tap.results.get())
        r = curve.get(msg.round, {})
        console.print(f"  round {msg.round:>3}/{rounds}  {len(msg.participants)} clients  "
                      f"loss {msg.loss if msg.loss is not None else float('nan'):.3f}  "
                      f"up {msg.bytes_up / 1e3:.0f} kB  down {msg.bytes_down / 1e3:.0f} kB  {msg.seconds:.1f} s"
                      + (f"  held-out mean BCA {100 * r['bca']:.1f} %" if "bca" in r else ""))


def wilson(k: int, n: int) -> tuple[float, float] | None:
    """95 % Wilson score interval of a binomial proportion ``k / n`` (scipy.stats.binomtest); None if n = 0."""
    from scipy.stats import binomtest

    if n == 0:
        return None
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def p_above_chance(k: int, n: int, chance: float = 0.5) -> float | None:
    """One-sided exact binomial p-value of ``k`` or more correct of ``n`` under ``chance``."""
    from scipy.stats import binomtest

    return None if n == 0 else float(binomtest(k, n, chance, alternative="greater").pvalue)


def decoded(y: np.ndarray, p: np.ndarray) -> dict:
    """BCA, accuracy, its 95 % Wilson interval and the p-value against chance, from labels and predictions."""

    n, k = len(y), int((np.asarray(y) == np.asarray(p)).sum())
    return {"n": n, "correct": k, "accuracy": k / n if n else None,
            "bca": bca(y, p) if n and len(set(np.asarray(y).tolist())) > 1 else None,
            "accuracy_ci95_wilson": wilson(k, n), "p_above_chance": p_above_chance(k, n)}


class HeldOutCurve:
    """Held-out BCA of every global model the coordinator published (taken off the wire by the wiretap).

    Round 0 is the untrained initial model the coordinator publishes before the first round: the
    baseline every later round is read against. Each point has the BCA per held-out subject and their mean.
    """

    def __init__(self, run: Run, tap) -> None:
        self.run, self.tap = run, tap
        self.points: dict[int, dict] = {}
        self.data = None

    def get(self, r: int, default=None):
        return self.points.get(r, default)

    def poll(self) -> None:
        import torch

        while not self.tap.models.empty():
            _, payload = self.tap.models.get()
            msg, tensors = decode(payload)
            m = msg.meta
            if self.data is None:
                pre = PreprocessConfig.from_dict(m.preprocess)
                self.data = [load_eegmmidb_subject(h, pre, self.run.data_dir) for h in self.run.cfg.heldout]
            torch.manual_seed(0)
            model = build_model(m.model, m.n_channels, m.n_classes, m.n_times, m.sfreq, m.bn_mode)
            model.load_state_dict(tensors)
            per = {sd.subject: bca(sd.y, predict(model, sd.X, 8)) for sd in self.data}
            self.points[msg.round] = {"round": msg.round, "bca": float(np.mean(list(per.values()))),
                                      "per_subject": per}


def live(run: Run) -> dict:
    """Stream every held-out subject at once; one ``edge-client infer`` and one listener per headset."""
    from neurofed.export.runtime import read_onnx_meta  # lazy: onnx, onnxruntime (loaded only when used)

    cfg, t = run.cfg, time.monotonic()
    held = [f"S{h:03d}" for h in cfg.heldout]
    base = f"{run.stream}-heldout"
    streams = {s: base if len(held) == 1 else f"{base}-{s}" for s in held}  # headset-sim's naming
    dur = recording_seconds(run, cfg.heldout)
    console.print(f"[bold]live[/]: held-out {', '.join(held)} stream {dur:.0f} s each at {cfg.live_speed:g}x, "
                  "together; one edge-client infer per headset decodes each cue window with model.onnx")
    go = run.dir / "live.go"
    # headsets first, so their outlets hold the low LSL ports (as in capture); they stream on the go file
    run.sup.start("headset-heldout", command("headset-sim", "--subjects", ",".join(map(str, cfg.heldout)),
                                             "--data-dir", str(run.data_dir), "--runs", cfg.runs,
                                             "--speed", str(cfg.live_speed), "--name", base,
                                             "--wait-consumers", "180", "--lead-in", "0.5", "--go-file", str(go)))
    log, end = run.dir / "logs" / "headset-heldout.log", time.monotonic() + run.budget(120)
    while (not log.is_file() or log.read_text().count("source_id") < len(held)) and time.monotonic() < end:
        run.sup.check_alive(["headset-heldout"], "held-out headsets")
        time.sleep(0.5)
    time.sleep(2.0)
    watches = {}
    for s, stream in streams.items():
        run.sup.start(f"infer-{s}", command("edge-client", "infer", "--model", str(run.dir / "model.onnx"),
                                            "--stream", stream, "--quiet", "--timeout", "120",
                                            "--duration", str(int(dur / cfg.live_speed + 300))))
        watches[s] = LiveWatch(stream, f"{stream}-predictions", timeout=run.budget(150))
        watches[s].start()
    infers = [f"infer-{s}" for s in held]
    end = time.monotonic() + run.budget(150)
    while not all(w.ready.is_set() for w in watches.values()) and time.monotonic() < end \
            and all(w.is_alive() for w in watches.values()):
        run.sup.check_alive([*infers, "headset-heldout"], "live phase")
        time.sleep(0.1)
    go.touch()  # decoders and watches are connected: stream
    try:
        run.sup.wait(["headset-heldout"], run.budget(dur / cfg.live_speed + 120), "held-out headsets")
        run.sup.check_alive(infers, "edge-client infer")
        n, end = -1, time.monotonic() + run.budget(15)
        while sum(len(w.preds) for w in watches.values()) != n and time.monotonic() < end:  # last windows
            n = sum(len(w.preds) for w in watches.values())
            time.sleep(2.0)
    finally:
        for name in infers:
            run.sup.stop(name)
        for w in watches.values():
            w.stop_evt.set()
            w.join(5)
    meta = read_onnx_meta(run.dir / "model.onnx")
    classes, tmax = list(meta.classes), float(meta.preprocess.get("tmax", 4.0))
    per, lats, ys, ps = {}, [], [], []
    for s, w in watches.items():
        if w.error:
            raise DemoError(f"live watch of {s}: {w.error}")
        if not w.preds:
            raise DemoError(f"no live prediction of {s} arrived from edge-client infer (log {run.dir}/logs/infer-{s}.log)")
        # each prediction is matched to the cue whose window it decoded (window end = cue + tmax, in the
        # headset's own stream time, which replay speed does not change); the label is the cue's
        y, p = w.labelled(classes, tmax)
        ys.append(y), ps.append(p)
        lat = w.latencies_ms()
        lats.append(lat)
        per[s] = {"stream": streams[s], "cues": sum(1 for _, lab in w.markers if lab in classes),
                  "predictions": len(w.preds), "matched": len(y), **decoded(y, p)}
    lat = np.concatenate(lats) if lats else np.empty(0)
    np.save(run.dir / "latency_ms.npy", lat)
    pooled = decoded(np.concatenate(ys), np.concatenate(ps))
    bcas = [r["bca"] for r in per.values() if r["bca"] is not None]
    res = {"per_subject": per, "cues": sum(r["cues"] for r in per.values()),
           "predictions": sum(r["predictions"] for r in per.values()),
           "matched": sum(r["matched"] for r in per.values()),
           "bca_live": float(np.mean(bcas)) if bcas else None,
           "pooled": pooled,
           "latency_ms": {"p50": float(np.percentile(lat, 50)) if len(lat) else None,
                          "p99": float(np.percentile(lat, 99)) if len(lat) else None,
                          "max": float(lat.max()) if len(lat) else None, "n": len(lat)}}
    run.phase("live", t)
    return res


def offline(run: Run) -> dict:
    """``neurofed evaluate`` clean on every demo subject, and under attack on the held-out ones (in parallel)."""
    cfg, t = run.cfg, time.monotonic()
    ev = run.dir / "eval"
    ev.mkdir(exist_ok=True)
    model, ckpt = str(run.dir / "model.onnx"), str(run.dir / "coordinator" / "global_model.safetensors")
    subs = ",".join(map(str, [*cfg.subjects, *cfg.heldout]))
    held = ",".join(map(str, cfg.heldout))
    console.print(f"[bold]evaluate[/]: neurofed evaluate (clean: every demo subject, training ones marked; "
                  f"{cfg.attack} at eps {', '.join(map(str, cfg.eps)) or '-'} on the held-out subjects)")
    names = ["eval-clean"]
    run.sup.start("eval-clean", command("neurofed", "evaluate", "--model", model, "--data-dir", str(run.data_dir),
                                        "--subjects", subs, "--trained-on", ",".join(map(str, cfg.subjects)),
                                        "--json", str(ev / "clean.json")))
    for e in cfg.eps:
        n = f"eval-{cfg.attack}-{e:g}"
        run.sup.start(n, command("neurofed", "evaluate", "--model", model, "--data-dir", str(run.data_dir),
                                 "--subjects", held, "--attack", cfg.attack, "--eps", str(e),
                                 "--checkpoint", ckpt, "--trained-on", ",".join(map(str, cfg.subjects)),
                                 "--json", str(ev / f"{cfg.attack}-{e:g}.json")))
        names.append(n)
    run.sup.wait(names, run.budget(400), "neurofed evaluate")
    clean = json.loads((ev / "clean.json").read_text())
    attacks = [{"eps": 0.0, "bca": clean["summary"]["bca"]["mean"]}]
    for e in cfg.eps:
        a = json.loads((ev / f"{cfg.attack}-{e:g}.json").read_text())
        attacks.append({"eps": e, "bca": a["summary"]["bca_attacked"]["mean"]})
    run.phase("evaluate", t)
    heldout = [f"S{h:03d}" for h in cfg.heldout]
    return {"per_subject": {s: r["bca"] for s, r in clean["per_subject"].items()},
            "training_subjects": clean["training_subjects"], "heldout": heldout,
            "bca_offline": clean["summary"]["bca"]["mean"],
            "bca_offline_per_heldout": {s: clean["per_subject"][s]["bca"] for s in heldout},
            "bca_training_set": clean["summary_training"].get("bca"),
            "attack": cfg.attack, "bca_vs_eps": attacks}


def eeg_fingerprint(run: Run, spec) -> tuple:
    """The training headsets' captured trials (raw and preprocessed) and their fingerprint set.

    Built while ``neurofed export`` runs (the demo process only waits then), so the audit at the end
    only scans the wire.
    """

    t = time.monotonic()
    pre = PreprocessConfig.from_dict(spec.preprocess)
    trials = []
    for s in run.cfg.subjects:
        st = LocalStore(run.store(s))
        raw, _ = st.raw_trials()
        trials += [raw, st.load_subject_data(pre, classes=list(spec.classes)).X]
    return trials, EegFingerprint(trials), time.monotonic() - t


def check_wire(run: Run, tap, spec, fingerprint: tuple | None = None) -> dict:
    """The no-EEG audit (neurofed.wiretap) over everything seen on the broker."""

    t = time.monotonic()
    trials, fp, build_s = fingerprint or eeg_fingerprint(run, spec)
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
    res["fingerprint_build_s"] = round(build_s, 1)  # overlapped with the export when given
    run.phase("wire_audit", t)
    return res
