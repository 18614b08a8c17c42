"""The phases of ``neurofed demo`` (see docs/demo.md). Every child process is supervised; every wait is bounded."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from neurofed.broker.config import load_config
from neurofed.demo import DemoConfig, Run, console, recording_seconds
from neurofed.demo_eval import HeldOutCurve, check_wire, eeg_fingerprint, live, offline, print_progress
from neurofed.edge.store import LocalStore
from neurofed.run_report import summarise, write_report
from neurofed.supervise import DemoError, command
from neurofed.wiretap import Wiretap

# ----------------------------------------------------------------------------- phases
#: What the demo needs from the other packages: (piece named in the error, module, CLI, command).
PIECES = (
    ("broker/: embedded MQTT broker (neurofed broker)", "neurofed.broker.embedded", "neurofed", "broker"),
    ("broker/: coordinator (neurofed coordinator)", "neurofed.broker.coordinator", "neurofed", "coordinator"),
    ("firmware_sim/: simulated headsets", "neurofed.firmware_sim.player", None, None),
    ("edge/: on-device capture (edge-client record)", "neurofed.edge.capture", "edge-client", "record"),
    ("edge/: on-device trial store", "neurofed.edge.store", None, None),
    ("edge/: federation client (edge-client join)", "neurofed.edge.federation", "edge-client", "join"),
    ("edge/: live decoding (edge-client infer)", "neurofed.edge.infer", "edge-client", "infer"),
    ("export/: ONNX export (neurofed export)", "neurofed.export.onnx_export", "neurofed", "export"),
    ("export/: evaluation (neurofed evaluate)", "neurofed.export.evaluate", "neurofed", "evaluate"),
)


def preflight() -> None:
    """Fail at once, naming the piece, if a part the demo drives is missing or does not import."""
    import importlib

    apps = {}
    problems = []
    for piece, module, cli, cmd in PIECES:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure means the piece is unusable
            problems.append(f"{piece}: cannot import {module} ({type(exc).__name__}: {exc})")
            continue
        if cli is None:
            continue
        if cli not in apps:
            mod = importlib.import_module("neurofed.cli" if cli == "neurofed" else "neurofed.edge.cli")
            apps[cli] = {c.name or c.callback.__name__ for c in mod.app.registered_commands}
        if cmd not in apps[cli]:
            problems.append(f"{piece}: `{cli} {cmd}` is not a registered command")
    if problems:
        raise DemoError("missing or broken piece(s) of NeuroFed: " + "; ".join(problems))


def start_broker(run: Run) -> None:
    from neurofed.broker.embedded import free_port, port_open  # lazy: paho-mqtt (loaded only when used)

    if run.cfg.broker:
        from neurofed.broker.transport import BrokerURL  # lazy: paho-mqtt (loaded only when used)

        u = BrokerURL.parse(run.cfg.broker)
        if not port_open(u.host, u.port, 2.0):
            raise DemoError(f"no MQTT broker answers at {run.cfg.broker} (is Mosquitto running?)")
        run.results["broker"] = {"url": run.cfg.broker, "kind": "external"}
        console.print(f"[bold]broker[/]: using {run.cfg.broker}")
        return
    port = free_port()
    run.sup.start("broker", command("neurofed", "broker", "--host", "127.0.0.1", "--port", str(port)))
    end = time.monotonic() + run.budget(30)
    while not port_open("127.0.0.1", port):
        run.sup.check_alive(["broker"], "embedded broker")
        if time.monotonic() > end:
            raise DemoError(f"embedded broker did not open 127.0.0.1:{port} within 30 s (log {run.dir}/logs/broker.log)")
        time.sleep(0.1)
    run.url = f"mqtt://127.0.0.1:{port}"
    run.results["broker"] = {"url": run.url, "kind": "embedded amqtt"}
    console.print(f"[bold]broker[/]: embedded amqtt on {run.url}")


def capture(run: Run) -> dict:
    cfg, t = run.cfg, time.monotonic()
    dur = recording_seconds(run, cfg.subjects)
    wall = dur / cfg.speed
    console.print(f"[bold]capture[/]: {len(cfg.subjects)} headsets replay {dur:.0f} s of EEG each at {cfg.speed:g}x "
                  f"(~{wall:.0f} s); edge clients record cued trials into their stores")
    # headsets first: their outlets take the low LSL service ports before any recorder's resolver does
    # (resolvers started first push outlets past the probed port range: edge/lsl_config.py); each headset
    # still waits for its recorder before it streams, so no cue is lost
    run.sup.start("headsets-train", command("headset-sim", "--subjects", ",".join(map(str, cfg.subjects)),
                                            "--data-dir", str(run.data_dir), "--runs", cfg.runs,
                                            "--speed", str(cfg.speed), "--name", run.stream,
                                            "--wait-consumers", "240", "--lead-in", "1.0"))
    log, end = run.dir / "logs" / "headsets-train.log", time.monotonic() + run.budget(180)
    while (not log.is_file() or log.read_text().count("source_id") < len(cfg.subjects)) and time.monotonic() < end:
        run.sup.check_alive(["headsets-train"], "simulated headsets (capture)")
        time.sleep(0.5)
    time.sleep(2.0)  # the outlets are opened right after the headsets announce themselves
    names = []
    for s in cfg.subjects:
        name = f"record-{run.clients[s]}"
        run.sup.start(name, command("edge-client", "record", "--stream", f"{run.stream}-S{s:03d}",
                                    "--store", str(run.store(s)), "--subject", f"S{s:03d}", "--sfreq", "160",
                                    "--resolve-timeout", "180", "--idle-timeout", "5",
                                    "--duration", str(int(wall + 300))))
        names.append(name)
    run.sup.wait(["headsets-train"], run.budget(wall + 240 + 60), "simulated headsets (capture)")
    run.sup.wait(names, run.budget(60), "edge-client record")
    counts = {}

    sent = cues_sent(run.dir / "logs" / "headsets-train.log")
    for s in cfg.subjects:
        st = LocalStore(run.store(s))
        labels = st.labels
        log = run.dir / "logs" / f"record-{run.clients[s]}.log"
        counts[run.clients[s]] = {"trials": len(st), **{c: labels.count(c) for c in ("left_fist", "right_fist")},
                                  "cues_sent": sent.get(f"{run.stream}-S{s:03d}"), "not_stored": skip_reasons(log)}
        if len(st) < 8 or len(set(labels)) < 2:
            raise DemoError(f"{run.clients[s]} captured only {len(st)} trials ({sorted(set(labels))}); see {log}")
    run.phase("capture", t)
    console.print("  captured: " + ", ".join(f"{c} {v['trials']}" for c, v in counts.items()))
    short = {c: v for c, v in counts.items() if v["cues_sent"] is not None and v["trials"] < v["cues_sent"]}
    if short:  # the capture must keep every cue; say which headsets lost trials, and why, rather than train quietly
        console.print("[yellow]  trials lost in capture (stored / cues sent): " + "; ".join(
            f"{c} {v['trials']}/{v['cues_sent']} ({', '.join(v['not_stored']) or 'no reason logged'})"
            for c, v in short.items()) + f"; see {run.dir}/logs/record-*.log[/]")
    return counts


def cues_sent(headset_log: Path) -> dict[str, int]:
    """Stream name -> cue markers a simulated headset sent (its closing line in the headset-sim log)."""
    from neurofed.firmware_sim.player import markers_sent  # lazy: pylsl

    return markers_sent(headset_log.read_text(errors="replace")) if headset_log.is_file() else {}


def skip_reasons(record_log: Path) -> list[str]:
    """Why a recorder did not store a cue (the capture's logged reasons: skipped or dropped windows)."""
    if not record_log.is_file():
        return []
    return [ln.split(": ", 1)[-1].strip() for ln in record_log.read_text(errors="replace").splitlines()
            if "WARNING" in ln and ("skipped" in ln or "dropped" in ln)]


def federation_toml(run: Run) -> Path:
    cfg = run.cfg
    p = run.dir / "federation.toml"
    p.write_text(f"""[federation]
name = "{run.federation}"
rounds = {cfg.rounds}
fraction = {cfg.fraction}
seed = {cfg.seed}
min_clients = {len(cfg.subjects)}
join_timeout_s = 300
round_deadline_s = {cfg.round_deadline_s}
strategy = "{cfg.algorithm}"

[model]
name = "eegnet"
classes = ["left_fist", "right_fist"]
test_batch_size = 8

[preprocess]
channels = "{cfg.channels}"
resample = {cfg.resample}

[local]
batch_size = {cfg.batch_size}
local_epochs = {cfg.local_epochs}
lr = {cfg.lr}

[output]
dir = "{run.dir / 'coordinator'}"
""")
    return p


def federate(run: Run, tap, curve) -> dict:
    """Coordinator + one ``edge-client join`` per captured store; progress printed per round."""

    cfg, t = run.cfg, time.monotonic()
    toml = federation_toml(run)
    console.print(f"[bold]federate[/]: {cfg.algorithm.upper()} over MQTT, {cfg.rounds} rounds, "
                  f"{len(cfg.subjects)} clients, fraction {cfg.fraction}, batch {cfg.batch_size}")
    run.sup.start("coordinator", command("neurofed", "coordinator", "--broker", run.url, "--config", str(toml),
                                         "--out", str(run.dir / "coordinator")))
    joins = []
    for s in cfg.subjects:
        cid = run.clients[s]
        run.sup.start(f"join-{cid}", command("edge-client", "join", "--broker", run.url, "--client-id", cid,
                                             "--federation", run.federation, "--store", str(run.store(s)),
                                             "--state-dir", str(run.dir / "clients" / cid / "state"),
                                             "--join-timeout", "300"))
        joins.append(f"join-{cid}")
    end = time.monotonic() + run.budget(300 + cfg.rounds * (cfg.round_deadline_s + 5))
    while run.sup.children["coordinator"].rc is None:
        if time.monotonic() > end:
            raise DemoError("federated training did not finish in time (log logs/coordinator.log)")
        run.sup.check_alive(joins, "edge-client join")
        print_progress(tap, curve, cfg.rounds)
        time.sleep(0.2)
    run.sup.wait(["coordinator"], 5, "coordinator")
    run.sup.wait(joins, run.budget(60), "edge-client join")
    time.sleep(0.5)  # the last result/model messages
    print_progress(tap, curve, cfg.rounds)
    metrics = json.loads((run.dir / "coordinator" / "metrics.json").read_text())
    run.phase("federate", t)
    return metrics


def export(run: Run) -> dict:
    t = time.monotonic()
    ckpt = run.dir / "coordinator" / "global_model.safetensors"
    if not ckpt.is_file():
        raise DemoError(f"the coordinator wrote no final model ({ckpt}); see logs/coordinator.log")
    console.print("[bold]export[/]: neurofed export -> model.onnx (verified against torch on the held-out subjects)")
    run.sup.start("export", command("neurofed", "export", str(ckpt), "-o", str(run.dir / "model.onnx"),
                                    "--data-dir", str(run.data_dir), "--verify-subjects",
                                    ",".join(map(str, run.cfg.heldout)),
                                    "--json", str(run.dir / "export.json")))
    run.sup.wait(["export"], run.budget(300), "neurofed export")
    run.phase("export", t)
    return json.loads((run.dir / "export.json").read_text())


def run_demo(cfg: DemoConfig) -> dict:
    """Run every phase; children are stopped on any exit path (Ctrl-C and SIGTERM included)."""

    run = Run(cfg)
    preflight()
    (run.dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    tap = None
    try:
        start_broker(run)
        tap = Wiretap(run.url, run.federation).start()
        run.results["capture"] = capture(run)
        curve = HeldOutCurve(run, tap)
        run.results["federation"] = federate(run, tap, curve)
        run.results["curve"] = [curve.points[k] for k in sorted(curve.points)]
        run.results["heldout_subjects"] = {"subjects": [f"S{h:03d}" for h in cfg.heldout], "rule": cfg.heldout_rule}

        spec = load_config(run.dir / "federation.toml").model_spec()
        with ThreadPoolExecutor(1) as pool:  # the audit's fingerprints are built while the export runs
            fingerprint = pool.submit(eeg_fingerprint, run, spec)
            run.results["export"] = export(run)
            fingerprint = fingerprint.result()  # before the live phase, whose latencies it must not disturb
        run.results["live"] = live(run)
        run.results["offline"] = offline(run)
        tap.stop()
        run.results["wire"] = {"traffic": tap.traffic(), "audit": check_wire(run, tap, spec, fingerprint)}
        run.results["timings_s"] = {**run.timings, "total": round(time.monotonic() - run.t0, 1)}
        summarise(run.results)
        write_report(run.dir, run.results)
        (run.dir / "results.json").write_text(json.dumps(run.results, indent=1, default=str))
        return run.results
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]: stopping every child process")
        raise DemoError(f"interrupted; partial run in {run.dir}") from None
    finally:
        if tap is not None:
            tap.stop()
        run.sup.stop_all()
        signal.signal(signal.SIGTERM, old)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
