"""Apps: the Node script (onnxruntime-node) and the browser page (onnxruntime-web in a real headless
Chromium) give the Python standalone decoder's probabilities on a real recording, and refuse bad input
clearly. Node, npm packages and Chromium are installed by .ci/run; missing ones FAIL these tests."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from neurofed.export.apps import make_bundle, python_replay, read_recording, serve
from neurofed.trainer.errors import NeuroFedError

ROOT = Path(__file__).resolve().parents[2]
WEB, NODE = ROOT / "apps" / "web", ROOT / "apps" / "node"

# The same checks run in Node and in the page, on a real window of the recording.
BAD_INPUT_JS = """
const errs = {};
const s0 = dec.initialState();
const n = dec.nSamples;
const grab = async (key, f) => { try { await f(); errs[key] = null; } catch (e) { errs[key] = `${e.name}: ${e.message}`; } };
await grab("shape", () => dec.run(new Float32Array(10), s0));
const other = s0.slice(); other[0] += 1;
await grab("state", () => dec.run(w, other));
const nan = w.slice(); nan[3 * n + 5] = NaN;
await grab("nan", () => dec.run(nan, s0));
const flat = w.slice(); flat.fill(5, 0, n);
await grab("flat", () => dec.run(flat, s0));
const sat = w.slice(); sat.fill(4000, 10 * n, 10 * n + 100);
await grab("saturated", () => dec.run(sat, s0));
await grab("rate", () => dec.checkStream({ ch_names: dec.meta.ch_names, rate: 250, unit: dec.sa.unit }));
"""


def _check_bad_input(errs: dict) -> None:
    assert "window is 10 samples, expected a Float32Array of 21 channels x 640 samples (4 s at 160 Hz" in errs["shape"]
    assert "state belongs to another model" in errs["state"]
    assert errs["nan"] == "WindowRejected: non-finite channel FCz"
    assert errs["flat"] == "WindowRejected: flat channel FC5"
    assert errs["saturated"] == "WindowRejected: saturated channel Cz"
    assert "stream rate 250 Hz, but this model was exported for 160 Hz" in errs["rate"]


@pytest.fixture(scope="module")
def bundle(eegnet_bs, tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("bundle")
    make_bundle(eegnet_bs[0], 3, out, data_dir)
    return out


@pytest.fixture(scope="module")
def python_probs(bundle):
    return python_replay(bundle)


@pytest.mark.unit
def test_recording_roundtrip_and_bad_file(bundle, tmp_path):
    w, doc = read_recording(bundle)
    assert w.shape == (45, 21, 640) and len(doc["labels"]) == 45 and doc["rate"] == 160.0
    (tmp_path / "recording.json").write_text((bundle / "recording.json").read_text())
    (tmp_path / "recording.bin").write_bytes((bundle / "recording.bin").read_bytes()[:-4])
    with pytest.raises(NeuroFedError, match="recording.bin has .* bytes"):
        read_recording(tmp_path)


def _node() -> str:
    node = shutil.which("node")
    assert node, "node is not installed (.ci/run installs nodejs)"
    assert (NODE / "node_modules" / "onnxruntime-node").is_dir(), "run `npm ci` in apps/node (.ci/run does)"
    return node


def test_node_replay_equals_python(bundle, python_probs, tmp_path):
    out = tmp_path / "node.json"
    r = subprocess.run([_node(), str(NODE / "replay.mjs"), "--bundle", str(bundle), "--json", str(out)],
                       check=False, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = np.array(json.loads(out.read_text())["probs"])
    assert got.shape == python_probs.shape
    assert np.abs(got - python_probs).max() <= 1e-4 and (got.argmax(1) == python_probs.argmax(1)).all()


def test_node_bad_input(bundle, tmp_path):
    script = tmp_path / "bad.mjs"
    script.write_text(
        f"""import {{ readFileSync }} from "node:fs";
import * as ort from "{NODE / 'node_modules' / 'onnxruntime-node' / 'dist' / 'index.js'}";
import {{ StandaloneDecoder, recordingWindows }} from "{WEB / 'neurofed.mjs'}";
const meta = JSON.parse(readFileSync("{bundle / 'model.json'}", "utf8"));
const doc = JSON.parse(readFileSync("{bundle / 'recording.json'}", "utf8"));
const dec = await StandaloneDecoder.create(ort, "{bundle / 'model.onnx'}", meta, ["cpu"]);
const w = recordingWindows(doc, readFileSync("{bundle / 'recording.bin'}"))[0];
{BAD_INPUT_JS}
console.log(JSON.stringify(errs));
""")
    r = subprocess.run([_node(), str(script)], check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    _check_bad_input(json.loads(r.stdout.strip().splitlines()[-1]))
    # a broken bundle: one error line, exit 2
    bad = tmp_path / "broken"
    shutil.copytree(bundle, bad)
    (bad / "recording.bin").write_bytes(bytes(12))
    r = subprocess.run([_node(), str(NODE / "replay.mjs"), "--bundle", str(bad)], check=False, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == "error: recording.bin has 12 bytes, expected 4 x 45 x 21 x 640"


@pytest.fixture(scope="module")
def signed(bundle, tmp_path_factory):
    """(bundle with model.onnx.sig of release 1, its public key, another key's public key)."""
    from neurofed_runtime import release

    keys = tmp_path_factory.mktemp("keys")
    priv, pub = release.keygen(keys)
    _, other = release.keygen(keys, "other")
    out = tmp_path_factory.mktemp("signed")
    shutil.copytree(bundle, out, dirs_exist_ok=True)
    doc = release.sign((out / "model.onnx").read_bytes(), release.load_private(priv), version=1)
    release.sig_path(out / "model.onnx").write_text(json.dumps(doc))
    return out, pub, other


def test_node_verifies_a_signed_release_and_refuses_others(signed, tmp_path):
    """The Node app checks the Python-signed release (Ed25519, WebCrypto) before it loads the model."""
    out, pub, other = signed

    def replay(bundle_dir, key):
        return subprocess.run([_node(), str(NODE / "replay.mjs"), "--bundle", str(bundle_dir), "--public-key", str(key)],
                              check=False, capture_output=True, text=True, timeout=120)

    r = replay(out, pub)
    assert r.returncode == 0, r.stderr
    assert "release 1 verified" in r.stdout and "accuracy" in r.stdout
    r = replay(out, other)  # a release key that did not sign it
    assert r.returncode == 2 and r.stderr.strip().startswith("error: bad signature"), r.stderr
    tampered = tmp_path / "tampered"
    shutil.copytree(out, tampered)
    data = bytearray((tampered / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tampered / "model.onnx").write_bytes(bytes(data))
    r = replay(tampered, pub)
    assert r.returncode == 2 and "sha256 mismatch" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    (tampered / "model.onnx.sig").unlink()
    r = replay(tampered, pub)
    assert r.returncode == 2 and "no signature (an unsigned model is refused" in r.stderr, r.stderr


def test_app_serve_refuses_an_unsigned_model_with_a_key(bundle, signed, tmp_path):
    _, pub, _ = signed
    r = subprocess.run(["neurofed", "app", "serve", "--stream", "nf-unsigned-never-streams", "--model",
                        str(bundle / "model.onnx"), "--public-key", str(pub), "--port", str(_free_port())],
                       check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "signature file not found (an unsigned model is refused)" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_done(d, timeout: float = 240.0) -> dict:
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        st = d.execute_script("return window.neurofed ? {done: window.neurofed.done, error: window.neurofed.error} : null")
        if st and st["done"]:
            return st
        time.sleep(0.2)
    raise AssertionError("the page did not finish")


def test_browser_replay_equals_python(bundle, python_probs, browser, signed, tmp_path):
    assert (WEB / "node_modules" / "onnxruntime-web" / "dist").is_dir(), "run `npm ci` in apps/web (.ci/run does)"
    port = _free_port()
    web = tmp_path / "web"  # a private copy of the page: parallel runs never share data/
    shutil.copytree(WEB, web, ignore=shutil.ignore_patterns("node_modules", "data"))
    (web / "node_modules").symlink_to(WEB / "node_modules")
    httpd = serve(web, bundle, port=port)
    try:
        browser.get(f"http://127.0.0.1:{port}/index.html?speed=0")
        st = _wait_done(browser)
        assert st["error"] is None, st["error"]
        res = browser.execute_script("return window.neurofed.results")
        got = np.array([r["probs"] for r in res])
        assert got.shape == python_probs.shape
        assert np.abs(got - python_probs).max() <= 1e-4 and (got.argmax(1) == python_probs.argmax(1)).all()
        text = browser.find_element("id", "s-window").text
        assert text == "45 / 45"
        shot = tmp_path / "web.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        errs = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "(async () => { const dec = window.neurofed.decoder; const w = window.neurofed.windows[0];"
            + BAD_INPUT_JS + " return errs; })().then(done, (e) => done({fatal: e.message}));"
        )
        _check_bad_input(errs)
        # the page's verifier (WebCrypto Ed25519 in Chromium) accepts the Python-signed release, refuses another key
        out, pub, other = signed
        got = browser.execute_async_script(
            "const [sig, pub, other, done] = arguments;"
            "(async () => { const m = await import('./neurofed.mjs');"
            " const model = new Uint8Array(await (await fetch('data/model.onnx')).arrayBuffer());"
            " const h = await m.verifyRelease(model, sig, await m.importReleaseKey(pub), window.neurofed.decoder.meta);"
            " let refused = null;"
            " try { await m.verifyRelease(model, sig, await m.importReleaseKey(other)); } catch (e) { refused = e.message; }"
            " return {version: h.version, refused}; })().then(done, (e) => done({fatal: e.message}));",
            (out / "model.onnx.sig").read_text(), pub.read_text(), other.read_text())
        assert got.get("version") == 1 and got["refused"].startswith("bad signature"), got
        browser.get(f"http://127.0.0.1:{port}/index.html?speed=0&data=nothing")
        st = _wait_done(browser)
        assert "nothing/model.json: HTTP 404" in st["error"]
        assert "error: nothing/model.json: HTTP 404" in browser.find_element("id", "error").text
    finally:
        httpd.shutdown()


@pytest.mark.integration
def test_a_client_hanging_up_mid_download_is_no_traceback(tmp_path, capfd, caplog):
    """A browser that aborts the model download (connection reset mid-response) costs a debug line, never a
    traceback on stderr (`neurofed app serve` would print one per aborted request).

    The served file is 32 MB, more than loopback's socket buffers hold, so the server is still writing when the
    reset arrives (a small model could be written whole into the buffers first, and no write would fail)."""
    import logging
    import struct

    from neurofed.export.apps import packaged_web

    (tmp_path / "model.onnx").write_bytes(b"\0" * (32 << 20))
    (tmp_path / "model.json").write_text("{}")  # serve() checks a bundle's two files exist, nothing more
    port = _free_port()
    httpd = serve(packaged_web(), tmp_path, port=port)
    try:
        with caplog.at_level(logging.DEBUG, logger="neurofed.export"):
            for _ in range(3):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"GET /data/model.onnx HTTP/1.1\r\nHost: x\r\n\r\n")
                s.recv(1024)  # the response has begun
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()  # RST: the server's next writes fail
            end = time.monotonic() + 10
            while time.monotonic() < end and not any("hung up" in r.message for r in caplog.records):
                time.sleep(0.05)
        assert any("hung up mid-response" in r.message for r in caplog.records)
        assert "Traceback" not in capfd.readouterr().err
    finally:
        httpd.shutdown()
