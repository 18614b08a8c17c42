"""Fixtures for broker tests: our own mosquitto on a free port, unique federation names, process helpers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from neurofed.broker.embedded import free_port, port_open

DATA_DIR = Path(os.environ.get("NEUROFED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data" / "eegmmidb"))
if not DATA_DIR.exists():
    DATA_DIR = Path("/work/shared/data/eegmmidb")
SHARED_URL = "mqtt://127.0.0.1:1883"


class Mosquitto:
    """A mosquitto process with a generated config; restartable on the same port."""

    def __init__(self, workdir: Path, extra_conf: str = "", port: int | None = None) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.conf = workdir / "mosquitto.conf"
        if extra_conf:
            self.conf.write_text(extra_conf)
        else:
            self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                                 "log_dest none\n")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> Mosquitto:
        self.proc = subprocess.Popen(["mosquitto", "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        end = time.monotonic() + timeout
        while not port_open("127.0.0.1", self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.proc.stderr.read().decode()[-500:]}")
            if time.monotonic() > end:
                raise RuntimeError("mosquitto did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def mosquitto(tmp_path):
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed")
    m = Mosquitto(tmp_path).start()
    yield m
    m.stop()


@pytest.fixture
def fed_name(request) -> str:
    """A federation name unique to this test run (topics neurofed/<name>/...)."""
    return f"t{uuid.uuid4().hex[:8]}-{request.node.name[:24]}".replace("[", "_").replace("]", "_")


def child_env(tmp_cache: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if tmp_cache is not None:
        env["NEUROFED_CACHE"] = str(tmp_cache)
    return env


def start_edge(url: str, fed: str, subject: int, state_dir: Path, log: Path, env: dict[str, str],
               max_seconds: float = 240) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "from neurofed.edge.cli import main; main()", "join", "--broker", url, "--client-id",
           f"S{subject:03d}", "--federation", fed, "--data-dir", str(DATA_DIR), "--subject", str(subject),
           "--state-dir", str(state_dir), "--max-seconds", str(max_seconds), "--keepalive", "5"]
    return subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env)


def start_coordinator(url: str, config: Path, out: Path, log: Path, env: dict[str, str],
                      resume: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "from neurofed.cli import main; main()", "coordinator", "--broker", url,
           "--config", str(config), "--out", str(out), "--keepalive", "5"] + (["--resume"] if resume else [])
    return subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env)


def write_toml(path: Path, fed: str, rounds: int = 3, fraction: float = 0.5, min_clients: int = 4,
               deadline: float = 60.0, strategy: str = "fedbs", local: str = "batch_size = 16\nlocal_epochs = 1",
               extra: str = "", federation_extra: str = "") -> Path:
    path.write_text(f"""[federation]
name = "{fed}"
rounds = {rounds}
fraction = {fraction}
seed = 7
min_clients = {min_clients}
join_timeout_s = 120
round_deadline_s = {deadline}
strategy = "{strategy}"
{federation_extra}
[preprocess]
channels = "sensorimotor21"
resample = 80.0

[local]
{local}
{extra}
""")
    return path


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int | None]:
    end = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    return [p.poll() for p in procs]


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


@pytest.fixture
def memory_broker(monkeypatch):
    """An in-memory broker (tests/broker/memory_broker.py) that the coordinator and the edge client reach by its
    ``url``: unit tests of the protocol code in one process. Never in integration tests (they run Mosquitto)."""
    from neurofed.broker import coordinator
    from neurofed.edge import federation
    from tests.broker.memory_broker import MemoryBroker, MemoryTransport

    broker = MemoryBroker()
    for mod in (coordinator, federation):  # the names they construct their transport by
        monkeypatch.setattr(mod, "MqttTransport", MemoryTransport)
    yield broker
    broker.close()


def wait_until(cond, timeout: float, what: str, poll: float = 0.02) -> None:
    """Poll ``cond()`` until it holds; fail naming ``what`` after ``timeout`` seconds (instead of a fixed sleep)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def settle(t, via: str, timeout: float = 10.0, drop_earlier: bool = False) -> None:
    """Return once the broker has processed every SUBSCRIBE ``t`` sent so far: ``t`` publishes a marker on
    ``via`` (a topic it may write and read) and waits for it to come back (the broker handles one connection's
    packets in order). Other messages that arrive meanwhile stay queued for the test (``drop_earlier``: are
    dropped, e.g. another client's marker that this one also reads)."""
    import uuid

    from tests.broker.memory_broker import topic_matches

    unsubscribe = not any(topic_matches(f, via) for f in t.subscriptions)  # else one copy comes back on that filter
    if unsubscribe:
        t.subscribe(via)
    marker, others = f"settle-{uuid.uuid4().hex}".encode(), []
    t.publish(via, marker, wait=timeout)
    end = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > end:
                raise AssertionError(f"{t.client_id}: its marker on {via} did not come back within {timeout:.0f} s")
            item = t.get(0.05)
            if item is None:
                continue
            if item.event == "message" and item.topic == via and item.payload == marker:
                break
            others.append(item)
    finally:
        for item in [] if drop_earlier else others:
            t.queue.put(item)
        if unsubscribe:
            t.unsubscribe(via)


def fence(t, topic: str, timeout: float = 10.0) -> None:
    """Return once the broker has processed what ``t``'s paho client sent before (e.g. an UNSUBSCRIBE sent
    behind the transport's back): a QoS-1 publish after it is acknowledged (one connection's packets in order)."""
    info = t._client.publish(topic, b"", qos=1)
    info.wait_for_publish(timeout)
    assert info.is_published(), f"{t.client_id}: no PUBACK within {timeout:.0f} s"


def wait_for_probe(t, timeout: float = 15.0, pump: bool = False) -> None:
    """Wait until an idle transport's liveness probe went out and came back (``probe_s`` of silence, then the
    probe: the only thing that arrives on an idle session moves its last-incoming time on by >= ``probe_s``).

    ``pump``: call ``t.get()`` meanwhile (which runs the probe check), for a transport nobody else polls;
    messages that arrive stay queued."""
    start, others = t._last_in, []

    def came_back() -> bool:
        if pump and (item := t.get(0.05)) is not None:
            others.append(item)
        return t._last_in - start >= t.probe_s and t._probe is None

    try:
        wait_until(came_back, timeout, f"{t.client_id}'s probe to go out and come back")
    finally:
        for item in others:
            t.queue.put(item)
