"""Heterogeneous headsets in one federation over a real Mosquitto (issue 19, item 3): a mixed-profile
federation gives the in-process simulation's weights; another profile's tensors, an unknown profile and a
device that matches no profile are each refused with one clear line, and nothing is aggregated from them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from neurofed.broker.config import ConfigError, config_from_dict, load_config
from neurofed.broker.coordinator import Coordinator, initial_models
from neurofed.broker.protocol import (
    COORDINATOR_ID,
    ErrorMsg,
    JoinMsg,
    StatusMsg,
    Topics,
    UpdateMsg,
    decode,
    encode,
    pack,
    state_sha256,
)
from neurofed.broker.transport import MqttTransport
from neurofed.edge.federation import EdgeClient
from neurofed.edge.join_cli import make_loader, make_montage
from neurofed.trainer.checkpoint import load_checkpoint, load_profile_models
from neurofed.trainer.data.config import SENSORIMOTOR_21, PreprocessConfig
from neurofed.trainer.data.profiles import get_profile, load_profile_subject
from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl.api import GROUP_MARK
from neurofed.trainer.fl.init import init_server_state
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import downlink
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import build_model
from tests.broker.conftest import DATA_DIR, child_env, kill_all
from tests.broker.test_hostile import Bg

#: subject -> device profile of the mixed federation (different channel counts: 8 and 16 channels)
MIXED = {1: "unicorn8", 2: "cyton_daisy16", 3: "unicorn8", 4: "cyton_daisy16"}
PRE = PreprocessConfig(resample=80.0)  # each device keeps its own channels; all meet at the model's 80 Hz


def profile_subjects(assign: dict[int, str]):
    return {f"S{s:03d}": load_profile_subject(s, p, PRE, DATA_DIR, 0) for s, p in assign.items()}


def reference(assign: dict[int, str], rounds: int, fraction: float, seed: int = 7, model: str = "fleeg_eegnet",
              **overrides: str):
    """The in-process simulation of the same federation: (server global state, per-profile models);
    ``overrides``: strategy parameters (as ``[federation] strategy_overrides``)."""
    torch.set_num_threads(1)
    clients = profile_subjects(assign)
    groups = {f"S{s:03d}": p for s, p in assign.items()}
    _, info = run_federated(clients, model, get_strategy("fleeg", **overrides),
                            LocalConfig(batch_size=16, local_epochs=1), rounds, fraction, seed, groups=groups)
    return info["server"].global_state, info["models"]


def toml(path: Path, fed: str, profiles: list[str], rounds: int, fraction: float, min_clients: int,
         model: str = "fleeg_eegnet", **overrides: str) -> Path:
    over = ", ".join(f'{k} = "{v}"' for k, v in overrides.items())
    path.write_text(f"""[federation]
name = "{fed}"
rounds = {rounds}
fraction = {fraction}
seed = 7
min_clients = {min_clients}
join_timeout_s = 120
round_deadline_s = 90
strategy = "fleeg"
strategy_overrides = {{{over}}}
profiles = {profiles!r}

[model]
name = "{model}"

[preprocess]
resample = 80.0

[local]
batch_size = 16
local_epochs = 1
""".replace("'", '"'))
    return path


def edge_cmd(url: str, fed: str, subject: int, profile: str, state: Path) -> list[str]:
    return [sys.executable, "-c", "from neurofed.edge.cli import main; main()", "join", "--broker", url, "--client-id",
            f"S{subject:03d}", "--federation", fed, "--data-dir", str(DATA_DIR), "--subject", str(subject),
            "--profile", profile, "--state-dir", str(state), "--max-seconds", "600", "--keepalive", "5"]


def serialise_training(edges: list[EdgeClient], lock: threading.Lock | None = None) -> None:
    """Edge clients on threads of one process share torch's global RNG (dropout is seeded per round and client
    with ``torch.manual_seed``; building a model draws from it too): one at a time handles a task, as separate
    processes on separate devices would (``lock``: shared with other torch work of the test, e.g. an ONNX export)."""
    lock = lock or threading.Lock()
    for e in edges:
        def run_task(*a, _run=e._run_task):
            with lock:
                return _run(*a)
        e._run_task = run_task  # type: ignore[method-assign]

        def on_eval(*a, _ev=e._on_eval):  # a validating client's evaluation (asynchronous federations)
            with lock:
                return _ev(*a)
        e._on_eval = on_eval  # type: ignore[method-assign]


def _diff(a, b) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in b)


def run_mixed(mosquitto, fed_name: str, cfg: Path, tmp_path: Path) -> tuple[Path, list, int]:
    """The coordinator and one in-process edge client per subject of ``MIXED`` (each through its device):
    returns (output folder, the edge clients, the number of updates they delivered)."""
    out = tmp_path / "out"
    coord = Coordinator(load_config(cfg), mosquitto.url, out)
    ct = Bg(coord.run)
    edges = [EdgeClient(mosquitto.url, fed_name, f"S{s:03d}", make_loader(DATA_DIR, s, None, p), tmp_path / "st",
                        montage=make_montage(None, p)) for s, p in MIXED.items()]
    serialise_training(edges)
    runs = [Bg(lambda e=e: e.run(max_seconds=600)) for e in edges]
    ct.result(600)
    return out, edges, sum(r.result(60) for r in runs)


@pytest.mark.slow
def test_mixed_profile_mqtt_federation_matches_in_process(mosquitto, fed_name, tmp_path):
    """Two device profiles (8 and 16 channels), four real subjects, 3 rounds of 3 clients: the coordinator and
    the edge clients (each loading its subject through its device as `edge-client join --profile` does) end with
    the in-process simulation's weights, the shared module and each profile's own."""
    os.environ.setdefault("NEUROFED_CACHE", str(tmp_path / "cache"))
    want_state, want_models = reference(MIXED, rounds=3, fraction=0.75)  # also fills the cache for the clients
    cfg = toml(tmp_path / "federation.toml", fed_name, ["unicorn8", "cyton_daisy16"], 3, 0.75, 4)
    out, edges, n_updates = run_mixed(mosquitto, fed_name, cfg, tmp_path)
    assert n_updates == 9  # 3 rounds x 3 clients
    assert [e.profile for e in edges] == list(MIXED.values())

    got = load_file(str(out / "global_model.safetensors"))  # the whole server state
    assert got.keys() == want_state.keys()
    assert {k.split("/")[0] for k in got if k.startswith(GROUP_MARK)} == {"@unicorn8", "@cyton_daisy16"}
    diff = _diff(got, want_state)
    print(f"MQTT vs in-process: max abs diff {diff:.3g} over {len(got)} tensors")  # shown by pytest -rP
    assert diff <= 1e-6, f"max abs diff {diff}"
    init = init_server_state(initial_models(load_config(cfg)), ("local.",))
    for p in ("unicorn8", "cyton_daisy16"):  # every profile's module was trained
        own = [k for k in got if k.startswith(f"@{p}/")]
        assert own and max(float((got[k] - init[k]).abs().max()) for k in own) > 1e-4
        model, meta = load_checkpoint(out / f"global_model.{p}.safetensors")  # one deployable model per profile
        assert meta.extra["profile"] == p and meta.ch_names == list(get_profile(p).channels)
        assert _diff(model.state_dict(), want_models[p].state_dict()) <= 1e-6
    split = load_profile_models(out / "global_model.safetensors")  # `neurofed export` splits it the same way
    assert sorted(split) == ["cyton_daisy16", "unicorn8"]
    assert all(_diff(m.state_dict(), want_models[p].state_dict()) <= 1e-6 for p, (m, _) in split.items())


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["fleeg_proj_eegnet", "fleeg_fixmap_eegnet"])
def test_channel_map_model_over_mqtt_matches_in_process(mosquitto, fed_name, tmp_path, model_name):
    """fleeg_proj_eegnet (per-profile channel map initialised from the profile's ch_names in its ModelSpec, the
    whole EEGNet shared) and fleeg_fixmap_eegnet (the same map, frozen): the MQTT federation ends with the
    in-process simulation's weights."""
    os.environ.setdefault("NEUROFED_CACHE", str(tmp_path / "cache"))
    want_state, want_models = reference(MIXED, rounds=2, fraction=0.75, model=model_name)
    cfg = toml(tmp_path / "federation.toml", fed_name, ["unicorn8", "cyton_daisy16"], 2, 0.75, 4,
               model=model_name)
    out, _, n_updates = run_mixed(mosquitto, fed_name, cfg, tmp_path)
    assert n_updates == 6
    got = load_file(str(out / "global_model.safetensors"))
    assert got.keys() == want_state.keys()
    assert got["@unicorn8/local.weight"].shape == (21, 8) and got["@cyton_daisy16/local.weight"].shape == (21, 16)
    assert _diff(got, want_state) <= 1e-6
    for p in ("unicorn8", "cyton_daisy16"):
        model, meta = load_checkpoint(out / f"global_model.{p}.safetensors")
        assert meta.ch_names == list(get_profile(p).channels) and meta.model == model_name
        assert _diff(model.state_dict(), want_models[p].state_dict()) <= 1e-6
        if model_name == "fleeg_fixmap_eegnet":  # the frozen map arrives as the spherical-spline matrix, exactly
            from neurofed.trainer.data.profiles import interpolation_matrix

            w = interpolation_matrix(get_profile(p).channels, SENSORIMOTOR_21).astype("float32")
            assert torch.equal(got[f"@{p}/local.weight"], torch.from_numpy(w))


@pytest.mark.slow
def test_local_bn_mode_travels_with_the_strategy_over_mqtt(mosquitto, fed_name, tmp_path):
    """A non-default ``local_bn_mode`` (batch-specific BN in the per-device module, standard BN in the shared one)
    set in ``[federation] strategy_overrides``: coordinator and edge clients build the simulation's model
    (no running statistics in ``local.``) and end, after 2 rounds of 3 of 4 clients, with its weights (1e-6)."""
    os.environ.setdefault("NEUROFED_CACHE", str(tmp_path / "cache"))
    over = {"local_bn_mode": "batch_specific"}
    want_state, want_models = reference(MIXED, rounds=2, fraction=0.75, **over)
    cfg = toml(tmp_path / "federation.toml", fed_name, ["unicorn8", "cyton_daisy16"], 2, 0.75, 4, **over)
    init = init_server_state(initial_models(load_config(cfg)), ("local.",))  # drawn before any client thread trains
    assert init.keys() == want_state.keys()
    assert not any(k.startswith("@") and "running_" in k for k in init)  # batch-specific BN in local.*
    assert any(k.startswith("body.") and "running_mean" in k for k in init)  # standard BN in the shared part
    out, _edges, n_updates = run_mixed(mosquitto, fed_name, cfg, tmp_path)
    assert n_updates == 6  # 2 rounds x 3 clients
    got = load_file(str(out / "global_model.safetensors"))
    assert got.keys() == want_state.keys()
    diff = _diff(got, want_state)
    print(f"MQTT vs in-process (local_bn_mode=batch_specific): max abs diff {diff:.3g} over {len(got)} tensors")
    assert diff <= 1e-6, f"max abs diff {diff}"
    for p, want in want_models.items():  # the deployable per-profile models rebuild with the same BN rule
        model, meta = load_checkpoint(out / f"global_model.{p}.safetensors")
        assert meta.extra["model_kwargs"] == over and not model.local[1].track_running_stats
        assert _diff(model.state_dict(), want.state_dict()) <= 1e-6
    split = load_profile_models(out / "global_model.safetensors")
    assert all(not m.local[1].track_running_stats for m, _ in split.values())


@pytest.mark.e2e
@pytest.mark.slow
def test_profile_federation_resumes_after_coordinator_kill9(mosquitto, fed_name, tmp_path):
    """`neurofed coordinator` of a mixed-profile federation killed (-9) while round 1 is in flight, then restarted
    with --resume, with four `edge-client join --profile` processes (no shared RNG, no shared memory): the registry
    keeps each client's profile, the per-profile modules come back from the checkpoint, and the run ends with the
    in-process simulation's server state within 1e-6. (It is also the real-process test of a mixed-profile
    federation: one without the kill ran the same federation to the same assertion, and was merged into this.)"""
    from tests.broker.test_reliability import Watcher

    os.environ.setdefault("NEUROFED_CACHE", str(tmp_path / "cache"))
    want_state, _ = reference(MIXED, rounds=2, fraction=0.75)  # also fills the cache the processes read
    cfg = toml(tmp_path / "federation.toml", fed_name, ["unicorn8", "cyton_daisy16"], 2, 0.75, 4)
    env, out = child_env(Path(os.environ["NEUROFED_CACHE"])), tmp_path / "out"
    w = Watcher(mosquitto.url, fed_name)

    def coordinator(log: str, resume: bool) -> subprocess.Popen:
        with open(tmp_path / log, "ab") as fh:
            return subprocess.Popen([sys.executable, "-c", "from neurofed.cli import main; main()", "coordinator",
                                     "--broker", mosquitto.url, "--config", str(cfg), "--out", str(out),
                                     "--keepalive", "5", *(["--resume"] if resume else [])],
                                    stdout=fh, stderr=subprocess.STDOUT, env=env)

    coord = coordinator("coord.log", False)
    edges = []
    for s, p in MIXED.items():
        with open(tmp_path / f"edge{s}.log", "ab") as fh:
            edges.append(subprocess.Popen(edge_cmd(mosquitto.url, fed_name, s, p, tmp_path / "state"), env=env,
                                          stdout=fh, stderr=subprocess.STDOUT))
    try:
        w.wait_for(lambda tp, m: m.kind == "task" and m.round == 1, 300)  # round 1 in flight
        coord.send_signal(signal.SIGKILL)
        coord.wait(10)
        assert (out / "server_state.safetensors").exists()
        coord = coordinator("coord2.log", True)
        coord.wait(600)
        for e in edges:
            e.wait(60)
    finally:
        kill_all([coord, *edges])
        w.t.close()
    log = (tmp_path / "coord2.log").read_text()
    assert coord.returncode == 0 and "resumed" in log, log[-3000:]
    assert [e.returncode for e in edges] == [0] * 4, [(tmp_path / f"edge{s}.log").read_text()[-1500:] for s in MIXED]
    got = load_file(str(out / "global_model.safetensors"))
    assert got.keys() == want_state.keys()
    diff = _diff(got, want_state)
    print(f"resumed MQTT run vs in-process: max abs diff {diff:.3g} over {len(got)} tensors")  # pytest -rP
    assert diff <= 1e-6, f"max abs diff {diff}"
    for p in ("unicorn8", "cyton_daisy16"):
        assert (out / f"global_model.{p}.safetensors").exists()


def _cfg(fed: str, out: Path, profiles: list[str], **kw):
    d = {"name": fed, "rounds": 1, "fraction": 1.0, "seed": 7, "min_clients": 2, "round_deadline_s": 60,
         "strategy": "fleeg", "join_timeout_s": 60, "profiles": profiles, **kw}
    return config_from_dict({"federation": d, "model": {"name": "fleeg_eegnet"}, "preprocess": {"resample": 80.0},
                             "local": {"batch_size": 16, "local_epochs": 1}, "output": {"dir": str(out)}})


class Forger:
    """A raw MQTT client speaking the protocol by hand (joins, reads the task, uploads what it likes)."""

    def __init__(self, url: str, fed: str, cid: str) -> None:
        self.topics, self.fed, self.cid = Topics(fed), fed, cid
        self.t = MqttTransport(url, f"{fed}-{cid}", reconnect_max_s=1).connect()
        for tp in (self.topics.model, self.topics.task, self.topics.error(cid), self.topics.profile_model("unicorn8")):
            self.t.subscribe(tp)
        self.errors: list[ErrorMsg] = []
        self.sent: set[str] = set()
        self.models: dict[str, tuple] = {}  # topic -> the latest (ModelMsg, tensors) seen on it

    def wait(self, pred, timeout: float = 60.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            item = self.t.get(0.1)
            if item is None or item.event != "message" or not item.payload:
                continue
            msg, tensors = decode(item.payload)
            if msg.kind == "model":
                self.models[item.topic] = (msg, tensors)
            if msg.kind == "error" and msg.sender == COORDINATOR_ID and msg.reply_to in self.sent:
                self.errors.append(msg)
            if pred(item.topic, msg):
                return msg, tensors
        raise AssertionError("condition not seen in time")

    def send(self, topic: str, msg, tensors=None, reference=None) -> None:
        self.sent.add(msg.msg_id)
        self.t.publish(topic, encode(msg, tensors, reference=reference), wait=10)


@pytest.mark.slow
def test_another_profiles_update_and_an_unknown_profile_are_refused(mosquitto, fed_name, tmp_path, caplog):
    """A client joined as unicorn8 uploads a cyton_daisy16-shaped state: rejected (`wrong_profile`), a one-line
    reply, nothing aggregated (the result equals the run without it); a join naming a profile the federation
    does not serve is refused (`unknown_profile`)."""
    os.environ.setdefault("NEUROFED_CACHE", str(tmp_path / "cache"))
    want, _ = reference({1: "unicorn8"}, rounds=1, fraction=1.0)
    data = profile_subjects({1: "unicorn8"})["S001"]
    # the forger's models are drawn now, before S001 trains: model init draws from torch's global RNG, which the
    # client thread's dropout shares (drawing them mid-round made the result differ from the reference)
    model8 = build_model("fleeg_eegnet", 8, 2, 320, 80.0, "standard")
    wrong = build_model("fleeg_eegnet", 16, 2, 320, 80.0, "standard").state_dict()  # cyton_daisy16's shapes
    coord = Coordinator(_cfg(fed_name, tmp_path / "out", ["unicorn8"], join_timeout_s=600), mosquitto.url)
    ct = Bg(coord.run)
    edge = EdgeClient(mosquitto.url, fed_name, "S001", lambda spec: data, tmp_path / "st",
                      montage=lambda: (list(get_profile("unicorn8").channels), 250.0))
    et = Bg(lambda: edge.run(max_seconds=900))
    # `edge-client join` on a device (cyton8: 8 channels at 250 Hz, other positions) no profile of the federation
    # matches: one line naming the problem, exit code 2, and the coordinator hears why
    log = tmp_path / "stranger.log"
    with open(log, "ab") as fh:
        stranger = subprocess.Popen(edge_cmd(mosquitto.url, fed_name, 9, "cyton8", tmp_path / "st"),
                                    env=child_env(Path(os.environ["NEUROFED_CACHE"])), stdout=fh,
                                    stderr=subprocess.STDOUT)
    try:
        stranger.wait(600)
    finally:
        kill_all([stranger])
    text = log.read_text()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert stranger.returncode == 2 and "Traceback" not in text, text[-2000:]
    assert "matches no device profile (unicorn8)" in lines[-1] and "8 channels at 250 Hz" in lines[-1], lines[-1]
    f = Forger(mosquitto.url, fed_name, "X01")
    try:
        model_msg, _ = f.wait(lambda tp, m: m.kind == "model" and not m.meta.profile)
        run = model_msg.run_id
        base = {"federation": fed_name, "sender": "X01", "run_id": run, "n_trials": 40, "n_times": 320,
                "sfreq": 80.0, "classes": ["left_fist", "right_fist"]}
        f.send(f.topics.join("X01"), JoinMsg(**base, n_channels=8, profile="cyton8"))
        f.wait(lambda tp, m: bool(f.errors))
        assert f.errors[-1].code == "unknown_profile" and "not in this federation (unicorn8)" in f.errors[-1].message
        f.send(f.topics.join("X01"), JoinMsg(**base, n_channels=8, profile="unicorn8"))
        task, _ = f.wait(lambda tp, m: m.kind == "task" and "X01" in m.selected)
        assert task.profiles == {"S001": "unicorn8", "X01": "unicorn8"}
        assert coord.rejections["unknown_profile"] == 1  # the stranger's report was logged, not counted
        assert "client S009 reports unknown_profile: stream with 8 channels at 250 Hz" in caplog.text

        pm, view = f.models[f.topics.profile_model("unicorn8")]
        assert pm.meta.profile == "unicorn8" and pm.meta.n_channels == 8
        assert state_sha256(view) == task.profile_models["unicorn8"]
        assert not any(k.startswith(GROUP_MARK) for k in view)  # a profile's view: un-prefixed, no other module
        strategy = get_strategy("fleeg")
        down = downlink(view, strategy, model8, "unicorn8")
        f.send(f.topics.update("X01"), UpdateMsg(federation=fed_name, sender="X01", round=0, task_id=task.task_id,
                                                  n_samples=40, base_sha256=state_sha256(down), run_id=run),
               pack({"state": wrong, "extra": {}}))
        f.wait(lambda tp, m: any(e.code == "wrong_profile" for e in f.errors))
        err = next(e for e in f.errors if e.code == "wrong_profile")
        assert "local.2.weight" in err.message and "device profile unicorn8 expects" in err.message
        assert "\n" not in err.message
        f.send(f.topics.status("X01"), StatusMsg(federation=fed_name, sender="X01", state="offline", run_id=run))
        server = ct.result(200)
        assert et.result(60) == 1
    finally:
        f.t.close()
    assert coord.rejections["wrong_profile"] == 1 and coord.rejections["unknown_profile"] == 1
    assert coord.metrics[0]["participants"] == ["S001"]
    assert server.global_state.keys() == want.keys()
    assert _diff(server.global_state, want) <= 1e-6  # nothing of X01's update reached the model


@pytest.mark.unit
def test_profile_config_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "bad8", "channels": ["C3", "Cz", "C4", "XX9"], "sfreq": 250}')
    for profiles, strategy, needle in (
        ([str(bad)], "fleeg", "unknown channel names ['XX9']"),
        (["unicorn8", "nope"], "fleeg", "unknown device profile 'nope'"),
        ([], "fleeg", "aggregates per device profile: list federation.profiles"),
        (["unicorn8"], "fedavg", "needs a hierarchical strategy"),
    ):
        with pytest.raises(ConfigError) as exc:
            _cfg("f", tmp_path, profiles, strategy=strategy)
        assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    with pytest.raises(ConfigError, match="each device keeps its own channels"):
        config_from_dict({"federation": {"strategy": "fleeg", "profiles": ["unicorn8"]},
                          "model": {"name": "fleeg_eegnet"}, "preprocess": {"channels": "sensorimotor21",
                                                                             "resample": 80.0}})
    for name, needle in (("eegnet", "needs a model with a per-device module, model.name = one of fleeg_eegnet, "
                                    "fleeg_proj_eegnet, fleeg_fixmap_eegnet; got 'eegnet'"),
                         ("nope", "fleeg_fixmap_eegnet")):  # the registry's names, the new one included
        with pytest.raises(ConfigError) as exc:
            config_from_dict({"federation": {"strategy": "fleeg", "profiles": ["unicorn8"]},
                              "model": {"name": name}, "preprocess": {"resample": 80.0}})
        assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    for over, needle in (({"local_bn_mode": "nope"}, "local_bn_mode must be one of"),
                         ({"local_bn_mode": "standard"}, "local_bn_mode applies to model fleeg_eegnet only")):
        with pytest.raises(ConfigError) as exc:
            config_from_dict({"federation": {"strategy": "fedavg", "strategy_overrides": over}})
        assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    cfg = _cfg("f", tmp_path, ["unicorn8", "cyton_daisy16"])
    assert cfg.model_spec().n_channels == 0 and [p["name"] for p in cfg.model_spec().profiles] == [
        "cyton_daisy16", "unicorn8"]
    spec = cfg.model_spec("unicorn8")
    assert (spec.n_channels, spec.profile, spec.ch_names) == (8, "unicorn8", list(get_profile("unicorn8").channels))


@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto not installed")
def test_broker_acl_lets_a_client_read_only_its_profiles_model(tmp_path, fed_name):
    """`neurofed broker-config --clients A:unicorn8,B:cyton_daisy16`: on a real Mosquitto, A reads
    `model/unicorn8` and never `model/cyton_daisy16` (nor can it publish a model)."""
    import json
    import tempfile

    from neurofed.broker.embedded import free_port
    from neurofed.broker.secure import BrokerConfigError, SecureBrokerSpec, write_broker_config
    from tests.broker.conftest import Mosquitto

    cfg_dir = Path(tempfile.mkdtemp(prefix="neurofed-mosq-"))  # mosquitto (as user mosquitto) must traverse it
    os.chmod(cfg_dir, 0o755)
    port = free_port()
    files = write_broker_config(SecureBrokerSpec(fed_name, ["A", "B"], port=port,
                                                 profiles={"A": "unicorn8", "B": "cyton_daisy16"}), cfg_dir)
    m = Mosquitto(tmp_path, extra_conf=files.conf.read_text(), port=port).start()
    creds, t = json.loads(files.credentials.read_text()), Topics(fed_name)

    def url(u: str) -> str:
        return f"mqtt://{u}:{creds[u]}@127.0.0.1:{port}"

    try:
        with MqttTransport(url("coordinator"), "coordinator") as c:
            for p in ("unicorn8", "cyton_daisy16"):
                c.publish(t.profile_model(p), p.encode(), retain=True, wait=5)
        a = MqttTransport(url("A"), "A").connect()
        a.publish(t.profile_model("cyton_daisy16"), b"forged", retain=True, wait=5)  # dropped by the ACL
        for p in ("unicorn8", "cyton_daisy16"):
            a.subscribe(t.profile_model(p))
        got, end = {}, time.monotonic() + 2.0
        while time.monotonic() < end:
            i = a.get(0.1)
            if i is not None and i.event == "message":
                got[i.topic] = i.payload
        a.close()
        assert got == {t.profile_model("unicorn8"): b"unicorn8"}
    finally:
        m.stop()
        shutil.rmtree(cfg_dir, ignore_errors=True)
    with pytest.raises(BrokerConfigError, match="not a client"):
        SecureBrokerSpec(fed_name, ["A"], profiles={"Z": "unicorn8"})
