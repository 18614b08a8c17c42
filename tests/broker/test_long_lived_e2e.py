"""A shortened end-to-end check of a long-lived federation of simulated headsets (issue 55, item 5), about a minute.

Over a real Mosquitto, everything from LSL on:

* **Headset hosts.** Each training or validating host is a simulated headset (headset-sim's player replaying one
  EEGMMIDB run per session at 20x, cue markers on LSL) recorded by the edge's capture into the host's own store, in
  sessions with gaps; its edge client (``edge-client join --store --window 30`` semantics: the store is read again
  before each training) joins once the first session is stored. S001 records three sessions; S002 two, then
  leaves for good (its client stops); S006 joins late (its host comes online once the federation made version 2);
  S003 records one session and validates (``--evaluate``).
* **Coordinator.** Asynchronous (K = 2, 8 versions), ``min_clients = 2`` training clients, a release gate every 3
  versions and at the last, releases exported, signed and published retained.
* **Decoders.** Two ``edge-client infer --follow --mode cue --predictions-out`` processes (no starting model) on
  headset-sim streams of held-out S004 and S005 (runs 4, 8, 12 looped at 10x, cue markers).

Asserted: the three releases reach both decoders (verified; each swap between two cue-locked windows, in order),
no cue window is lost or decoded twice (the cue-locked windows are exactly the first cues the held-out headset
sent, each once), a forged release (another key, valid format) published by a client with broker credentials is
refused by both, a signed rollback to release 1 (``neurofed release rollback``, published as release 4) is swapped
in by both, and the report (:func:`neurofed.release_report.release_report`) gives each decoder's live BCA per
release beside the release's federated validation BCA (printed; accuracy levels are not asserted). The stores grew
between trainings (a client trained on more trials later), the late client contributed, and the
client that left sent nothing after it left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from neurofed_runtime import release as rel

from neurofed.broker.config import load_config
from neurofed.broker.coordinator import Coordinator
from neurofed.broker.protocol import Topics
from neurofed.broker.release_gate import read_history
from neurofed.broker.releases import rollback
from neurofed.broker.transport import MqttTransport
from neurofed.edge.capture import CaptureConfig, LiveCapture
from neurofed.edge.federation import EdgeClient
from neurofed.edge.join_cli import make_loader, make_montage
from neurofed.edge.store import LocalStore
from neurofed.export.standalone import export_standalone
from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
from neurofed.firmware_sim.recording import concatenate, load_recording
from neurofed.release_report import read_predictions, release_report, summary_lines
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS, subject_files
from tests.broker.conftest import DATA_DIR, Mosquitto, write_toml
from tests.lsl_support import configure_lsl, unique_name

configure_lsl()

pytestmark = pytest.mark.e2e
SPEED, LIVE_SPEED = 20.0, 10.0
CLASSES = ("left_fist", "right_fist")


def _run(subject: int, run: int):
    return load_recording(subject_files(DATA_DIR, subject, [run])[0], RUN_EVENT_LABELS[run])


class HeadsetHost(threading.Thread):
    """A simulated headset worn in sessions: each session replays one run on LSL (headset-sim's player) and the
    edge's capture records its cued trials into the host's store; ``gap_s`` between sessions; a session starts
    only once ``ready()`` says so."""

    def __init__(self, subject: int, runs: list[int], store: Path, gap_s: float = 2.0, ready=lambda: True) -> None:
        super().__init__(daemon=True, name=f"headset-S{subject:03d}")
        self.subject, self.runs, self.gap_s, self.ready = subject, runs, gap_s, ready
        self.store = LocalStore(store, subject=f"S{subject:03d}", classes=CLASSES)
        self.sessions: list[dict] = []  # per session: run, cues sent, trials stored, when it ended
        self.error: BaseException | None = None
        self.stop_evt = threading.Event()

    def run(self) -> None:
        try:
            for k, run in enumerate(self.runs):
                while not self.ready() and not self.stop_evt.wait(0.1):
                    pass
                if self.stop_evt.is_set():
                    return
                if k:
                    self.stop_evt.wait(self.gap_s)  # the headset is off between sessions
                self._session(run)
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            self.error = exc

    def _session(self, run: int) -> None:
        name = unique_name(f"hs{self.subject}r{run}")
        player = HeadsetPlayer(_run(self.subject, run), PlayerConfig(name=name, speed=SPEED, wait_consumers=30.0,
                                                                     linger=1.0, markers=True))
        player.start()
        before = len(self.store)
        cap = LiveCapture(name=name, cfg=CaptureConfig(classes=CLASSES), resolve_timeout=30.0)
        try:
            done_at = None
            while not self.stop_evt.is_set():
                now = time.monotonic()
                for trial in cap.step(now):
                    self.store.append(trial)
                if player.done.is_set():
                    done_at = done_at or now
                    if now - done_at > 1.0:  # every cue's window is in: the session is over
                        break
                time.sleep(0.005)
        finally:
            cap.close()
            player.stop()
            player.join(10)
        self.sessions.append({"run": run, "cues": len(player.markers_sent), "stored": len(self.store) - before,
                              "ended": time.monotonic()})


@pytest.mark.timeout(240)
def test_a_fleet_of_headsets_releases_to_following_decoders(tmp_path, fed_name):
    from tests.broker.test_hostile import Bg
    from tests.broker.test_profiles_mqtt import serialise_training

    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed")
    lock = threading.Lock()  # ONNX export, training, evaluation share this torch: one at a time (as separate processes)
    t0 = time.monotonic()
    broker = Mosquitto(tmp_path).start()
    priv, pub = rel.keygen(tmp_path / "keys")
    forger_priv, _ = rel.keygen(tmp_path / "keys", name="forger")
    cfg = write_toml(tmp_path / "federation.toml", fed_name, rounds=8, min_clients=2, strategy="fedavg",
                     federation_extra='mode = "async"',
                     extra=f"[async]\nbuffer_k = 2\nmax_staleness = 2\n[release]\nevery = 3\nmin_clients = 1\n"
                           f"margin = 1.0\nwait_s = 20\nkey = \"{priv}\"\n")
    out, store = tmp_path / "out", tmp_path / "out" / "releases"
    coord = Coordinator(load_config(cfg), broker.url, out, exporter=lambda c, o: locked(lock, export_standalone, c, o))

    # held-out decoders: follow releases, decode cue-locked windows, write every window with its release version
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    players, decoders, stats, preds = {}, {}, {}, {}
    for s in (4, 5):
        name = unique_name(f"dec{s}")
        live = concatenate([_run(s, r) for r in (4, 8, 12)])
        players[s] = HeadsetPlayer(live, PlayerConfig(name=name, speed=LIVE_SPEED, loop=True, wait_consumers=120.0,
                                                      markers=True))
        stats[s], preds[s] = tmp_path / f"stats{s}.json", tmp_path / f"pred{s}.jsonl"
        decoders[s] = subprocess.Popen(
            [sys.executable, "-c", "from neurofed.edge.cli import main; main()", "infer", "--stream", name,
             "--follow", "--pub", str(pub), "--broker", broker.url, "--federation", fed_name, "--release-dir",
             str(tmp_path / f"in{s}"), "--release-timeout", "150", "--quiet", "--mode", "cue", "--threads", "1",
             "--predictions-out", str(preds[s]), "--stats-out", str(stats[s]), "--timeout", "60"],
            stdout=open(tmp_path / f"dec{s}.log", "wb"), stderr=subprocess.STDOUT, env=env)
        players[s].start()

    # the fleet: headset hosts recording sessions into their stores, each with its edge client
    hosts = {1: HeadsetHost(1, [4, 8, 12], tmp_path / "S001"), 2: HeadsetHost(2, [4, 8], tmp_path / "S002"),
             3: HeadsetHost(3, [4], tmp_path / "S003"),
             6: HeadsetHost(6, [4, 8], tmp_path / "S006")}
    join_when = {6: lambda: coord.server.round >= 2}  # S006's host comes online late (its store already holds trials)
    edges = {s: EdgeClient(broker.url, fed_name, f"S{s:03d}", make_loader(None, None, h.store.path),
                           tmp_path / "state", join_timeout=60, montage=make_montage(h.store.path, None), window=30,
                           reload_data=True, evaluate=s == 3) for s, h in hosts.items()}
    serialise_training(list(edges.values()), lock)
    stops = {s: threading.Event() for s in hosts}
    runs: dict[int, Bg] = {}
    joined_at: dict[int, int] = {}  # the coordinator's version when the client started
    left_at = None
    ct = Bg(coord.run)
    for h in hosts.values():
        h.start()
    forged = rolled = False
    try:
        end = time.monotonic() + 200
        while time.monotonic() < end:
            time.sleep(0.2)
            for s, h in hosts.items():
                assert h.error is None, h.error
                if s not in runs and h.sessions and join_when.get(s, lambda: True)():  # a session stored: it joins
                    joined_at[s] = coord.server.round
                    runs[s] = Bg(lambda s=s: edges[s].run(stop=stops[s], max_seconds=200))
            if left_at is None and len(hosts[2].sessions) == 2 and edges[2].data is not None \
                    and len(edges[2].data.y) == sum(x["stored"] for x in hosts[2].sessions):
                stops[2].set()  # S002 trained on its second session: it leaves for good
                runs[2].result(10)
                left_at = time.time()
            got = {s: read_predictions(p) if p.is_file() else [] for s, p in preds.items()}
            if not forged and coord.releases and all(got.values()):
                # a client with broker access publishes a forged release: valid format, another key, version 99
                data = (store / "v0001.onnx").read_bytes()
                with MqttTransport(broker.url, unique_name("forger")).connect(timeout=5) as f:
                    f.publish(Topics(fed_name).release, rel.pack(data, rel.sign(data, rel.load_private(forger_priv),
                                                                                99, 1)), retain=True, wait=5)
                forged = True
            n3 = [sum(r.get("model_version") == 3 for r in g) for g in got.values()]
            if not rolled and not ct.is_alive() and min(n3) >= 2:  # the coordinator is done; release 3 decodes
                h = rollback(1, priv, broker.url, fed_name, store)  # neurofed release rollback --version 1
                assert (h["version"], h["parent"], h["rollback_of"]) == (4, 3, 1)
                rolled = True
            if rolled and min(sum(r.get("model_version") == 4 for r in g) for g in got.values()) >= 2:
                break
        ct.result(5)
    finally:
        for d in decoders.values():
            if d.poll() is None:
                d.send_signal(signal.SIGINT)  # the decoder ends its loop and writes its stats
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
        broker.stop()
    assert rolled, "release 3 did not reach both decoders with the coordinator done in time"

    # the federation: three releases; stores grew between trainings; the late client and the one that left
    history = read_history(store)
    assert [h["release"] for h in history if h["released"]] == [1, 2, 3], history
    subs = [(v["round"], *row) for v in json.loads((out / "metrics.json").read_text())["rounds"]
            for row in v["submissions"]]
    trials = {c: [r[6] for r in subs if r[1] == c] for c in ("S001", "S002", "S006")}
    assert max(trials["S001"]) > min(trials["S001"]), trials  # it trained on a grown store
    assert joined_at[6] >= 2 and trials["S006"], (joined_at, trials)  # it joined late and contributed
    assert not any(r[1] == "S003" for r in subs)  # the validating client never trained
    assert len(trials["S002"]) <= edges[2].rounds_trained  # every S002 update was trained before it left
    for s, h in hosts.items():
        assert all(x["stored"] == x["cues"] for x in h.sessions), (s, h.sessions)  # the capture kept every cue

    # the decoders: every release reached both, in order; no cue window lost or decoded twice; forgery refused
    rep = release_report({f"S{s:03d}": p for s, p in preds.items()}, store)
    for s, d in decoders.items():
        assert d.returncode == 0, (tmp_path / f"dec{s}.log").read_text()[-2000:]
        st = json.loads(stats[s].read_text())
        assert st["accepted"] == [1, 2, 3, 4], st  # 4: the rollback (release 1's model, signed anew)
        chain = [(w["previous"], w["version"]) for w in st["swaps"]]
        assert chain in ([(1, 2), (2, 3), (3, 4)], [(1, 3), (3, 4)]), st["swaps"]  # 2 may be superseded by 3
        assert st["swaps"][-1]["rollback_of"] == 1
        assert len(st["refused"]) == 1 and "bad signature" in st["refused"][0], st["refused"]
        assert st["skipped"] == 0
        rows = read_predictions(preds[s])
        sent = players[s].markers_sent
        assert len(rows) == st["predictions"] + st["rejections"] and len(rows) <= len(sent)
        assert all(abs(r["onset"] - m[0]) < 2e-3 and r["cue"] == m[1] for r, m in zip(rows, sent)), "cue lost/twice"
        versions = [r["model_version"] for r in rows]
        assert versions == sorted(versions)
        assert {str(v): versions.count(v) for v in set(versions)} == st["windows_by_version"]
        for v, n in st["windows_by_version"].items():  # the report has every release's live windows
            live = next(r for r in rep["releases"] if r["release"] == int(v))["live"][f"S{s:03d}"]
            assert live["windows"] == n and live["n"] == n - live["rejected"]
    by = {r["release"]: r for r in rep["releases"]}
    assert all(by[v]["validation"]["of_release"] == v for v in (1, 2, 3)) and by[4]["validation"]["of_release"] == 1
    (tmp_path / "report.json").write_text(json.dumps(rep, indent=1))
    print("\n".join(summary_lines(rep)))
    print(f"long-lived e2e: {time.monotonic() - t0:.1f} s; sessions "
          f"{ {s: [(x['run'], x['stored']) for x in h.sessions] for s, h in hosts.items()} }; trials per update "
          f"{trials}; S006 joined at version {joined_at[6]}")


def locked(lock, fn, *args):
    with lock:
        return fn(*args)
