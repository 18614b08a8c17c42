"""The no-EEG detector and the process supervisor, on real data and real processes (no broker needed)."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest
import torch

from neurofed.broker.protocol import ModelMsg, ModelSpec, encode
from neurofed.supervise import Supervisor
from neurofed.trainer.data import load_eegmmidb_subject
from neurofed.trainer.models import build_model
from neurofed.wiretap import EegFingerprint


@pytest.fixture(scope="module")
def trials(data_dir, small_cfg):
    return load_eegmmidb_subject(1, small_cfg, data_dir).X[:10]


@pytest.mark.unit
def test_fingerprint_finds_planted_eeg_but_not_weights(trials) -> None:
    fp = EegFingerprint([trials])
    rng = np.random.default_rng(1)
    # 6 consecutive samples of one channel, at an odd byte offset inside noise
    planted = rng.bytes(101) + trials[4, 7, 50:56].astype(np.float32).tobytes() + rng.bytes(99)
    assert fp.hits(planted) > 0
    # time-major order (as an LSL chunk would carry it)
    assert fp.hits(np.ascontiguousarray(trials[2, :, 30]).tobytes()) > 0
    assert fp.hits(rng.bytes(1 << 16)) == 0
    # a real model message (initial weights; BN scales of exactly 1) is clean
    torch.manual_seed(0)
    m = build_model("eegnet", trials.shape[1], 2, trials.shape[2], 80.0, "batch_specific")
    spec = ModelSpec(model="eegnet", n_channels=trials.shape[1], n_classes=2, n_times=trials.shape[2], sfreq=80.0,
                     bn_mode="batch_specific", ch_names=[f"c{i}" for i in range(trials.shape[1])],
                     classes=["left_fist", "right_fist"])
    payload = encode(ModelMsg(federation="t", sender="coordinator", round=0, meta=spec), m.state_dict())
    assert fp.hits(payload) == 0


def test_supervisor_stops_whole_process_group(tmp_path) -> None:
    sup = Supervisor(tmp_path, dict(os.environ))
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(p.pid, flush=True); time.sleep(60)")
    c = sup.start("sleeper", [sys.executable, "-c", code])
    end = time.monotonic() + 20
    while time.monotonic() < end and not c.log.read_text().splitlines()[1:]:
        time.sleep(0.05)
    grandchild = int(c.log.read_text().splitlines()[1])
    sup.stop_all()
    assert c.rc is not None
    end = time.monotonic() + 10  # its re-parent reaps it a moment later
    while not _gone(grandchild) and time.monotonic() < end:
        time.sleep(0.02)
    assert _gone(grandchild), "the grandchild outlived stop_all()"


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for its (re-)parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
