"""The Node app follows signed releases over a real Mosquitto (``node apps/node/replay.mjs --follow``; the library
half is ``ReleaseFollower`` / ``carryState`` in apps/web/neurofed.mjs): replaying a real recording with signed release
1, it refuses a forged release retained on the topic, swaps to genuine release 2 published mid-replay between two
windows (every window decoded once), and from the swap on gives what release 2 gives decoding the session from its
start in Python (the alignment statistics and BN context carried, <= 1e-4)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from neurofed_runtime import release as rel

from neurofed.export.apps import make_bundle, read_recording
from neurofed.export.decoder import StandaloneModel
from tests.broker.conftest import Mosquitto
from tests.release_support import payload, publish_retained

NODE = Path(__file__).resolve().parents[2] / "apps" / "node"


@pytest.fixture(scope="module")
def unsigned_bundle(eegnet_bs, tmp_path_factory, data_dir) -> Path:
    """The app bundle of S003's recording with the standalone graph of release 1 (not yet signed)."""
    out = tmp_path_factory.mktemp("follow-bundle")
    make_bundle(eegnet_bs[0], 3, out, data_dir)
    return out




def _python(model_path: Path, windows: np.ndarray) -> np.ndarray:
    m = StandaloneModel(model_path)
    state, out = m.initial_state(), []
    for w in windows:
        p, state = m.run(w, state)
        out.append(np.asarray(p).reshape(-1))
    return np.array(out)


def test_node_follows_releases_over_mosquitto(unsigned_bundle, release_models, release_keys, tmp_path):
    node = shutil.which("node")
    assert node and (NODE / "node_modules" / "mqtt").is_dir(), "run `npm ci` in apps/node (.ci/run does)"
    a, b = release_models
    bundle = tmp_path / "bundle"
    shutil.copytree(unsigned_bundle, bundle)
    model = (bundle / "model.onnx").read_bytes()
    assert model == a.read_bytes()  # the bundle's graph is release 1 (the same export)
    rel.sig_path(bundle / "model.onnx").write_text(json.dumps(rel.sign(model, rel.load_private(release_keys[0][0]), 1)))
    broker = Mosquitto(tmp_path).start()
    fed = f"appfollow{time.monotonic_ns() % 10**8}"
    topic = f"neurofed/{fed}/release"
    log = tmp_path / "node.log"
    try:
        publish_retained(broker.port, topic, payload(b, release_keys, 2, 1, forged=True))  # retained: arrives on subscribe
        proc = subprocess.Popen(
            [node, str(NODE / "replay.mjs"), "--bundle", str(bundle), "--public-key", str(release_keys[0][1]),
             "--follow", "--broker", f"mqtt://127.0.0.1:{broker.port}", "--federation", fed, "--interval-ms", "100",
             "--json", str(tmp_path / "out.json")], stdout=log.open("w"), stderr=subprocess.STDOUT)
        end = time.monotonic() + 90
        while "window 4/" not in log.read_text() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        assert "window 4/" in log.read_text(), log.read_text()
        publish_retained(broker.port, topic, payload(b, release_keys, 2, 1))  # the genuine release 2, mid-replay
        assert proc.wait(120) == 0, log.read_text()
    finally:
        broker.stop()
    out = json.loads((tmp_path / "out.json").read_text())
    windows, _ = read_recording(bundle)
    n = len(windows)
    versions = out["versions"]
    k = versions.index(2)
    assert len(versions) == len(out["probs"]) == n and versions == [1] * k + [2] * (n - k) and 4 <= k < n
    assert len(out["refused"]) == 1 and "bad signature" in out["refused"][0], out["refused"]
    assert out["accepted"] == [2] and [(s["previous"], s["version"]) for s in out["swaps"]] == [(1, 2)]
    got = np.array(out["probs"])
    ref_a, ref_b = _python(a, windows), _python(b, windows)
    assert np.abs(got[:k] - ref_a[:k]).max() <= 1e-4
    assert np.abs(got[k:] - ref_b[k:]).max() <= 1e-4, np.abs(got[k:] - ref_b[k:]).max()  # as if from the start
    assert np.abs(ref_b[k] - _python(b, windows[k:k + 1])[0]).max() > 1e-4  # a fresh state would differ
    assert "swapped to release 2 (was 1)" in log.read_text()


def test_node_follow_needs_its_key_and_broker(unsigned_bundle):
    node = shutil.which("node")
    r = subprocess.run([node, str(NODE / "replay.mjs"), "--bundle", str(unsigned_bundle), "--follow"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: --follow needs --public-key (the federation's release key), --broker and --federation"]
