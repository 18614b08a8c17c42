"""neurofed-runtime alone: a fresh venv (no system site packages) with only ``pip install runtime/`` (numpy and
onnxruntime from the package index or pip's cache) has no torch, and decodes a real recording (S003's three
left/right-fist imagery sessions) exactly as the main package does (<= 1e-5)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest

from neurofed.edge.infer import InferenceEngine, StandaloneStep
from neurofed.export.decoder import StandaloneModel
from neurofed.export.standalone import eegmmidb_session_windows

ROOT = Path(__file__).resolve().parents[2]
SUBJECT = 3  # held out: the fixture model trained on S001-S002

DECODE = """
import sys
import numpy as np
from neurofed_runtime import Decoder
dec = Decoder.load(sys.argv[1])
probs = []
for path in sys.argv[3:]:
    dec.reset()  # one session per recording
    for w in np.load(path):
        probs.append(dec.decode(w).probs)
np.save(sys.argv[2], np.array(probs))
print(len(probs), "windows")
"""


@pytest.mark.timeout(900)  # creating a venv and installing numpy + onnxruntime into it takes minutes under load
def test_runtime_alone_in_a_fresh_venv_decodes_a_real_recording(standalone_model, data_dir, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False, clear=True)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    r = subprocess.run([py, "-m", "pip", "install", "-q", str(ROOT / "runtime")], capture_output=True, text=True,
                       timeout=800, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([py, "-c", "import torch"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 1 and "No module named 'torch'" in r.stderr
    r = subprocess.run([py, "-c", "import neurofed"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 1 and "No module named 'neurofed'" in r.stderr
    listed = subprocess.run([py, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, env=env)
    names = {ln.split("==")[0].lower() for ln in listed.stdout.splitlines()}
    assert {"neurofed-runtime", "numpy", "onnxruntime"} <= names and not names & {"torch", "onnx", "scipy", "mne"}

    # the recording, as a device would send it: raw windows in microvolts, the model's channels (.npy)
    m = StandaloneModel(standalone_model)
    sessions = eegmmidb_session_windows(SUBJECT, list(m.meta.ch_names), list(m.meta.classes), 0.0, 4.0, data_dir)
    files = []
    for run, ws, _, rate in sessions:
        assert rate == 160.0
        files.append(tmp_path / f"{Path(run).stem}.npy")
        np.save(files[-1], ws.astype(np.float32))
    out = tmp_path / "probs.npy"
    r = subprocess.run([py, "-c", DECODE, str(standalone_model), str(out), *map(str, files)], capture_output=True,
                       text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = np.load(out)

    # the main package: edge-client infer's engine with the standalone step, session by session
    want = []
    for _, ws, _, _ in sessions:
        eng = InferenceEngine(m, m.meta.ch_names, 160.0, decoder=StandaloneStep(m, 160.0))
        want += [eng.process(w.astype(np.float32), 0.0).probabilities for w in ws]
    want = np.array(want)
    assert got.shape == want.shape == (45, 2)
    assert np.abs(got - want).max() <= 1e-5
    assert sys.executable != str(py)
