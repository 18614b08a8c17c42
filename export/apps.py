"""App bundles: a standalone model and a real recording in files a browser or Node app reads.

``neurofed app bundle`` writes into one folder:

* ``model.onnx`` -- the standalone graph (``neurofed export --standalone``),
* ``model.json`` -- its NeuroFed metadata (the same JSON as in the ``.onnx``; JavaScript
  runtimes do not expose ONNX ``metadata_props``),
* ``recording.bin`` -- raw cue-locked windows, float32 little-endian, ``(n, channels, samples)``,
  channels in the model's order, in the device's unit,
* ``recording.json`` -- rate, unit, channels, window length, class names, the cue label of
  every window and which session (run file) it came from.

``neurofed app serve`` serves the page (``apps/web``, shipped in the package as ``neurofed/apps/web`` with the
onnxruntime-web files it loads) and a bundle on localhost: a static page, no build step. With ``--stream`` it
also starts the live bridge (:mod:`neurofed.edge.bridge`) and the page ``live.html`` decodes the stream.
"""

from __future__ import annotations

import functools
import http.server
import json
import logging
import os
import shutil
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from neurofed.export.decoder import StandaloneModel
from neurofed.export.standalone import eegmmidb_session_windows, export_standalone
from neurofed.trainer.errors import NeuroFedError

logger = logging.getLogger("neurofed.export")

RECORDING_FORMAT = "neurofed-recording/1"


def write_recording(
    out_dir: str | os.PathLike, windows: np.ndarray, labels: list[int], meta: Any, sessions: list[dict]
) -> Path:
    """Write ``recording.bin`` + ``recording.json`` for the standalone model described by ``meta``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sa = meta.standalone
    w = np.ascontiguousarray(windows, dtype="<f4")
    if w.ndim != 3 or w.shape[1:] != (meta.n_channels, sa["window_samples"]):
        raise NeuroFedError(
            f"recording windows {w.shape} do not fit the model ({meta.n_channels}, {sa['window_samples']})"
        )
    (out / "recording.bin").write_bytes(w.tobytes())
    doc = {
        "format": RECORDING_FORMAT,
        "dtype": "float32-le",
        "shape": list(w.shape),
        "rate": sa["rate"],
        "unit": sa["unit"],
        "ch_names": list(meta.ch_names),
        "window_samples": sa["window_samples"],
        "classes": list(meta.classes),
        "labels": [int(v) for v in labels],
        "sessions": sessions,
        # per session "trained_on": its file is in the model's data_hashes (null: the model does not say)
        "training_data_source": "model metadata (data_hashes)",
    }
    p = out / "recording.json"
    p.write_text(json.dumps(doc, indent=1))
    return p


def read_recording(folder: str | os.PathLike) -> tuple[np.ndarray, dict]:
    """``(windows, recording.json)`` of a bundle folder, with clear errors for a bad file."""
    folder = Path(folder)
    try:
        doc = json.loads((folder / "recording.json").read_text())
        if doc.get("format") != RECORDING_FORMAT:
            raise NeuroFedError(f"{folder}/recording.json: format {doc.get('format')!r}, expected {RECORDING_FORMAT}")
        raw = (folder / "recording.bin").read_bytes()
    except (OSError, json.JSONDecodeError) as exc:
        raise NeuroFedError(f"{folder}: not a NeuroFed recording ({exc})") from None
    shape = tuple(doc["shape"])
    if len(raw) != 4 * int(np.prod(shape)):
        raise NeuroFedError(f"{folder}/recording.bin has {len(raw)} bytes, expected 4 x {shape}")
    return np.frombuffer(raw, dtype="<f4").reshape(shape), doc


def make_bundle(
    checkpoint: str | os.PathLike, subject: int, out_dir: str | os.PathLike, data_dir: Any = None, rate: float = 160.0
) -> tuple[Path, Path]:
    """Standalone model + one EEGMMIDB subject's raw sessions into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta, _ = export_standalone(checkpoint, out / "model.onnx", rate)
    (out / "model.json").write_text(meta.model_dump_json(indent=1))
    sessions = eegmmidb_session_windows(subject, list(meta.ch_names), list(meta.classes), *meta.window, data_dir)
    if any(abs(r - rate) > 1e-9 for *_, r in sessions):
        raise NeuroFedError(f"S{subject:03d} is recorded at {sessions[0][3]} Hz, the model was exported for {rate} Hz")
    windows = np.concatenate([w for _, w, _, _ in sessions])
    labels = [int(v) for _, _, y, _ in sessions for v in y]
    # a recording whose file is in the model's data_hashes was training data: scores on it are not accuracy
    known = bool(meta.data_hashes)
    info = [{"file": f, "subject": f"S{subject:03d}", "windows": len(w),
             "trained_on": (f in meta.data_hashes) if known else None} for f, w, _, _ in sessions]
    if any(i["trained_on"] for i in info):
        logger.warning("S%03d: the model was trained on these recordings (its data_hashes): the bundle's accuracy "
                       "is a training-set score", subject)
    return out / "model.onnx", write_recording(out, windows, labels, meta, info)


def python_replay(folder: str | os.PathLike) -> np.ndarray:
    """Probabilities of every window of a bundle's recording through the standalone model (Python)."""
    folder = Path(folder)
    model = StandaloneModel(folder / "model.onnx")
    windows, _ = read_recording(folder)
    state, out = model.initial_state(), []
    for w in windows:
        p, state = model.run(w, state)
        out.append(p)
    return np.array(out)


#: Where the page loads onnxruntime-web from (URL path); served from :func:`ort_dist`.
ORT_URL = "/node_modules/onnxruntime-web/dist/"
#: The onnxruntime-web files the pages use (the plain WASM build; a wheel ships these, see pyproject.toml).
ORT_FILES = ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")


def packaged_web() -> Path:
    """The browser app's folder: ``neurofed/apps/web`` of the installed package (``apps/web`` in a checkout)."""
    import importlib.resources

    return Path(str(importlib.resources.files("neurofed.apps") / "web"))


def packaged_node() -> Path:
    """The Node apps' folder (``apps/node`` in a checkout); they import ``../web/neurofed.mjs``."""
    return packaged_web().parent / "node"


def ort_dist(web: str | os.PathLike | None = None) -> Path:
    """onnxruntime-web's ``dist`` folder: ``$NEUROFED_ORT_WEB``, else ``WEB/node_modules/onnxruntime-web/dist``."""
    env = os.environ.get("NEUROFED_ORT_WEB")
    base = Path(web) if web is not None else packaged_web()
    dist = Path(env) if env else base / "node_modules" / "onnxruntime-web" / "dist"
    missing = [f for f in ORT_FILES if not (dist / f).is_file()]
    if missing:
        raise NeuroFedError(
            f"{dist}: onnxruntime-web is missing ({', '.join(missing)}); run `npm ci` in apps/web "
            "(a checkout), or point $NEUROFED_ORT_WEB at an onnxruntime-web 1.30 dist folder")
    return dist


def live_data(model: str | os.PathLike, out_dir: str | os.PathLike, ws_url: str) -> tuple[Path, Any]:
    """``model.onnx``, ``model.json`` and ``live.json`` (the bridge's address) for the live page in ``out_dir``;
    ``model.onnx.sig`` too when the model is a signed release (``MODEL.onnx.sig`` beside it).

    The model is loaded once (:class:`StandaloneModel`: metadata validated, graph opened), so a bad file is
    refused here in one line rather than in the page. Returns ``(out_dir, metadata)``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sm = StandaloneModel(model)
    shutil.copyfile(model, out / "model.onnx")
    sig = Path(f"{model}.sig")  # a signed release's detached signature travels with it (docs/security.md)
    if sig.is_file():
        shutil.copyfile(sig, out / "model.onnx.sig")
    (out / "model.json").write_text(sm.meta.model_dump_json(indent=1))
    write_live_address(out, ws_url)
    return out, sm.meta


def write_live_address(out_dir: str | os.PathLike, ws_url: str) -> None:
    """``live.json``: the bridge's WebSocket address, which the live page and the Node app read first."""
    (Path(out_dir) / "live.json").write_text(json.dumps({"ws": ws_url}))


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files of the page; ``/data/`` from the data folder, onnxruntime-web from :func:`ort_dist`.

    Every response is cross-origin isolated (COOP/COEP): onnxruntime-web's multi-threaded WASM needs
    ``SharedArrayBuffer``, which browsers give only to isolated pages.
    """

    data_dir: Path | None = None
    ort_dir: Path | None = None
    extensions_map: ClassVar[dict[str, str]] = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
        ".onnx": "application/octet-stream",
        ".bin": "application/octet-stream",
    }

    def translate_path(self, path: str) -> str:
        clean = urllib.parse.unquote(path.split("?", 1)[0].split("#", 1)[0])
        for prefix, root in (("/data/", self.data_dir), (ORT_URL, self.ort_dir)):
            if root is not None and clean.startswith(prefix):
                rel = Path(clean[len(prefix):])
                if ".." in rel.parts:
                    return str(root / "__refused__")
                return str(root / rel)
        return super().translate_path(path)

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: one debug line per request
        logger.debug("http %s", fmt % args)


class _Server(http.server.ThreadingHTTPServer):
    """The page's server: a request that fails is one log line, never a traceback on stderr (a browser or a health
    check that hangs up mid-response, e.g. an aborted model download, is routine: a debug line)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        who = ":".join(map(str, client_address[:2])) if isinstance(client_address, tuple) else str(client_address)
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)):
            logger.debug("http client %s hung up mid-response (%s)", who, type(exc).__name__)
        else:
            logger.warning("http request from %s failed: %s: %s", who, type(exc).__name__, exc)


def serve(web_dir: str | os.PathLike | None, bundle: str | os.PathLike | None, host: str = "127.0.0.1",
          port: int = 8765, ready: threading.Event | None = None) -> http.server.ThreadingHTTPServer:
    """A static server of the page (``web_dir``, default: the installed app) with ``bundle`` as ``data/``.

    Nothing is copied: ``/data/`` is served from ``bundle`` (default ``WEB/data``) and onnxruntime-web from
    :func:`ort_dist`. A busy port is refused in one line. Returns the server, started (a daemon thread).
    """
    web = Path(web_dir) if web_dir is not None else packaged_web()
    if not (web / "index.html").is_file():
        raise NeuroFedError(f"{web}: no index.html (point --web at apps/web)")
    data = Path(bundle) if bundle is not None else web / "data"
    if bundle is not None:
        if not Path(bundle).is_dir():
            raise NeuroFedError(f"{bundle}: no such folder; write a bundle with `neurofed app bundle`")
        for name in ("model.onnx", "model.json"):
            if not (data / name).is_file():
                raise NeuroFedError(f"{bundle}: missing {name}; write it with `neurofed app bundle`")
    handler = type("Handler", (_Handler,), {"data_dir": data, "ort_dir": ort_dist(web)})
    try:
        httpd = _Server((host, port), functools.partial(handler, directory=str(web)))
    except OSError as exc:
        raise NeuroFedError(f"cannot serve the page on {host}:{port}: {exc.strerror or exc} "
                            "(port busy? choose another with --port)") from None
    threading.Thread(target=httpd.serve_forever, daemon=True, name="neurofed-web").start()
    if ready is not None:
        ready.set()
    return httpd
