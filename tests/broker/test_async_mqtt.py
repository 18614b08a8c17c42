"""An asynchronous federation over the protocol (``federation.mode = "async"``) equals the simulation for its
arrival order, to 1e-6.

The coordinator and four edge clients (each loading its subject as `edge-client join --subject --window` does) run
for real over the in-memory broker (unit) or a real Mosquitto with separate processes (integration). The arrival
order is whatever the broker and the threads made it; the coordinator logs every submission (client, base version,
verdict) in metrics.json, and :func:`neurofed.trainer.experiments.asyncsim.replay_async` - the simulation's client
and server maths for a fixed arrival order - replays that log in-process: same model to 1e-6, same verdicts and
weights.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from neurofed.broker.config import ConfigError, load_config
from neurofed.broker.coordinator import Coordinator, initial_model
from neurofed.edge.federation import EdgeClient
from neurofed.edge.join_cli import make_loader
from neurofed.trainer.experiments.asyncsim import AsyncConfig, replay_async
from neurofed.trainer.fl.fedbuff import staleness_weight
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.strategies import get_strategy
from tests.broker.conftest import DATA_DIR, child_env, kill_all, wait_all, write_toml

K, MAX_STALE, VERSIONS, WINDOW = 2, 1, 4, 30


def async_toml(tmp_path: Path, fed: str, strategy: str = "fedbs") -> Path:
    return write_toml(tmp_path / "federation.toml", fed, rounds=VERSIONS, min_clients=4, strategy=strategy,
                      federation_extra='mode = "async"',
                      extra=f"[async]\nbuffer_k = {K}\nmax_staleness = {MAX_STALE}\nserver_lr = 1.0\n")


def assert_equals_replay(out: Path, subjects, cfg: Path, strategy: str = "fedbs") -> list:
    """The coordinator's final model equals the in-process replay of its logged arrival order (1e-6); returns the
    log."""
    rounds = json.loads((out / "metrics.json").read_text())["rounds"]
    assert [m["version"] for m in rounds] == list(range(1, VERSIONS + 1))
    log = [row for m in rounds for row in m["submissions"]]
    torch.set_num_threads(1)
    clients = {sd.subject: sd for sd in subjects}
    buf, verdicts = replay_async(clients, "eegnet", get_strategy(strategy), LocalConfig(batch_size=16, local_epochs=1),
                                 AsyncConfig(buffer_k=K, max_staleness=MAX_STALE, window=WINDOW), 7,
                                 [(r[0], r[1]) for r in log])
    assert [(v.code, v.staleness) for v in verdicts] == [(r[2], r[3]) for r in log]
    for v, r in zip(verdicts, log):  # weight n_i * 1/sqrt(1 + tau), n_i the trials the client says it used
        assert r[4] == pytest.approx(v.weight) and (r[2] != "accepted" or r[5] == WINDOW)
        if r[2] == "accepted":
            assert r[4] == pytest.approx(WINDOW * staleness_weight(r[3]))
    assert buf.version == VERSIONS
    got, want = load_file(str(out / "global_model.safetensors")), buf.server.global_state
    assert got.keys() == want.keys()
    diff = max(float((got[k].double() - want[k].double()).abs().max()) for k in want)
    print(f"async over the protocol vs replay: max |diff| {diff:.3g}; log {log}")
    assert diff <= 1e-6, diff
    init = initial_model(load_config(cfg)).state_dict()
    assert max(float((got[k] - init[k]).abs().max()) for k in init) > 1e-3  # it learnt something
    return log


def test_async_federation_over_the_protocol_equals_the_simulation(subjects4, memory_broker, fed_name, tmp_path):
    from tests.broker.test_hostile import Bg
    from tests.broker.test_profiles_mqtt import serialise_training

    cfg = async_toml(tmp_path, fed_name)
    out = tmp_path / "out"
    coord = Coordinator(load_config(cfg), memory_broker.url, out)
    ct = Bg(coord.run)
    edges = [EdgeClient(memory_broker.url, fed_name, f"S{s:03d}", make_loader(DATA_DIR, s, None), tmp_path / "state",
                        join_timeout=60, window=WINDOW) for s in (1, 2, 3, 4)]
    serialise_training(edges)
    runs = [Bg(lambda e=e: e.run(max_seconds=240)) for e in edges]
    ct.result(240)
    assert all(r.result(60) > 0 for r in runs)  # every client trained
    log = assert_equals_replay(out, subjects4, cfg)
    # the run really was asynchronous: updates trained from an older version were used, down-weighted
    assert any(r[2] == "accepted" and r[3] >= 1 for r in log), log
    # stale updates were refused with the code `stale` and their clients told so
    stale = [r for r in log if r[2] == "stale"]
    told = [n for who, topic, n, retain in memory_broker.log if "/error/" in topic]
    assert len(told) >= (1 if stale else 0)
    assert json.loads((out / "metrics.json").read_text())["rejections"].get("stale", 0) == len(stale)


def test_async_refuses_a_synchronous_strategy_in_one_line(tmp_path):
    cfg = async_toml(tmp_path, "x", strategy="scaffold")
    with pytest.raises(ConfigError, match="strategy scaffold cannot run asynchronously") as e:
        load_config(cfg)
    assert "\n" not in str(e.value)


@pytest.mark.integration
def test_async_federation_of_real_processes_over_mosquitto(subjects4, mosquitto, fed_name, tmp_path):
    """`neurofed coordinator --mode async` and 4 `edge-client join --window` processes over a real Mosquitto."""
    import subprocess
    import sys

    cfg = write_toml(tmp_path / "federation.toml", fed_name, rounds=VERSIONS, min_clients=4, strategy="fedbs",
                     extra=f"[async]\nbuffer_k = {K}\nmax_staleness = {MAX_STALE}\n")  # mode from the CLI
    env = child_env(os.environ.get("NEUROFED_CACHE") and Path(os.environ["NEUROFED_CACHE"]))
    out = tmp_path / "out"
    coord = subprocess.Popen([sys.executable, "-c", "from neurofed.cli import main; main()", "coordinator", "--broker",
                              mosquitto.url, "--config", str(cfg), "--out", str(out), "--keepalive", "5", "--mode",
                              "async"], stdout=open(tmp_path / "coord.log", "ab"), stderr=subprocess.STDOUT, env=env)
    edges = [subprocess.Popen(
        [sys.executable, "-c", "from neurofed.edge.cli import main; main()", "join", "--broker", mosquitto.url,
         "--client-id", f"S{s:03d}", "--federation", fed_name, "--data-dir", str(DATA_DIR), "--subject", str(s),
         "--state-dir", str(tmp_path / "state"), "--max-seconds", "240", "--keepalive", "5", "--window", str(WINDOW)],
        stdout=open(tmp_path / f"edge{s}.log", "ab"), stderr=subprocess.STDOUT, env=env) for s in (1, 2, 3, 4)]
    try:
        assert wait_all([coord], 240) == [0], (tmp_path / "coord.log").read_text()[-3000:]
        assert wait_all(edges, 30) == [0] * 4, [(tmp_path / f"edge{s}.log").read_text()[-1500:] for s in (1, 2, 3, 4)]
    finally:
        kill_all([coord, *edges])
    assert_equals_replay(out, subjects4, cfg)
    assert not math.isnan(json.loads((out / "metrics.json").read_text())["rounds"][-1]["loss"])


def test_async_coordinator_resumes_from_its_last_version_and_release_history(memory_broker, fed_name, tmp_path):
    """`neurofed coordinator --resume` of an asynchronous run with a release gate: stopped after release 1, a new
    coordinator resumes from the last checkpointed version with the same run id and release history; the clients
    (never restarted) go on training, the run ends at its last version, and the releases made after the resume
    continue the numbering and the parent chain (each version made exactly once across the two coordinators)."""
    import threading
    import time

    from neurofed.broker.coordinator import FederationError
    from neurofed.broker.release_gate import read_history
    from tests.broker.test_hostile import Bg
    from tests.broker.test_profiles_mqtt import serialise_training

    versions = 8
    cfg = write_toml(tmp_path / "federation.toml", fed_name, rounds=versions, min_clients=2, strategy="fedavg",
                     federation_extra='mode = "async"',
                     extra=f"[async]\nbuffer_k = {K}\nmax_staleness = 2\n[release]\nevery = 2\nmin_clients = 1\n"
                           "margin = 1.0\nwait_s = 30\n")
    out, stop = tmp_path / "out", threading.Event()
    first = Coordinator(load_config(cfg), memory_broker.url, out)
    ct = Bg(lambda: first.run(stop))
    edges = [EdgeClient(memory_broker.url, fed_name, f"S{s:03d}", make_loader(DATA_DIR, s, None), tmp_path / "state",
                        join_timeout=60, window=WINDOW, evaluate=s == 3) for s in (1, 2, 3)]
    serialise_training(edges)
    runs = [Bg(lambda e=e: e.run(max_seconds=240)) for e in edges]
    end = time.monotonic() + 120
    while not first.releases and time.monotonic() < end:
        time.sleep(0.05)
    stop.set()  # the coordinator stops (as after a crash: its last checkpoint is its last version)
    with pytest.raises(FederationError, match="stopped"):
        ct.result(60)
    before = [h["release"] for h in read_history(out / "releases") if h["released"]]
    stopped_at = first.server.round
    assert before[0] == 1 and 2 <= stopped_at < versions, (before, stopped_at)
    again = Coordinator(load_config(cfg), memory_broker.url, out, resume=True)
    assert (again.server.round, again.run_id) == (stopped_at, first.run_id)
    assert again.gate is not None and again.gate.current == before[-1] and again.gate.current_state is not None
    state = Bg(again.run).result(180)
    assert state.round == versions
    assert [r.result(60) for r in runs][2] == 0 and all(e.finished for e in edges)
    rounds = json.loads((out / "metrics.json").read_text())["rounds"]
    assert [m["version"] for m in rounds] == list(range(1, versions + 1))
    history = [h for h in read_history(out / "releases") if h["released"]]
    n = len(before)
    assert len(history) > n and history[-1]["version"] == versions  # releases made after the resume, the last one
    assert [(h["release"], h["parent"]) for h in history] == [(i + 1, i or None) for i in range(len(history))]
    assert history[n]["version"] > stopped_at
