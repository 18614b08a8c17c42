"""Summary, checks, PNG plots and ``report.md`` of a ``neurofed demo`` run (from its results dict)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(highlight=False, width=None if Console().is_terminal else 120)


def _pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


def _ci(c) -> str:
    return "n/a" if not c else f"{100 * c[0]:.1f}-{100 * c[1]:.1f} %"


def checks(res: dict) -> dict:
    """The demo's pass/fail checks (also what tests/neurofed/test_demo.py asserts)."""
    cfg = res["config"]
    rounds = res.get("federation", {}).get("rounds", [])
    live = res.get("live", {})
    audit = res.get("wire", {}).get("audit", {})
    exp = res.get("export", {})
    c = {
        "rounds_completed": len(rounds) == cfg["rounds"],
        "model_exported": bool(exp) and Path(res["run_dir"], "model.onnx").is_file(),
        "live_predictions": bool(live.get("per_subject")) and all(
            r.get("predictions", 0) > 0 and r.get("matched", 0) > 0 for r in live["per_subject"].values()),
        "no_eeg_on_broker": bool(audit.get("ok")) and audit.get("messages", 0) > 0,
    }
    failed = [k for k, v in c.items() if not v]
    return {**c, "all_ok": not failed, "failed": failed}


def traffic_bytes(res: dict) -> dict:
    rounds = res["federation"]["rounds"]
    tr = res["wire"]["traffic"]
    return {"coordinator_down": sum(r["bytes_down"] for r in rounds), "clients_up": sum(r["bytes_up"] for r in rounds),
            "broker_all_messages": tr["total_bytes"], "broker_messages": tr["total_messages"]}


def capture_totals(capture: dict) -> dict:
    """Trials the training headsets' recorders stored against the cues their headsets sent (None: not known)."""
    known = [v for v in capture.values() if v.get("cues_sent") is not None]
    return {"trials_stored": sum(v["trials"] for v in capture.values()),
            "cues_sent": sum(v["cues_sent"] for v in known) if known and len(known) == len(capture) else None,
            "headsets_short": sorted(c for c, v in capture.items()
                                     if v.get("cues_sent") is not None and v["trials"] < v["cues_sent"])}


def _stored(s: dict) -> str:
    sent = "?" if s.get("cues_sent") is None else s["cues_sent"]
    short = s.get("headsets_short") or []
    return f"{s.get('trials_stored')} / {sent}" + (f" ({len(short)} headsets lost trials)" if short else "")


def heldout_rows(res: dict) -> list[dict]:
    """Per held-out subject: live BCA/accuracy/interval, offline BCA, round-0 and final-round BCA."""
    curve = {p["round"]: p for p in res.get("curve", [])}
    first, last = curve.get(0, {}), curve[max(curve)] if curve else {}
    rows = []
    for s in res["heldout_subjects"]["subjects"]:
        lv = res["live"]["per_subject"][s]
        rows.append({"subject": s, "bca_live": lv["bca"], "correct": lv["correct"], "n": lv["n"],
                     "cues": lv["cues"], "predictions": lv["predictions"], "accuracy_live": lv["accuracy"],
                     "accuracy_ci95_wilson": lv["accuracy_ci95_wilson"], "p_above_chance": lv["p_above_chance"],
                     "bca_offline": res["offline"]["bca_offline_per_heldout"][s],
                     "bca_round0": first.get("per_subject", {}).get(s),
                     "bca_final_round": last.get("per_subject", {}).get(s)})
    return rows


def summarise(res: dict) -> None:
    """Fill ``res['checks']``/``res['summary']`` and print the final summary (the same numbers as report.md)."""
    res["checks"] = checks(res)
    live, off, audit = res["live"], res["offline"], res["wire"]["audit"]
    b = traffic_bytes(res)
    curve = res.get("curve", [])
    r0 = next((p for p in curve if p["round"] == 0), None)
    rows = heldout_rows(res)
    res["summary"] = {
        "heldout": res["heldout_subjects"]["subjects"], "heldout_rule": res["heldout_subjects"]["rule"],
        "chance_level": 0.5, "per_heldout": rows,
        "bca_live": live["bca_live"], "bca_offline": off["bca_offline"],
        "live_pooled": live["pooled"],
        "bca_round0": r0["bca"] if r0 else None,
        "bca_heldout_final_round": curve[-1]["bca"] if curve else None,
        "bca_training_set_offline": (off.get("bca_training_set") or {}).get("mean"),
        "latency_ms_p50": live["latency_ms"]["p50"], "latency_ms_p99": live["latency_ms"]["p99"],
        "predictions": live["predictions"], "cues": live["cues"], **b,
        "no_eeg_on_broker": audit["ok"], "seconds": res["timings_s"]["total"],
        **capture_totals(res.get("capture", {})),
    }
    s = res["summary"]
    cfg = res["config"]
    console.print(f"\n[bold]What was trained[/]: {explain(res)}")
    console.print(f"[bold]Held-out subjects[/] ({', '.join(s['heldout'])}): {s['heldout_rule']}.")
    t = Table(title="Held-out subjects decoded live by model.onnx (never trained on; chance 50 %)", show_lines=False)
    for col in ("subject", "live BCA", "correct/decoded", "95% CI (Wilson)", "p vs 50%", "offline BCA",
                "round-0 BCA", "final BCA"):
        t.add_column(col, justify="left" if col == "subject" else "right", no_wrap=True)
    for r in rows:
        t.add_row(r["subject"], _pct(r["bca_live"]), f"{r['correct']}/{r['n']}",
                  _ci(r["accuracy_ci95_wilson"]), "n/a" if r["p_above_chance"] is None else f"{r['p_above_chance']:.2g}",
                  _pct(r["bca_offline"]), _pct(r["bca_round0"]), _pct(r["bca_final_round"]))
    pooled = s["live_pooled"]
    t.add_row("mean/pooled", _pct(s["bca_live"]), f"{pooled['correct']}/{pooled['n']}",
              _ci(pooled["accuracy_ci95_wilson"]),
              "n/a" if pooled["p_above_chance"] is None else f"{pooled['p_above_chance']:.2g}",
              _pct(s["bca_offline"]), _pct(s["bca_round0"]), _pct(s["bca_heldout_final_round"]), style="bold")
    console.print(t)
    console.print("BCA = balanced accuracy (mean of the per-class recalls); the interval is the 95 % Wilson score "
                  "interval of the live accuracy (correct / decoded), which equals BCA when the classes are balanced "
                  "(EEGMMIDB: ~22-23 left and right cues per subject). p: one-sided exact binomial test against 50 %. "
                  "Round-0: the untrained initial model; final: the last global model in torch (offline).")
    t = Table(title=f"NeuroFed demo ({cfg['algorithm']}, {len(cfg['subjects'])} clients, {cfg['rounds']} rounds)",
              show_lines=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("training subjects, offline BCA (training set: trials they trained on)",
              _pct(s["bca_training_set_offline"]))
    t.add_row("trials stored / cues sent (training headsets)", _stored(s))
    t.add_row("live predictions / cues (held-out)", f"{s['predictions']} / {s['cues']}")
    t.add_row("latency p50 / p99 (last sample -> prediction)",
              "n/a" if s["latency_ms_p50"] is None else f"{s['latency_ms_p50']:.1f} / {s['latency_ms_p99']:.1f} ms")
    t.add_row("bytes down (tasks) / up (updates)", f"{b['coordinator_down'] / 1e6:.2f} / {b['clients_up'] / 1e6:.2f} MB")
    t.add_row("all bytes through the broker", f"{b['broker_all_messages'] / 1e6:.2f} MB in {b['broker_messages']} msgs")
    t.add_row("no EEG on the broker", "[green]PASS[/]" if audit["ok"] else "[red]FAIL[/]")
    t.add_row("wall time", f"{s['seconds']:.0f} s")
    console.print(t)
    if not res["checks"]["all_ok"]:
        console.print(f"[red]failed checks: {', '.join(res['checks']['failed'])}[/]")
    console.print(f"run directory: {res['run_dir']} (report.md, results.json, logs/)")


def explain(res: dict) -> str:
    """What was trained, on whom and how, in words (console and report.md)."""
    from neurofed.trainer.report import subject_ranges  # lazy: scipy (loaded only when used)

    cfg = res["config"]
    n_per_round = max(1, int(cfg["fraction"] * len(cfg["subjects"])))
    return (f"{cfg['algorithm'].upper()} federated training over MQTT of an EEGNet on {len(cfg['subjects'])} "
            f"simulated headsets, one per EEGMMIDB subject ({subject_ranges(cfg['subjects'])}), each replaying runs "
            f"{cfg['runs'].replace(',', '/')} (left/right fist imagery, 45 cued trials) into its own edge client, "
            f"which keeps the trials on the device. {cfg['rounds']} rounds; each round {n_per_round} of the "
            f"{len(cfg['subjects'])} clients (fraction {cfg['fraction']}, seeded) train {cfg['local_epochs']} local "
            f"epochs of SGD (lr {cfg['lr']}, batch {cfg['batch_size']}) on the {cfg['channels']} channel set, band-passed "
            f"8-30 Hz at {cfg['resample']:g} Hz with per-device Euclidean alignment, and send weights only. "
            f"The exported model then decodes {len(cfg['heldout'])} held-out subjects "
            f"({subject_ranges(cfg['heldout'])}) it never saw, live from their headsets.")


# ----------------------------------------------------------------------------- plots
def _plots(d: Path, res: dict) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out: dict[str, str] = {}
    rounds = res["federation"]["rounds"]
    held = res["heldout_subjects"]["subjects"]

    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    curve = res.get("curve", [])
    if curve:
        xs = [p["round"] for p in curve]
        for s in held:
            ax.plot(xs, [100 * p["per_subject"][s] for p in curve], "o-", ms=3, lw=0.8, alpha=0.6, label=s)
        ax.plot(xs, [100 * p["bca"] for p in curve], "o-", color="black", lw=2, ms=4, label="mean of held-out")
        ax.axhline(50, color="grey", lw=0.8, ls=":")
        ax.set_ylabel("held-out BCA (%)")
    ax2 = ax.twinx()
    ax2.plot([r["round"] for r in rounds], [r["loss"] for r in rounds], "s--", color="tab:brown", ms=2, lw=0.8,
             alpha=0.7, label="mean client training loss (right axis)")
    ax2.set_ylabel("training loss")
    ax.set_xlabel("round (0 = untrained initial model)")
    ax.set_title("Held-out BCA of each published global model, and training loss", fontsize=10)
    fig.legend(loc="lower center", fontsize=7, ncol=4, bbox_to_anchor=(0.5, 0.0), frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(d / "learning_curve.png", dpi=110)
    plt.close(fig)
    out["learning_curve"] = "learning_curve.png"

    part = Counter(c for r in rounds for c in r["participants"])
    clients = sorted(res["capture"])
    fig, ax = plt.subplots(figsize=(max(6, 0.3 * len(clients)), 3))
    ax.bar(clients, [part.get(c, 0) for c in clients])
    ax.set_ylabel("rounds trained")
    ax.set_title("Per-client participation (rounds each headset trained in)", fontsize=10)
    plt.setp(ax.get_xticklabels(), rotation=60, ha="right", fontsize=7)
    fig.tight_layout()
    fig.savefig(d / "participation.png", dpi=110)
    plt.close(fig)
    out["participation"] = "participation.png"

    per = res["offline"]["per_subject"]
    live = res["live"]["per_subject"]
    subs = list(per)
    fig, ax = plt.subplots(figsize=(max(7, 0.3 * len(subs)), 3.6))
    ax.bar(subs, [100 * per[s] for s in subs], color=["tab:red" if s in held else "tab:blue" for s in subs],
           label="offline (neurofed evaluate)")
    xi = [subs.index(s) for s in held if live[s]["bca"] is not None]
    ax.plot(xi, [100 * live[subs[i]]["bca"] for i in xi], "k*", ms=10, label="live (edge-client infer)")
    ax.axhline(50, color="grey", lw=0.8, ls=":")
    ax.set_ylabel("BCA (%)")
    ax.set_title("BCA of model.onnx per subject\nblue: training subjects (training-set score); red: held out",
                 fontsize=9)
    plt.setp(ax.get_xticklabels(), rotation=60, ha="right", fontsize=7)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(d / "per_subject_bca.png", dpi=110)
    plt.close(fig)
    out["per_subject_bca"] = "per_subject_bca.png"

    pts = res["offline"]["bca_vs_eps"]
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.plot([p["eps"] for p in pts], [100 * p["bca"] for p in pts], "o-")
    ax.axhline(50, color="grey", lw=0.8, ls=":")
    ax.set_xlabel(f"{res['offline']['attack'].upper()} epsilon (x per-channel std)")
    ax.set_ylabel("mean BCA, held-out (%)")
    ax.set_title("White-box attack on the held-out subjects", fontsize=10)
    fig.tight_layout()
    fig.savefig(d / "bca_vs_eps.png", dpi=110)
    plt.close(fig)
    out["bca_vs_eps"] = "bca_vs_eps.png"

    lat_file = d / "latency_ms.npy"
    lat = np.load(lat_file) if lat_file.exists() else np.empty(0)
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    if len(lat):
        ax.hist(lat, bins=30)
    ax.set_xlabel("latency (ms): last EEG sample of the window -> prediction sample")
    ax.set_ylabel("windows")
    ax.set_title("Live decoding latency (all held-out headsets)", fontsize=10)
    fig.tight_layout()
    fig.savefig(d / "latency_hist.png", dpi=110)
    plt.close(fig)
    out["latency_hist"] = "latency_hist.png"
    return out


#: How to read each plot (report.md).
HOW_TO_READ = {
    "learning_curve": ("After every round the demo takes the global model the coordinator published off the broker "
                       "and scores it (torch, test batch 8) on every held-out subject's 45 trials from the EDF "
                       "files. Thin lines: one held-out subject; thick black: their mean; round 0 is the untrained "
                       "initial model (the baseline); dotted: chance (50 %). Brown dashed line (right axis): the "
                       "participating clients' mean training loss of that round. A rising black line above the "
                       "round-0 point is learning that transfers to people the model never saw."),
    "participation": ("Rounds each training headset took part in (the coordinator draws the round's clients with "
                      "its seed)."),
    "per_subject_bca": ("Bars: `neurofed evaluate` of model.onnx on every subject's trials from the EDF files. Blue "
                        "bars are training subjects scored on the trials they trained on (a training-set score, not "
                        "an accuracy estimate); red bars are the held-out subjects; black stars: the live BCA of the "
                        "held-out subjects from the decoder's predictions. Dotted: chance."),
    "bca_vs_eps": ("Mean held-out BCA of model.onnx when each trial is perturbed by a white-box attack of budget "
                   "epsilon (x each channel's std), crafted on the exported weights; epsilon 0 is the clean score."),
    "latency_hist": ("Per live prediction: arrival of the prediction sample minus arrival of the EEG sample that ends "
                     "its window, in the demo process (same clock, loopback)."),
}


def write_report(d: Path, res: dict) -> Path:
    """PNG plots and ``report.md`` in the run directory."""
    plots = _plots(Path(d), res)
    res["plots"] = plots
    s, c, cfg = res["summary"], res["checks"], res["config"]
    a = res["wire"]["audit"]
    lat = "n/a" if s["latency_ms_p50"] is None else f"{s['latency_ms_p50']:.1f} / {s['latency_ms_p99']:.1f} ms"
    lines = [f"# NeuroFed demo run `{Path(d).name}`", "", "## What was trained, on whom, how", "", explain(res), "",
             (f"Held-out subjects: {', '.join(s['heldout'])}, chosen as {s['heldout_rule']}. Broker "
             f"{res['broker']['url']} ({res['broker']['kind']}); seed {cfg['seed']}; training headsets at "
             f"{cfg['speed']:g}x, held-out headsets at {cfg['live_speed']:g}x real time."), "",
             "## Held-out subjects, decoded live", "",
             ("| subject | live BCA | live correct / decoded (cues) | 95 % CI of live accuracy (Wilson) | "
             "p vs chance | offline BCA | round-0 BCA (untrained) | final-round BCA |"), "|---|---|---|---|---|---|---|---|"]
    for r in s["per_heldout"]:
        lines.append(f"| {r['subject']} | {_pct(r['bca_live'])} | {r['correct']}/{r['n']} ({r['cues']}) | "
                     f"{_ci(r['accuracy_ci95_wilson'])} | "
                     f"{'n/a' if r['p_above_chance'] is None else format(r['p_above_chance'], '.2g')} | "
                     f"{_pct(r['bca_offline'])} | {_pct(r['bca_round0'])} | {_pct(r['bca_final_round'])} |")
    pooled = s["live_pooled"]
    lines += [(f"| **mean / pooled** | **{_pct(s['bca_live'])}** | {pooled['correct']}/{pooled['n']} | "
              f"{_ci(pooled['accuracy_ci95_wilson'])} | "
              f"{'n/a' if pooled['p_above_chance'] is None else format(pooled['p_above_chance'], '.2g')} | "
              f"{_pct(s['bca_offline'])} | {_pct(s['bca_round0'])} | {_pct(s['bca_heldout_final_round'])} |"), "",
              ("How to read it: chance is 50 % (two balanced classes). *Live BCA* is the balanced accuracy (mean of "
              "the per-class recalls) of `edge-client infer`'s predictions, each matched to the cue whose window it "
              "decoded, against that cue's label. The interval is the 95 % Wilson score interval "
              "(`scipy.stats.binomtest(...).proportion_ci(method='wilson')`) of the live *accuracy* (correct / "
              "decoded); accuracy equals BCA when classes are balanced and is within a point or two of it here "
              "(~22-23 cues per class per subject). The mean row gives the mean of the subjects' live BCAs and the "
              "interval and p-value of all held-out trials pooled (one-sided exact binomial test against 50 %). "
              "*Offline BCA*: `neurofed evaluate` of the same model.onnx on the same subject's trials from the EDF "
              "files (offline EA over all its trials); live decoding aligns with a running EA mean and has less BN "
              "context for its first windows, so the two differ a little. *Round-0 BCA*: the untrained initial "
              "model, the baseline. *Final-round BCA*: the last published global model in torch."), "",
              "## Other numbers", "", "| what | value | produced by |", "|---|---|---|",
              (f"| training subjects, offline BCA | {_pct(s['bca_training_set_offline'])} (training set: scored on the "
              "trials they trained on; not an accuracy estimate) | `neurofed evaluate --trained-on ...` |"),
              (f"| trials stored / cues sent, training headsets | {_stored(s)} | each recorder's store / the "
              "headsets' `N markers` line in `logs/headsets-train.log`; reasons in `results.json` `capture` |"),
              (f"| latency p50 / p99 | {lat} | arrival of the prediction sample - arrival of the window's last EEG "
              "sample (LSL) |"),
              f"| bytes down / up | {s['coordinator_down']} / {s['clients_up']} | coordinator `metrics.json` |",
              (f"| all bytes through the broker | {s['broker_all_messages']} in {s['broker_messages']} messages | "
              "wiretap on `#` |"),
              (f"| no EEG on the broker | {'PASS' if a['ok'] else 'FAIL'} | {a['decoded_as_protocol']}/{a['messages']} "
              f"messages decode as protocol; {len(a['bad_tensors'])} non-weight tensors; {len(a['eeg_hits'])} "
              f"payloads with EEG sample runs ({a['eeg_fingerprints']} fingerprints); detector self-test "
              f"{'passed' if a.get('detector_self_test') else 'FAILED'}; largest payload {a['largest_payload_bytes']} B "
              f"vs one raw trial {a['one_raw_trial_bytes']} B |"),
              f"| wall time | {s['seconds']:.0f} s | phases: {res['timings_s']} |", "",
              "Checks: " + ", ".join(f"{k}={v}" for k, v in c.items() if k not in ("all_ok", "failed")) + ".", ""]
    titles = {"learning_curve": "Learning curve", "participation": "Per-client participation",
              "per_subject_bca": "Per-subject BCA", "bca_vs_eps": "BCA vs attack epsilon", "latency_hist": "Latency"}
    for k, f in plots.items():
        lines += [f"## {titles[k]}", "", HOW_TO_READ[k], "", f"![{titles[k]}]({f})", ""]
    files = ("`config.json`, `federation.toml`, `lsl_api.cfg`, `logs/*.log` (every process), `clients/*/store` "
             "(captured trials, never uploaded), `clients/*/state`, `coordinator/` (checkpoints, metrics.json, "
             "global_model.safetensors), `model.onnx`, `export.json`, `eval/*.json`, `results.json`.")
    lines += ["## Files", "", files, ""]
    p = Path(d) / "report.md"
    p.write_text("\n".join(lines))
    return p
