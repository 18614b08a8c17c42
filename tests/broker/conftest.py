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
               extra: str = "") -> Path:
    path.write_text(f"""[federation]
name = "{fed}"
rounds = {rounds}
fraction = {fraction}
seed = 7
min_clients = {min_clients}
join_timeout_s = 120
round_deadline_s = {deadline}
strategy = "{strategy}"

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
