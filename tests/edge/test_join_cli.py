"""`edge-client join`: clear errors, and a real federation round with a captured on-device store."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid

import numpy as np
import pytest

from neurofed.broker.config import config_from_dict
from neurofed.broker.coordinator import Coordinator

EDGE = [sys.executable, "-c", "from neurofed.edge.cli import main; main()", "join"]
URL = "mqtt://127.0.0.1:1883"


def _run(args, timeout=60):
    return subprocess.run(EDGE + args, check=False, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_needs_exactly_one_data_source():
    r = _run(["--broker", URL, "--client-id", "S001"])
    assert r.returncode == 2 and "either --store DIR or --subject N" in r.stderr
    assert "Traceback" not in r.stderr


def test_gives_up_clearly_without_a_coordinator(tmp_path, data_dir):
    fed = f"nocoord{uuid.uuid4().hex[:6]}"
    r = _run(["--broker", URL, "--client-id", "S001", "--federation", fed, "--data-dir", str(data_dir),
              "--subject", "1", "--state-dir", str(tmp_path), "--join-timeout", "1"])
    assert r.returncode == 2 and "no model from a coordinator" in r.stderr


def test_bad_client_id_is_refused(tmp_path, data_dir):
    r = _run(["--broker", URL, "--client-id", "a/b", "--data-dir", str(data_dir), "--subject", "1",
              "--state-dir", str(tmp_path)])
    assert r.returncode == 2 and "client id" in r.stderr


@pytest.mark.slow
def test_store_client_trains_in_a_federation(tmp_path, data_dir):
    """A client fed from a captured LocalStore and one from EEGMMIDB files complete a round together."""
    from neurofed.edge.capture import RawTrial
    from neurofed.edge.store import LocalStore
    from neurofed.trainer.data.config import PreprocessConfig
    from neurofed.trainer.data.eegmmidb import LR_IMAGERY_RUNS, RUN_EVENT_LABELS, subject_files
    from neurofed.trainer.data.io import epochs_from_raw, read_raw

    cfg = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
    store = LocalStore(tmp_path / "store", subject="S001", classes=("left_fist", "right_fist"))
    for p in subject_files(data_dir, 1, LR_IMAGERY_RUNS):
        raw = read_raw(p)
        x, labels = epochs_from_raw(raw, RUN_EVENT_LABELS[int(p.stem[-2:])], cfg.tmin, cfg.tmax)
        for xi, lab in zip(x, labels):
            store.append(RawTrial(xi.astype(np.float32), lab, 0.0, 160.0, list(raw.ch_names)))
    fed = f"store{uuid.uuid4().hex[:6]}"
    coord = Coordinator(config_from_dict({
        "federation": {"name": fed, "rounds": 1, "fraction": 1.0, "min_clients": 2, "round_deadline_s": 60},
        "local": {"batch_size": 16, "local_epochs": 1}, "output": {"dir": str(tmp_path / "out")}}), URL)
    ct = threading.Thread(target=coord.run)
    ct.start()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    common = ["--broker", URL, "--federation", fed, "--state-dir", str(tmp_path / "st"), "--max-seconds", "120"]
    procs = [subprocess.Popen(EDGE + common + ["--client-id", "S001", "--store", str(tmp_path / "store")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env),
             subprocess.Popen(EDGE + common + ["--client-id", "S002", "--data-dir", str(data_dir), "--subject", "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)]
    outs = [p.communicate(timeout=150)[0] for p in procs]
    ct.join(30)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "S001: trained 1 round(s); federation finished" in outs[0]
    assert coord.metrics[-1]["participants"] == ["S001", "S002"]
    assert (tmp_path / "out" / "global_model.safetensors").exists()
