"""Live decoding in a real browser and in Node: ``headset-sim`` streams a real EEGMMIDB subject (S003, run 4) over
LSL, ``neurofed app serve --stream`` bridges it to a WebSocket, and the page (headless Chromium, onnxruntime-web)
and the Node app (onnxruntime-node) decode every cue window as it arrives. Their windows are the recording's cue
windows, their probabilities the Python standalone decoder's on the same windows (<= 1e-4); the latency from a
window's last sample reaching the bridge to the prediction is measured (p50/p99, written to the test's tmp dir)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from neurofed.export.apps import make_bundle, read_recording
from neurofed.export.decoder import StandaloneModel
from tests.lsl_support import configure_lsl, unique_name

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "apps" / "node"
N_CUES = 15  # S003R04: 15 imagery cues


@pytest.fixture(scope="module")
def bundle(eegnet_bs, tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("live-bundle")
    make_bundle(eegnet_bs[0], 3, out, data_dir)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"`neurofed app serve` ended early:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered:\n{log.read_text()}")


def _until(cond, timeout: float, what: str, poll: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def _python_probs(model: StandaloneModel, results: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """The app's windows (base64 from the app) through the Python standalone decoder, one carried state."""
    state, probs, wins = model.initial_state(), [], []
    for r in results:
        w = np.frombuffer(base64.b64decode(r["window_b64"]), "<f4").reshape(21, 640)
        p, state = model.run(w, state)
        probs.append(p.reshape(-1))
        wins.append(w)
    return np.array(probs), np.array(wins)


def _quantiles(xs) -> dict:
    a = np.asarray(xs, float)
    return {"n": len(a), "p50_ms": float(np.median(a)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max())}


@pytest.mark.timeout(420)  # export + a 31 s stream at 4x + page and Node start-up on a loaded 2-core machine
def test_live_page_and_node_decode_a_headset_sim_stream(bundle, browser, data_dir, tmp_path):
    configure_lsl()  # a private LSL session, inherited by headset-sim and the bridge (subprocesses)
    node = shutil.which("node")
    assert node and (NODE / "node_modules" / "ws").is_dir(), "run `npm ci` in apps/node (.ci/run does)"
    name, go = unique_name("live"), tmp_path / "go"
    port = _free_port()  # the bridge takes any free port (--ws-port 0) and tells the page: no race for a second one
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sim_log, srv_log = tmp_path / "sim.log", tmp_path / "serve.log"
    # the model is a signed release: the server, the page and Node each verify it against the public key
    from neurofed_runtime import release

    signed = tmp_path / "release"
    signed.mkdir()
    shutil.copyfile(bundle / "model.onnx", signed / "model.onnx")
    priv, pub = release.keygen(tmp_path / "keys")
    doc = release.sign((signed / "model.onnx").read_bytes(), release.load_private(priv), version=1)
    release.sig_path(signed / "model.onnx").write_text(json.dumps(doc))
    sim = subprocess.Popen(
        [sys.executable, "-m", "neurofed.firmware_sim.cli", "--subject", "3", "--runs", "4", "--name", name,
         "--speed", "4", "--wait-consumers", "120", "--go-file", str(go), "--data-dir", str(data_dir)],
        stdout=sim_log.open("w"), stderr=subprocess.STDOUT, env=env)
    srv = subprocess.Popen(
        [sys.executable, "-m", "neurofed.cli", "app", "serve", "--model", str(signed / "model.onnx"), "--stream",
         name, "--public-key", str(pub), "--port", str(port), "--ws-port", "0", "--timeout", "30", "--duration", "300",
         "--stats-out", str(tmp_path / "bridge.json")],
        stdout=srv_log.open("w"), stderr=subprocess.STDOUT, env=env)
    node_proc = None
    try:
        _wait_http(f"http://127.0.0.1:{port}/data/live.json", srv, srv_log)
        browser.get(f"http://127.0.0.1:{port}/live.html?keep=1")
        _until(lambda: browser.execute_script("return window.neurofed && window.neurofed.connected"), 60,
               "the page to connect to the bridge")
        node_proc = subprocess.Popen(
            [node, str(NODE / "live.mjs"), "--server", f"http://127.0.0.1:{port}", "--windows", str(N_CUES),
             "--keep", "--json", str(tmp_path / "node.json"), "--public-key", str(pub)],
            stdout=(tmp_path / "node.log").open("w"), stderr=subprocess.STDOUT)
        _until(lambda: srv_log.read_text().count("connected") >= 2, 60, "Node to connect to the bridge")
        go.touch()  # both apps are listening: the headset starts
        n = _until(lambda: browser.execute_script("const s = window.neurofed; return s.error ? -1 : "
                                                  f"(s.results.length >= {N_CUES} ? s.results.length : 0)"),
                   180, "the page to decode every cue")
        assert n == N_CUES, browser.execute_script("return window.neurofed.status")
        page = browser.execute_script("return window.neurofed.results")
        assert browser.execute_script("return window.neurofed.release && window.neurofed.release.version") == 1
        assert "signed release 1, verified" in browser.find_element("id", "model").text
        shot = tmp_path / "live.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        assert node_proc.wait(120) == 0, (tmp_path / "node.log").read_text()
        assert browser.find_element("id", "s-window").text == str(N_CUES)
        word = browser.find_element("id", "word").text
        acc_text = browser.find_element("id", "s-acc").text
    finally:
        if node_proc is not None and node_proc.poll() is None:
            node_proc.kill()
        srv.send_signal(signal.SIGINT)  # Ctrl-C: the bridge stops and writes its counts
        srv.wait(30)
        sim.wait(60)
    out = srv_log.read_text()
    assert srv.returncode == 0 and "Traceback" not in out, out
    assert "release 1 of" in out and "release 1 verified" in (tmp_path / "node.log").read_text()
    bridge = json.loads((tmp_path / "bridge.json").read_text())
    assert bridge["windows"] == N_CUES and bridge["garbage_messages"] == 0 and bridge["clients"] == 2
    assert bridge["predictions_reported"] == 2 * N_CUES  # both apps reported every prediction back

    model = StandaloneModel(bundle / "model.onnx")
    windows, doc = read_recording(bundle)
    assert doc["sessions"][0]["file"] == "S003R04.edf"
    cues = [doc["classes"][k] for k in doc["labels"][:N_CUES]]
    node_out = json.loads((tmp_path / "node.json").read_text())
    for app, res in (("page", page), ("node", node_out["results"])):
        assert [r["seq"] for r in res] == list(range(N_CUES)), app
        assert not any("rejected" in r for r in res), app
        assert [r["label"] for r in res] == cues, app
        ref, wins = _python_probs(model, res)
        # the live windows are the recording's cue windows (the bundle's, epoched offline from the same EDF)
        assert np.array_equal(wins, windows[:N_CUES]), app
        got = np.array([r["probs"] for r in res])
        assert np.abs(got - ref).max() <= 1e-4, (app, np.abs(got - ref).max())
        assert [r["pred"] for r in res] == list(ref.argmax(1)), app
    acc = float(np.mean([r["correct"] for r in page]))
    assert node_out["accuracy"] == pytest.approx(acc)
    assert acc_text.startswith(f"{100 * acc:.1f} %")
    assert word == page[-1]["pred_label"].replace("_", " ")
    latency = {"page": _quantiles([r["latency_ms"] for r in page]),
               "page_inference": _quantiles([r["infer_ms"] for r in page]),
               "node": _quantiles([r["latency_ms"] for r in node_out["results"]]),
               "node_inference": _quantiles([r["infer_ms"] for r in node_out["results"]]),
               "accuracy": acc, "subject": "S003", "run": 4, "speed": 4}
    (tmp_path / "latency.json").write_text(json.dumps(latency, indent=1))
    print(f"live latency (last sample at the bridge -> prediction): {json.dumps(latency)}")
    assert 0 < latency["page"]["p50_ms"] < 2000 and 0 < latency["node"]["p50_ms"] < 2000


@pytest.mark.timeout(120)
def test_live_page_says_when_the_bridge_is_unreachable(bundle, browser, tmp_path):
    """The page served without a bridge behind it (or the bridge gone): one error line on the page."""
    from neurofed.export.apps import packaged_web, serve

    data = tmp_path / "data"
    data.mkdir()
    for f in ("model.onnx", "model.json"):
        shutil.copyfile(bundle / f, data / f)
    dead = _free_port()
    (data / "live.json").write_text(json.dumps({"ws": f"ws://127.0.0.1:{dead}"}))
    port = _free_port()
    httpd = serve(packaged_web(), data, port=port)
    try:
        browser.get(f"http://127.0.0.1:{port}/live.html")
        err = _until(lambda: browser.execute_script("return window.neurofed && window.neurofed.error"), 60,
                     "the page's error")
        assert err == f"cannot reach the bridge at ws://127.0.0.1:{dead}"
        assert browser.find_element("id", "error").text == f"error: {err}"
        browser.get(f"http://127.0.0.1:{port}/live.html?ws=ws://127.0.0.1:{dead}/x")
        _until(lambda: browser.execute_script("return window.neurofed && window.neurofed.error"), 60, "error")
    finally:
        httpd.shutdown()
