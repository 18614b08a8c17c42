"""App bundles: a standalone model and a real recording in files a browser or Node app reads.

``neurofed app bundle`` writes into one folder:

* ``model.onnx`` -- the standalone graph (``neurofed export --standalone``),
* ``model.json`` -- its NeuroFed metadata (the same JSON as in the ``.onnx``; JavaScript
  runtimes do not expose ONNX ``metadata_props``),
* ``recording.bin`` -- raw cue-locked windows, float32 little-endian, ``(n, channels, samples)``,
  channels in the model's order, in the device's unit,
* ``recording.json`` -- rate, unit, channels, window length, class names, the cue label of
  every window and which session (run file) it came from.

``neurofed app serve`` serves ``apps/web`` (the page, ``node_modules/onnxruntime-web``) and a
bundle on localhost: a static page, no build step.
"""

from __future__ import annotations

import functools
import http.server
import json
import logging
import os
import shutil
import threading
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


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map: ClassVar[dict[str, str]] = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
        ".onnx": "application/octet-stream",
        ".bin": "application/octet-stream",
    }

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: one debug line per request
        logger.debug("http %s", fmt % args)


def serve(web_dir: str | os.PathLike, bundle: str | os.PathLike | None, host: str = "127.0.0.1", port: int = 8765,
          ready: threading.Event | None = None) -> http.server.ThreadingHTTPServer:
    """A static server of ``web_dir`` (the page) with ``bundle`` copied to ``web_dir/data``; returns it started."""
    web = Path(web_dir)
    if not (web / "index.html").is_file():
        raise NeuroFedError(f"{web}: no index.html (point --web at apps/web)")
    if not (web / "node_modules" / "onnxruntime-web" / "dist").is_dir():
        raise NeuroFedError(f"{web}: onnxruntime-web missing; run `npm ci` in {web}")
    if bundle is not None:
        dst = web / "data"
        dst.mkdir(exist_ok=True)
        for name in ("model.onnx", "model.json", "recording.bin", "recording.json"):
            src = Path(bundle) / name
            if not src.is_file():
                raise NeuroFedError(f"{bundle}: missing {name}; write it with `neurofed app bundle`")
            if src.resolve() != (dst / name).resolve():
                shutil.copyfile(src, dst / name)
    httpd = http.server.ThreadingHTTPServer((host, port), functools.partial(_Handler, directory=str(web)))
    threading.Thread(target=httpd.serve_forever, daemon=True, name="neurofed-web").start()
    if ready is not None:
        ready.set()
    return httpd
