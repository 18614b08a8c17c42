"""Summary, checks, PNG plots and ``report.md`` of a ``neurofed demo`` run (from its results dict)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(highlight=False, width=None if Console().is_terminal else 120)


def _pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


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
        "live_predictions": live.get("predictions", 0) > 0 and live.get("matched", 0) > 0,
        "no_eeg_on_broker": bool(audit.get("ok")) and audit.get("messages", 0) > 0,
    }
    failed = [k for k, v in c.items() if not v]
    return {**c, "all_ok": not failed, "failed": failed}


def traffic_bytes(res: dict) -> dict:
    rounds = res["federation"]["rounds"]
    tr = res["wire"]["traffic"]
    return {"coordinator_down": sum(r["bytes_down"] for r in rounds), "clients_up": sum(r["bytes_up"] for r in rounds),
            "broker_all_messages": tr["total_bytes"], "broker_messages": tr["total_messages"]}


def summarise(res: dict) -> None:
    """Fill ``res['checks']``/``res['summary']`` and print the final summary table."""
    res["checks"] = checks(res)
    live, off, audit = res["live"], res["offline"], res["wire"]["audit"]
    b = traffic_bytes(res)
    curve = res.get("curve", [])
    res["summary"] = {
        "heldout": off["heldout"], "bca_live": live["bca_live"], "bca_offline": off["bca_offline"],
        "bca_heldout_final_round": curve[-1]["bca"] if curve else None,
        "latency_ms_p50": live["latency_ms"]["p50"], "latency_ms_p99": live["latency_ms"]["p99"],
        "predictions": live["predictions"], "cues": live["cues"], **b,
        "no_eeg_on_broker": audit["ok"], "seconds": res["timings_s"]["total"],
    }
    s = res["summary"]
    t = Table(title=f"NeuroFed demo ({res['config']['algorithm']}, {len(res['config']['subjects'])} clients, "
                    f"{res['config']['rounds']} rounds)", show_lines=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row(f"held-out {s['heldout']} BCA, live (edge-client infer)", _pct(s["bca_live"]))
    t.add_row(f"held-out {s['heldout']} BCA, offline (neurofed evaluate)", _pct(s["bca_offline"]))
    t.add_row("live predictions / cues", f"{s['predictions']} / {s['cues']}")
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


# ----------------------------------------------------------------------------- plots
def _plots(d: Path, res: dict) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out: dict[str, str] = {}
    rounds = res["federation"]["rounds"]

    fig, ax = plt.subplots(figsize=(6, 3.5))
    curve = res.get("curve", [])
    if curve:
        ax.plot([p["round"] for p in curve], [100 * p["bca"] for p in curve], "o-", label="held-out BCA (global model)")
        ax.axhline(50, color="grey", lw=0.8, ls=":")
        ax.set_ylabel("held-out BCA (%)")
    ax2 = ax.twinx()
    ax2.plot([r["round"] for r in rounds], [r["loss"] for r in rounds], "s--", color="tab:orange", ms=3,
             label="mean client training loss")
    ax2.set_ylabel("training loss")
    ax.set_xlabel("round")
    fig.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(d / "learning_curve.png", dpi=110)
    plt.close(fig)
    out["learning_curve"] = "learning_curve.png"

    part = Counter(c for r in rounds for c in r["participants"])
    clients = sorted(res["capture"])
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(clients, [part.get(c, 0) for c in clients])
    ax.set_ylabel("rounds trained")
    ax.set_title("per-client participation")
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(d / "participation.png", dpi=110)
    plt.close(fig)
    out["participation"] = "participation.png"

    per = res["offline"]["per_subject"]
    held = res["offline"]["heldout"]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(list(per), [100 * v for v in per.values()], color=["tab:red" if s == held else "tab:blue" for s in per])
    ax.axhline(50, color="grey", lw=0.8, ls=":")
    ax.set_ylabel("BCA (%)")
    ax.set_title(f"per-subject BCA of model.onnx (red: held-out {held}; blue: trained on)")
    fig.tight_layout()
    fig.savefig(d / "per_subject_bca.png", dpi=110)
    plt.close(fig)
    out["per_subject_bca"] = "per_subject_bca.png"

    pts = res["offline"]["bca_vs_eps"]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([p["eps"] for p in pts], [100 * p["bca"] for p in pts], "o-")
    ax.axhline(50, color="grey", lw=0.8, ls=":")
    ax.set_xlabel(f"{res['offline']['attack'].upper()} epsilon (x per-channel std)")
    ax.set_ylabel(f"BCA on {held} (%)")
    fig.tight_layout()
    fig.savefig(d / "bca_vs_eps.png", dpi=110)
    plt.close(fig)
    out["bca_vs_eps"] = "bca_vs_eps.png"

    lat_file = d / "latency_ms.npy"
    lat = np.load(lat_file) if lat_file.exists() else np.empty(0)
    fig, ax = plt.subplots(figsize=(5, 3))
    if len(lat):
        ax.hist(lat, bins=30)
    ax.set_xlabel("latency (ms): last EEG sample of the window -> prediction sample")
    ax.set_ylabel("windows")
    fig.tight_layout()
    fig.savefig(d / "latency_hist.png", dpi=110)
    plt.close(fig)
    out["latency_hist"] = "latency_hist.png"
    return out


def write_report(d: Path, res: dict) -> Path:
    """PNG plots and ``report.md`` in the run directory."""
    plots = _plots(Path(d), res)
    res["plots"] = plots
    s, c, cfg = res["summary"], res["checks"], res["config"]
    a = res["wire"]["audit"]
    lat = "n/a" if s["latency_ms_p50"] is None else f"{s['latency_ms_p50']:.1f} / {s['latency_ms_p99']:.1f} ms"
    rows = [
        ("held-out BCA live", f"{_pct(s['bca_live'])} ({s['predictions']} predictions, {s['cues']} cues)",
         "`edge-client infer` predictions vs the headset's cue markers"),
        ("held-out BCA offline", _pct(s["bca_offline"]), "`neurofed evaluate --model model.onnx --subjects ...`"),
        ("held-out BCA, final global model (torch)", _pct(s["bca_heldout_final_round"]),
         "model taken off the wire, `trainer.evaluate.predict`"),
        ("latency p50 / p99", lat, "arrival of the prediction sample - arrival of the window's last EEG sample (LSL)"),
        ("bytes down / up", f"{s['coordinator_down']} / {s['clients_up']}", "coordinator `metrics.json`"),
        ("all bytes through the broker", f"{s['broker_all_messages']} in {s['broker_messages']} messages",
         "wiretap on `#`"),
        ("no EEG on the broker", "PASS" if a["ok"] else "FAIL",
         (f"{a['decoded_as_protocol']}/{a['messages']} messages decode as protocol; {len(a['bad_tensors'])} non-weight "
         f"tensors; {len(a['eeg_hits'])} payloads with EEG sample runs ({a['eeg_fingerprints']} fingerprints); "
         f"detector self-test {'passed' if a.get('detector_self_test') else 'FAILED'}; largest payload "
         f"{a['largest_payload_bytes']} B vs one raw trial {a['one_raw_trial_bytes']} B")),
        ("wall time", f"{s['seconds']:.0f} s", f"phases: {res['timings_s']}"),
    ]
    head = (f"{cfg['algorithm'].upper()}, {len(cfg['subjects'])} clients (subjects {cfg['subjects']}), held-out "
            f"S{cfg['heldout']:03d}, {cfg['rounds']} rounds, fraction {cfg['fraction']}, client batch "
            f"{cfg['batch_size']}, {cfg['local_epochs']} local epochs, {cfg['channels']} @ {cfg['resample']:g} Hz; "
            f"broker {res['broker']['url']} ({res['broker']['kind']}).")
    checks_line = ", ".join(f"{k}={v}" for k, v in c.items() if k not in ("all_ok", "failed"))
    lines = [f"# NeuroFed demo run `{Path(d).name}`", "", head, "", "| what | value | produced by |", "|---|---|---|",
             *[f"| {w} | {v} | {how} |" for w, v, how in rows], "", f"Checks: {checks_line}.", ""]
    titles = {"learning_curve": "Learning curve", "participation": "Per-client participation",
              "per_subject_bca": "Per-subject BCA", "bca_vs_eps": "BCA vs attack epsilon", "latency_hist": "Latency"}
    for k, f in plots.items():
        lines += [f"## {titles[k]}", "", f"![{titles[k]}]({f})", ""]
    files = ("`config.json`, `federation.toml`, `lsl_api.cfg`, `logs/*.log` (every process), `clients/*/store` "
             "(captured trials, never uploaded), `clients/*/state`, `coordinator/` (checkpoints, metrics.json, "
             "global_model.safetensors), `model.onnx`, `export.json`, `eval/*.json`, `results.json`.")
    lines += ["## Files", "", files, ""]
    p = Path(d) / "report.md"
    p.write_text("\n".join(lines))
    return p
