"""``neurofed app serve`` from a wheel installed outside the checkout: the pages, the Node scripts and the
onnxruntime-web files ship as package data (neurofed/apps), served cross-origin isolated; a busy port, a missing
model or stream are one line and exit 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest

from neurofed.export.apps import ORT_FILES

ROOT = Path(__file__).resolve().parents[2]
ORT = "neurofed/apps/web/node_modules/onnxruntime-web/dist/"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, Any, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, b""


@pytest.fixture(scope="module")
def installed(tmp_path_factory, request) -> tuple[Path, dict]:
    """The wheel of this checkout, installed (no deps) into a folder of its own; an environment that imports
    NeuroFed from there, from a working directory outside the checkout."""
    assert all((ROOT / "apps/web/node_modules/onnxruntime-web/dist" / f).is_file() for f in ORT_FILES), \
        "run `npm ci` in apps/web before building a wheel (.ci/run does)"
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = request.getfixturevalue("neurofed_wheel")  # after the check above: the wheel must hold the ORT files
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in ("neurofed/apps/__init__.py", "neurofed/apps/web/index.html", "neurofed/apps/web/live.html",
                 "neurofed/apps/web/live.mjs", "neurofed/apps/web/app.mjs", "neurofed/apps/web/neurofed.mjs",
                 "neurofed/apps/node/live.mjs", "neurofed/apps/node/replay.mjs", "neurofed/apps/node/package.json",
                 "neurofed/apps/node/package-lock.json", *(ORT + f for f in ORT_FILES)):
        assert must in names, must
    # only the three onnxruntime-web files the pages load (14 MB), no other npm package, no recording
    assert not [n for n in names if "node_modules" in n and not n.startswith(ORT) and not n.endswith("package.json")]
    assert not [n for n in names if "/data/" in n and n.startswith("neurofed/apps/")]
    target = tmp / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NEUROFED_ORT_WEB")}
    env["PYTHONPATH"] = str(target)  # ahead of the editable install of this checkout
    work = tmp / "elsewhere"
    work.mkdir()
    return work, env


def _cli(installed, *args: str, **kw) -> subprocess.CompletedProcess:
    work, env = installed
    return subprocess.run([sys.executable, "-m", "neurofed.cli", *args], cwd=work, env=env, capture_output=True,
                          text=True, **kw)


def test_serve_from_the_installed_package(installed):
    work, env = installed
    r = _cli(installed, "app", "path", "web", timeout=120)
    assert r.returncode == 0 and r.stdout.strip().startswith(env["PYTHONPATH"]), r.stdout + r.stderr
    assert not r.stdout.strip().startswith(str(ROOT))
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "neurofed.cli", "app", "serve", "--port", str(port),
                             "--duration", "120"], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 90
        while time.monotonic() < end:
            try:
                status, headers, body = _get(f"http://127.0.0.1:{port}/index.html")
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.2)
        assert status == 200 and b"NeuroFed" in body
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        for page in ("live.html", "live.mjs", "neurofed.mjs", "app.mjs"):
            assert _get(f"http://127.0.0.1:{port}/{page}")[0] == 200, page
        status, headers, body = _get(f"http://127.0.0.1:{port}/node_modules/onnxruntime-web/dist/"
                                     "ort-wasm-simd-threaded.wasm")
        assert status == 200 and headers["Content-Type"] == "application/wasm" and body[:4] == b"\0asm"
        assert _get(f"http://127.0.0.1:{port}/node_modules/onnxruntime-web/dist/ort.wasm.min.js")[0] == 200
        assert _get(f"http://127.0.0.1:{port}/data/%2e%2e/index.html")[0] == 404  # no way out of data/
        # the same port again: one line, exit 2
        r = _cli(installed, "app", "serve", "--port", str(port), "--duration", "1", timeout=120)
        assert r.returncode == 2 and r.stderr.strip() == (
            f"error: cannot serve the page on 127.0.0.1:{port}: Address already in use "
            "(port busy? choose another with --port)"), r.stderr
        assert "Traceback" not in r.stderr
    finally:
        proc.terminate()
        proc.wait(30)


def test_live_serve_bad_model_and_missing_stream_are_one_line(installed, tmp_path):
    r = _cli(installed, "app", "serve", "--stream", "x", timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --stream needs the model: --model FILE.onnx (a standalone export) or --bundle DIR"), r.stderr
    r = _cli(installed, "app", "serve", "--stream", "x", "--model", str(tmp_path / "none.onnx"), timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == f"error: {tmp_path / 'none.onnx'}: no such model file"
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    r = _cli(installed, "app", "serve", "--stream", "x", "--model", str(bad), timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and str(bad) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
