"""``edge-client record`` against a simulated headset: capture, kill -9, restart, train-ready data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from neurofed.edge.store import LocalStore
from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
from neurofed.firmware_sim.recording import load_recording
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS
from neurofed.trainer.data.io import epochs_from_raw, read_raw
from tests.lsl_support import unique_name

EDGE = [sys.executable, "-c", "from neurofed.edge.cli import main; main()"]


@pytest.fixture()
def headset(data_dir):
    path = data_dir / "eegmmidb" / "S001" / "S001R04.edf"
    cfg = PlayerConfig(name=unique_name("rec"), speed=10, loop=True, wait_consumers=30.0)
    p = HeadsetPlayer(load_recording(path, RUN_EVENT_LABELS[4]), cfg)
    p.start()
    yield cfg, path
    p.stop()
    p.join(timeout=10)


@pytest.mark.e2e
@pytest.mark.slow
def test_record_kill_restart_then_load(headset, tmp_path):
    cfg, path = headset
    store = tmp_path / "store"
    args = EDGE + ["record", "--stream", cfg.name, "--store", str(store), "--subject", "S001", "--duration", "60"]
    r = subprocess.run(args + ["--max-trials", "2"], capture_output=True, text=True, check=False, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "captured 2 trials" in r.stdout and len(LocalStore(store)) == 2
    # kill -9 in the middle of a capture: committed trials survive, the next run continues the store
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(LocalStore(store)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    st = LocalStore(store)
    assert len(st) >= 3 and st.verify() == []
    n = len(st)
    r = subprocess.run(args + ["--max-trials", "1"], capture_output=True, text=True, check=False, timeout=90)
    assert r.returncode == 0 and f"{n} trials already there" in r.stdout
    st = LocalStore(store)
    assert len(st) == n + 1 and [e["seq"] for e in st.entries] == sorted({e["seq"] for e in st.entries})
    # every stored raw trial is one of the recording's offline epochs, with its label
    x_off, labels = epochs_from_raw(read_raw(path), RUN_EVENT_LABELS[4], 0.0, 4.0)
    x, got_labels = st.raw_trials()
    for xi, lab in zip(x, got_labels):
        k = int(np.argmin(np.abs(x_off - xi).max(axis=(1, 2))))
        np.testing.assert_allclose(xi, x_off[k], atol=1e-4)
        assert labels[k] == lab
    sd = st.load_subject_data(PreprocessConfig())  # ready for the federation client
    assert sd.X.shape == (n + 1, 64, 640) and sd.classes == ("left_fist", "right_fist")


def test_record_errors_are_one_line(tmp_path):
    r = subprocess.run(EDGE + ["record", "--stream", unique_name("absent"), "--store", str(tmp_path / "s"),
                               "--resolve-timeout", "0.5"], capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: no LSL stream matching name='absent-")
    from typer.testing import CliRunner

    from neurofed.edge.cli import app
    from neurofed.trainer.errors import NeuroFedError

    res = CliRunner().invoke(app, ["record", "--store", str(tmp_path / "s")])
    assert isinstance(res.exception, NeuroFedError) and "give --stream NAME or --source-id" in str(res.exception)


@pytest.mark.slow
def test_record_on_a_full_disk_is_one_line_exit_2_and_keeps_the_stored_trials(headset, tmp_path):
    """Issue 54 (D4): `edge-client record` runs out of room (here the process's file size limit, `ulimit -f`, so
    its writes fail with EFBIG as on a full disk they fail with ENOSPC): one line naming the problem, exit 2,
    and the trials stored before are intact (no temp file or torn index line left)."""
    import resource

    cfg, _ = headset
    store = tmp_path / "store"
    args = EDGE + ["record", "--stream", cfg.name, "--store", str(store), "--subject", "S001", "--duration", "60"]
    r = subprocess.run(args + ["--max-trials", "2"], capture_output=True, text=True, check=False, timeout=90)
    assert r.returncode == 0, r.stderr
    index = (store / "index.jsonl").read_bytes()
    limit = 64 << 10  # a 64-channel trial file is ~160 kB: the next one cannot be written

    def small_files() -> None:  # in the child, before it runs the CLI
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run(args + ["--max-trials", "1"], capture_output=True, text=True, check=False, timeout=90,
                       preexec_fn=small_files)
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert "\n" not in err and "Traceback" not in r.stderr, r.stderr
    assert err.startswith(f"error: {store}: file size limit reached (File too large) storing trial 2; "
                          "the 2 trials already stored are intact"), err
    st = LocalStore(store)
    assert len(st) == 2 and st.verify() == [] and (store / "index.jsonl").read_bytes() == index
    assert sorted(p.name for p in (store / "trials").iterdir()) == ["000000.npz", "000001.npz"]
