"""A long-lived federation of simulated headsets, end to end (issue 55): ``neurofed bench long-lived`` and the e2e test.

Everything from LSL on, on one machine: each headset host is a simulated headset worn in **sessions** (headset-sim's
player replaying one EEGMMIDB run per session, cue markers on LSL) whose cued trials the edge's capture records into
the host's own store, with gaps between sessions; its edge client (``edge-client join --store --window`` semantics:
the store is read again before each training) joins once a session is stored, or once the federation reached a
given version (a host that comes online late), and may leave for good once it trained on a given session. The
asynchronous coordinator runs a release gate and exports, signs and publishes every release retained; decoders
(``edge-client infer --follow --mode cue --predictions-out`` processes) on looping headset-sim streams of held-out
subjects swap to each release between two cue-locked windows. Optionally a client with broker credentials publishes
a forged release, and the publisher rolls back to an earlier release once the coordinator is done.
:func:`run_fleet` returns what happened (the stores' sessions, every submission, the release history, each decoder's
stats, windows and the cues its headset sent, and :func:`neurofed.release_report.release_report`: live BCA per
release beside its validation BCA); :func:`bench_long_lived` writes a summary of it to JSON.

Edge clients run as threads of this process and train one at a time (a lock around tasks and evaluations, as
separate devices would not share torch's global generator); decoders are separate processes.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from neurofed_runtime import release as rel

from neurofed.background import Background
from neurofed.broker.config import config_from_dict
from neurofed.broker.coordinator import Coordinator
from neurofed.broker.protocol import Topics
from neurofed.broker.release_gate import read_history
from neurofed.broker.releases import rollback
from neurofed.broker.transport import MqttTransport
from neurofed.edge.capture import CaptureConfig, LiveCapture
from neurofed.edge.federation import EdgeClient
from neurofed.edge.store import LocalStore, store_loader, store_montage
from neurofed.export.standalone import export_standalone
from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
from neurofed.firmware_sim.recording import concatenate, load_recording
from neurofed.release_report import read_predictions, release_report, summary_lines
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS, subject_files
from neurofed.trainer.data.preprocess import n_times_for
from neurofed.trainer.errors import NeuroFedError

__all__ = ["FleetPlan", "HeadsetHost", "bench_long_lived", "run_fleet"]

CLASSES = ("left_fist", "right_fist")


@dataclass(frozen=True)
class FleetPlan:
    """One fleet run.

    Parameters
    ----------
    train, validate : dict
        Subject -> the EEGMMIDB runs its headset replays, one per session (training hosts; validating hosts,
        ``--evaluate``).
    heldout : tuple of int
        Subjects whose headsets (runs 4, 8, 12 looped) the decoders decode.
    join_at_version : dict
        Subject -> the model version the federation must reach before the host comes online (default: as soon as
        its first session is stored).
    leave_after_sessions : dict
        Subject -> the host leaves for good once it trained on the trials of this many sessions.
    rounds, buffer_k, max_staleness, strategy, window, local :
        The asynchronous federation (versions, K, staleness bound, strategy, newest trials trained on, local
        training).
    every, release_min_clients, margin, wait_s :
        The release gate (``[release]``).
    speed, live_speed, gap_s :
        Replay speed of the hosts' sessions and of the held-out headsets; seconds between two sessions.
    forge : bool
        Publish a forged release (another key) once the decoders run release 1.
    rollback_to : int or None
        Once the coordinator is done and the decoders ran its last release: roll back to this release.
    windows_per_last : int
        Cue windows each decoder must decode with the last release (and the rollback) before the run stops.
    timeout_s : float
        The run's wall-clock bound.
    """

    train: dict[int, tuple[int, ...]]
    validate: dict[int, tuple[int, ...]]
    heldout: tuple[int, ...]
    join_at_version: dict[int, int] = field(default_factory=dict)
    leave_after_sessions: dict[int, int] = field(default_factory=dict)
    rounds: int = 8
    buffer_k: int = 2
    max_staleness: int = 2
    strategy: str = "fedavg"
    window: int = 30
    local: dict[str, Any] = field(default_factory=lambda: {"batch_size": 16, "local_epochs": 1})
    every: int = 3
    release_min_clients: int = 1
    margin: float = 1.0
    wait_s: float = 20.0
    speed: float = 20.0
    live_speed: float = 10.0
    gap_s: float = 2.0
    forge: bool = True
    rollback_to: int | None = 1
    windows_per_last: int = 2
    timeout_s: float = 200.0


def _recording(data_dir: Path | None, subject: int, run: int):
    return load_recording(subject_files(data_dir, subject, [run])[0], RUN_EVENT_LABELS[run])


class HeadsetHost(threading.Thread):
    """A simulated headset worn in sessions: each replays one run on LSL (headset-sim's player) while the edge's
    capture (:class:`neurofed.edge.capture.LiveCapture`) records its cued trials into the host's store; ``gap_s``
    between two sessions (the headset is off)."""

    def __init__(self, subject: int, runs: tuple[int, ...], store: Path, data_dir: Path | None, speed: float,
                 gap_s: float) -> None:
        super().__init__(daemon=True, name=f"headset-S{subject:03d}")
        self.subject, self.runs, self.data_dir, self.speed, self.gap_s = subject, runs, data_dir, speed, gap_s
        self.store = LocalStore(store, subject=f"S{subject:03d}", classes=CLASSES)
        self.sessions: list[dict[str, Any]] = []  # per session: run, cues sent, trials stored
        self.error: BaseException | None = None
        self.stop_evt = threading.Event()

    def run(self) -> None:
        try:
            for k, run in enumerate(self.runs):
                if k and self.stop_evt.wait(self.gap_s):
                    return
                if self.stop_evt.is_set():
                    return
                self._session(run)
        except BaseException as exc:  # noqa: BLE001 - reported by run_fleet
            self.error = exc

    def _session(self, run: int) -> None:
        name = f"nf-hs{self.subject}r{run}-{uuid.uuid4().hex[:8]}"
        player = HeadsetPlayer(_recording(self.data_dir, self.subject, run),
                               PlayerConfig(name=name, speed=self.speed, wait_consumers=30.0, linger=1.0, markers=True))
        player.start()
        before = len(self.store)
        cfg = CaptureConfig(classes=CLASSES)
        sfreq = player.rec.sfreq
        window = round(cfg.preprocess.tmin * sfreq) + n_times_for(sfreq, cfg.preprocess)

        expected = 0  # cues whose whole window was pushed when the session ended (one cut short ends mid-window)
        cap = LiveCapture(name=name, cfg=cfg, resolve_timeout=30.0)
        try:
            deadline = None
            while True:
                now = time.monotonic()
                for trial in cap.step(now):
                    self.store.append(trial)
                if deadline is None and (player.done.is_set() or self.stop_evt.is_set()):
                    # the session ends here: the windows already pushed are still drained (their last samples may be
                    # in flight on a loaded machine: a fixed second lost one under CI load), for up to 10 s
                    n = player.n_pushed
                    expected = sum(1 for _, _, i in player.markers_sent if i + window <= n)
                    deadline = now + 10.0
                if deadline is not None and (len(self.store) - before >= expected or now > deadline):
                    break
                time.sleep(0.005)
        finally:
            cap.close()
            player.stop()
            player.join(10)
        self.sessions.append({"run": run, "cues_sent": len(player.markers_sent), "cues": expected,
                              "stored": len(self.store) - before, "interrupted": self.stop_evt.is_set()})


def _serialise(edges: list[EdgeClient], lock: threading.Lock) -> None:
    """One edge client at a time trains or evaluates (threads of one process share torch's global generator)."""
    for e in edges:
        def run_task(*a: Any, _run: Callable = e._run_task) -> Any:
            with lock:
                return _run(*a)

        def on_eval(*a: Any, _ev: Callable = e._on_eval) -> Any:
            with lock:
                return _ev(*a)
        e._run_task, e._on_eval = run_task, on_eval  # type: ignore[method-assign]


def _config(plan: FleetPlan, fed: str, key: Path):
    return config_from_dict({
        "federation": {"name": fed, "mode": "async", "rounds": plan.rounds, "min_clients": 2, "seed": 7,
                       "strategy": plan.strategy, "join_timeout_s": 120},
        "preprocess": {"channels": "sensorimotor21", "resample": 80.0},
        "local": dict(plan.local),
        "async": {"buffer_k": plan.buffer_k, "max_staleness": plan.max_staleness},
        "release": {"every": plan.every, "min_clients": plan.release_min_clients, "margin": plan.margin,
                    "wait_s": plan.wait_s, "key": str(key)},
    }, "fleet plan")


def run_fleet(plan: FleetPlan, broker: str, work: Path, data_dir: Path | None,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``plan`` against the broker at ``broker`` with files under ``work``; what happened (module docstring)."""
    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    fed = f"fleet-{uuid.uuid4().hex[:8]}"
    priv, pub = rel.keygen(work / "keys")
    forger_priv, _ = rel.keygen(work / "keys", name="forger")
    out = work / "out"
    store = out / "releases"
    lock = threading.Lock()  # training, evaluation and ONNX export: one at a time

    def exporter(ckpt: Path, onnx: Path) -> None:
        with lock:
            export_standalone(ckpt, onnx)

    coord = Coordinator(_config(plan, fed, priv), broker, out, exporter=exporter)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    players: dict[int, HeadsetPlayer] = {}
    decoders: dict[int, subprocess.Popen] = {}
    stats, preds = {s: work / f"stats{s}.json" for s in plan.heldout}, {s: work / f"pred{s}.jsonl" for s in plan.heldout}
    logs = []
    for s in plan.heldout:  # decoders: follow releases, decode cue-locked windows, write each with its release
        name = f"nf-dec{s}-{uuid.uuid4().hex[:8]}"
        live = concatenate([_recording(data_dir, s, r) for r in (4, 8, 12)])
        players[s] = HeadsetPlayer(live, PlayerConfig(name=name, speed=plan.live_speed, loop=True,
                                                      wait_consumers=plan.timeout_s, markers=True))
        logs.append(open(work / f"dec{s}.log", "wb"))
        decoders[s] = subprocess.Popen(
            [sys.executable, "-c", "from neurofed.edge.cli import main; main()", "infer", "--stream", name,
             "--follow", "--pub", str(pub), "--broker", broker, "--federation", fed, "--release-dir",
             str(work / f"in{s}"), "--release-timeout", str(plan.timeout_s), "--quiet", "--mode", "cue",
             "--threads", "1", "--predictions-out", str(preds[s]), "--stats-out", str(stats[s]), "--timeout", "60"],
            stdout=logs[-1], stderr=subprocess.STDOUT, env=env)
        players[s].start()
    hosts = {s: HeadsetHost(s, runs, work / f"S{s:03d}", data_dir, plan.speed, plan.gap_s)
             for s, runs in {**plan.train, **plan.validate}.items()}
    edges = {s: EdgeClient(broker, fed, f"S{s:03d}", store_loader(h.store.path), work / "state",
                           join_timeout=60, montage=store_montage(h.store.path), window=plan.window,
                           reload_data=True, evaluate=s in plan.validate) for s, h in hosts.items()}
    _serialise(list(edges.values()), lock)
    stops = {s: threading.Event() for s in hosts}
    runs: dict[int, Background] = {}
    joined_at: dict[int, int] = {}  # the version the federation had made when the host came online
    left_at: dict[int, int] = {}
    ct = Background(coord.run)
    for h in hosts.values():
        h.start()
    forged, rolled, last = False, False, None
    try:
        end = time.monotonic() + plan.timeout_s
        while time.monotonic() < end:
            time.sleep(0.2)
            for s, h in hosts.items():
                if h.error is not None:
                    raise NeuroFedError(f"headset S{s:03d}: {h.error}")
                if s not in runs and h.sessions and coord.server.round >= plan.join_at_version.get(s, 0):
                    joined_at[s] = coord.server.round
                    runs[s] = Background(lambda s=s: edges[s].run(stop=stops[s], max_seconds=plan.timeout_s))
                    say(f"S{s:03d} online at version {coord.server.round} ({len(h.store)} trials stored)")
                n = plan.leave_after_sessions.get(s)
                if n and s in runs and s not in left_at and len(h.sessions) >= n and edges[s].data is not None \
                        and len(edges[s].data.y) >= sum(x["stored"] for x in h.sessions[:n]):
                    stops[s].set()  # it trained on its n-th session: it leaves for good
                    h.stop_evt.set()
                    runs[s].result(30)
                    left_at[s] = coord.server.round
                    say(f"S{s:03d} left for good at version {coord.server.round}")
            got = {s: read_predictions(p) if p.is_file() else [] for s, p in preds.items()}
            if plan.forge and not forged and coord.releases and all(got.values()):
                # a client with broker access publishes a forged release: valid format, another key, version 99
                data = (store / "v0001.onnx").read_bytes()
                with MqttTransport(broker, f"{fed}-forger").connect(timeout=5) as f:
                    f.publish(Topics(fed).release, rel.pack(data, rel.sign(data, rel.load_private(forger_priv), 99, 1)),
                              retain=True, wait=5)
                forged = True
                say("forged release published")
            if ct.is_alive():
                continue
            if ct.error is not None:
                raise ct.error
            last = last or max((h["release"] for h in read_history(store) if h.get("released")), default=None)
            if last is None:
                break
            enough = min(sum(r.get("model_version") == last for r in g) for g in got.values())
            if plan.rollback_to is not None and not rolled and enough >= plan.windows_per_last:
                h = rollback(plan.rollback_to, priv, broker, fed, store)  # neurofed release rollback --version N
                last, rolled = h["version"], True
                say(f"rolled back to release {plan.rollback_to}: published as release {last}")
            elif enough >= plan.windows_per_last:
                break
        ct.result(5)
    finally:
        for d in decoders.values():
            if d.poll() is None:
                d.send_signal(signal.SIGTERM)  # the decoder ends its loop and writes its stats
        for d in decoders.values():
            try:
                d.wait(20)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait(10)
        for s, ev in stops.items():
            ev.set()
            if s in runs:
                runs[s].join(30)
        for h in hosts.values():
            h.stop_evt.set()
            h.join(30)
        for p in players.values():
            p.stop()
            p.join(10)
        for f in logs:
            f.close()
        with MqttTransport(broker, f"{fed}-cleanup").connect(timeout=5) as t:  # no retained release left behind
            t.publish(Topics(fed).release, b"", retain=True, wait=5)
    for s, d in decoders.items():
        if d.returncode != 0 or not stats[s].is_file():
            raise NeuroFedError(f"decoder of S{s:03d} exited {d.returncode}: "
                                f"{(work / f'dec{s}.log').read_text(errors='replace')[-1500:]}")
    submissions = [[m["version"], *row] for m in json.loads((out / "metrics.json").read_text())["rounds"]
                   for row in m["submissions"]]
    return {
        "federation": fed, "seconds": time.monotonic() - t0, "forged": forged, "rolled_back": rolled,
        "history": read_history(store), "submissions": submissions, "joined_at": joined_at, "left_at": left_at,
        "trained": {s: edges[s].rounds_trained for s in edges},
        "sessions": {s: h.sessions for s, h in hosts.items()},
        "decoders": {s: {"stats": json.loads(stats[s].read_text()), "windows": read_predictions(preds[s]),
                         "cues_sent": [(ts, lab) for ts, lab, _ in players[s].markers_sent]} for s in plan.heldout},
        "report": release_report({f"S{s:03d}": preds[s] for s in plan.heldout}, store),
    }


#: the plan of ``neurofed bench long-lived`` (docs/bench/long_lived.json)
BENCH_PLAN = FleetPlan(
    train={1: (4, 8, 12), 2: (4, 8), 5: (4, 8, 12), 6: (4, 8, 12), 7: (4, 8, 12), 8: (4, 8, 12)},
    validate={3: (4, 8, 12), 9: (4, 8, 12)}, heldout=(47, 48),
    join_at_version={6: 6, 8: 12}, leave_after_sessions={2: 2},
    rounds=60, buffer_k=6, max_staleness=1, strategy="fedavg", window=45, local={},
    every=10, release_min_clients=2, margin=0.02, wait_s=60.0, speed=20.0, live_speed=10.0, gap_s=5.0,
    forge=True, rollback_to=None, windows_per_last=30, timeout_s=1500.0)


def submission_summary(rows: list[list[Any]]) -> dict[str, Any]:
    """Counts of the coordinator's logged submissions (rows ``[version, client, base, verdict, staleness, weight,
    trials]``): by verdict, accepted ones by staleness and by client (the per-update log stays in the run folder)."""
    from collections import Counter

    acc = [r for r in rows if r[3] == "accepted"]
    return {"n": len(rows), "by_verdict": dict(sorted(Counter(str(r[3]) for r in rows).items())),
            "accepted_by_staleness": {str(k): v for k, v in sorted(Counter(int(r[4]) for r in acc).items())},
            "accepted_by_client": dict(sorted(Counter(str(r[1]) for r in acc).items())),
            "mean_staleness_accepted": round(sum(int(r[4]) for r in acc) / len(acc), 3) if acc else None}


def bench_long_lived(out: Path, data_dir: Path | None, broker: str = "mqtt://127.0.0.1:1883",
                     plan: FleetPlan = BENCH_PLAN, work: Path | None = None) -> dict[str, Any]:
    """Run :data:`BENCH_PLAN` (or ``plan``) and write a summary to ``out``: the plan, the sessions, the clients'
    joins, leaves and submissions, the release history and the release report (live BCA per release per
    decoder beside its validation BCA), each decoder's swaps and refusals, and whether every cue was decoded once."""
    import tempfile

    work = work or Path(tempfile.mkdtemp(prefix="neurofed-longlived-"))
    t_cpu = time.process_time()
    torch.set_num_threads(1)
    r = run_fleet(plan, broker, work, data_dir, progress=lambda m: print(m, flush=True))
    dec = {}
    for s, d in r["decoders"].items():
        rows, sent = d["windows"], d["cues_sent"]
        once = len(rows) <= len(sent) and all(abs(w["onset"] - c[0]) < 2e-3 and w["cue"] == c[1]
                                              for w, c in zip(rows, sent))
        st = d["stats"]
        dec[f"S{s:03d}"] = {"windows": len(rows), "cues_sent": len(sent), "every_cue_once": once,
                            "skipped": st["skipped"], "accepted": st["accepted"], "refused": st["refused"],
                            "swaps": st["swaps"], "windows_by_version": st["windows_by_version"],
                            "latency_ms_p50": st["latency_ms_p50"]}
    res = {
        "what": "a long-lived asynchronous federation of simulated headsets (sessions with gaps recorded into "
                "stores, late joiners, a client leaving for good, validating clients), releases through the gate "
                "to two cue-locked --follow decoders on held-out subjects; live BCA per release beside its "
                "federated validation BCA",
        "command": (f"neurofed bench long-lived --strategy {plan.strategy} --rounds {plan.rounds} --buffer-k "
                    f"{plan.buffer_k} --max-staleness {plan.max_staleness} --every {plan.every} --out {out}"),
        "plan": {k: ({str(a): b for a, b in v.items()} if isinstance(v, dict) else v) for k, v in asdict(plan).items()},
        "seconds": round(r["seconds"], 1), "cpu_seconds_this_process": round(time.process_time() - t_cpu, 1),
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0], "python": platform.python_version()},
        "sessions": {f"S{s:03d}": v for s, v in r["sessions"].items()},
        "joined_at_version": {f"S{s:03d}": v for s, v in r["joined_at"].items()},
        "left_at_version": {f"S{s:03d}": v for s, v in r["left_at"].items()},
        "trained": {f"S{s:03d}": v for s, v in r["trained"].items()},
        "submissions": submission_summary(r["submissions"]),
        "forged_release_published": r["forged"],
        "history": [{k: h.get(k) for k in ("version", "released", "release", "parent", "reason", "n_clients",
                                             "n_trials", "bca_mean", "paired_diff_mean", "paired_diff_se")}
                    for h in r["history"]],
        "decoders": dec, "report": r["report"], "summary": summary_lines(r["report"]),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    return res
