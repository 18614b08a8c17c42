"""``neurofed bench runtime``: neurofed-runtime alone (a fresh venv, no torch) against the full package.

Lives in neurofed/ (the lab): it builds a venv, exports a model (export/), streams a real recording over LSL
(firmware_sim/) and runs ``edge-client infer`` (edge/) for the comparison.

Measured:

* **installed size**: a fresh venv (no system site packages) with ``pip install runtime/`` (``du`` of the whole
  venv, pip included), then with the ``[lsl]`` extra; beside it the installed size of the full package's
  dependency closure (``neurofed`` and everything it requires, no extras), summed from the installed
  distributions' file records in this environment;
* **import time** (median of 5 fresh interpreters): ``import neurofed_runtime.decode`` in the runtime venv,
  ``import neurofed.export.decoder`` and ``import neurofed.edge.infer`` in this environment;
* **per-window latency** on every window of a real subject's imagery sessions: ``Decoder.decode`` (runtime venv)
  and the full package's ``InferenceEngine.process`` with the standalone step (what ``edge-client infer`` runs);
* **RSS while decoding a live LSL stream**: a simulated headset streams the subject's recording (64 channels,
  160 Hz); ``python -m neurofed_runtime.lsl`` (runtime venv) and ``edge-client infer --mode sliding`` (full
  package) decode it; peak resident memory (``VmHWM``) of each decoder process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

import numpy as np

from neurofed.trainer.bench import BENCH_DIR, write_result
from neurofed.trainer.errors import NeuroFedError

ROOT = Path(__file__).resolve().parents[1]
#: targets of issue 53
TARGET_SIZE_MB = 150.0
TARGET_RSS_MB = 120.0

_LATENCY = """
import json, sys, time
import numpy as np
from neurofed_runtime import Decoder
dec = Decoder.load(sys.argv[1])
ws = np.load(sys.argv[2])
for w in ws[:5]:
    dec.decode(w)
dec.reset()
t = []
for w in ws:
    t0 = time.perf_counter(); dec.decode(w); t.append(time.perf_counter() - t0)
print(json.dumps(t))
"""


def _du_mb(path: Path) -> float:
    total = 0
    for p in path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total / 2**20


def closure_size_mb(dist: str) -> tuple[float, list[str]]:
    """Installed size (MB) of ``dist`` and everything it requires (no extras), from this environment's records."""
    import importlib.metadata as md
    import re

    seen: dict[str, float] = {}
    todo = [dist]
    while todo:
        name = re.split(r"[ ;<>=!~\[(]", todo.pop().strip(), maxsplit=1)[0].lower().replace("_", "-")
        if not name or name in seen:
            continue
        try:
            d = md.distribution(name)
        except md.PackageNotFoundError:
            seen[name] = 0.0
            continue
        size = 0
        for f in d.files or []:
            p = Path(d.locate_file(f))
            if p.is_file():
                size += p.stat().st_size
        seen[name] = size / 2**20
        todo += [r for r in (d.requires or []) if "extra ==" not in r]
    return sum(seen.values()), sorted(seen)


def _import_time(py: str, stmt: str, env: dict | None = None, n: int = 5) -> float:
    code = f"import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"
    times = []
    for _ in range(n):
        r = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        if r.returncode != 0:
            raise NeuroFedError(f"{stmt!r} failed in {py}: {r.stderr.strip().splitlines()[-1:]}")
        times.append(float(r.stdout.strip().splitlines()[-1]))
    return float(np.median(times)) * 1e3


def _pct(t: list[float]) -> dict:
    ms = np.array(t) * 1e3
    return {"p50_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)), "windows": len(ms)}


def _peak_rss(cmd: list[str], env: dict | None, timeout: float) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run ``cmd``; its peak resident memory (MB, ``VmHWM``) and RSS (MB, polled) before it exits."""
    import psutil

    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    hwm = rss = 0.0
    deadline = time.monotonic() + timeout
    while p.poll() is None and time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{p.pid}/status").read_text()
            hwm = max(hwm, float(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmHWM"))) / 1024)
            rss = max(rss, psutil.Process(p.pid).memory_info().rss / 2**20)
        except (OSError, StopIteration, psutil.Error):
            pass
        time.sleep(0.05)
    if p.poll() is None:
        p.kill()
    out, err = p.communicate()
    return hwm, rss, subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _live(rec, name: str, cmd: list[str], env: dict | None, timeout: float) -> tuple[float, float, str]:
    from neurofed.firmware_sim.player import (  # lazy: pylsl (only when benchmarking)
        HeadsetPlayer,
        PlayerConfig,
    )

    player = HeadsetPlayer(rec, PlayerConfig(name=name, speed=1.0, markers=False, wait_consumers=60.0, linger=1.0,
                                             loop=True))
    player.start()
    try:
        hwm, rss, r = _peak_rss(cmd, env, timeout)
    finally:
        player.stop()
    if r.returncode != 0:
        raise NeuroFedError(f"live decoding failed ({' '.join(cmd[:3])} ...): {r.stderr.strip()[-500:]}")
    return hwm, rss, r.stdout


def bench_runtime(checkpoint: Path | None, model: Path | None, subject: int, data_dir: str | None,
                  live_seconds: float, venv_dir: Path | None, out_dir: Path = BENCH_DIR,
                  name: str = "runtime") -> dict:
    """Measure the runtime venv against the full package (module docstring); writes ``OUT_DIR/NAME.json``."""
    from neurofed.edge.infer import InferenceEngine, StandaloneStep  # lazy: onnxruntime, scipy
    from neurofed.edge.lsl_config import use_private_session  # lazy: keeps this module light
    from neurofed.export.decoder import StandaloneModel  # lazy: onnxruntime
    from neurofed.export.standalone import eegmmidb_session_windows, export_standalone  # lazy: torch
    from neurofed.firmware_sim.recording import load_recording  # lazy: mne
    from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS, resolve_data_dir  # lazy: mne

    if (checkpoint is None) == (model is None):
        raise NeuroFedError("give --checkpoint (exported here to a standalone graph) or --model (a standalone .onnx)")
    work = Path(tempfile.mkdtemp(prefix="neurofed-bench-runtime-"))
    if model is None:
        model = work / "model.standalone.onnx"
        export_standalone(checkpoint, model, rate=160.0)
    m = StandaloneModel(model)
    if m.info.rate != 160.0:
        raise NeuroFedError(f"{model}: exported for {m.info.rate:g} Hz; the bench streams EEGMMIDB at 160 Hz")

    # 1. a fresh venv with the runtime alone
    vdir = venv_dir or work / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    session, _ = use_private_session("neurofed-bench-runtime", work)  # sets LSLAPICFG (inherited by children)
    env["LSLAPICFG"] = os.environ["LSLAPICFG"]
    venv.create(vdir, with_pip=True, system_site_packages=False, clear=True)
    py = str(vdir / "bin" / "python")
    bare = _du_mb(vdir)

    def pip(*args: str) -> None:
        r = subprocess.run([py, "-m", "pip", "install", "-q", *args], capture_output=True, text=True, env=env,
                           timeout=1200)
        if r.returncode != 0:
            raise NeuroFedError(f"pip install {' '.join(args)} failed: {r.stderr.strip()[-500:]}")

    pip(str(ROOT / "runtime"))
    size_runtime = _du_mb(vdir)
    has_torch = subprocess.run([py, "-c", "import torch"], capture_output=True, env=env).returncode == 0
    pip(f"{ROOT / 'runtime'}[lsl]")
    size_lsl = _du_mb(vdir)
    full_mb, full_dists = closure_size_mb("neurofed")
    rt_mb, rt_dists = closure_size_mb("neurofed-runtime")

    # 2. import time
    imports = {
        "runtime_venv: import neurofed_runtime.decode": _import_time(py, "import neurofed_runtime.decode", env),
        "full: import neurofed.export.decoder": _import_time(sys.executable, "import neurofed.export.decoder"),
        "full: import neurofed.edge.infer": _import_time(sys.executable, "import neurofed.edge.infer"),
    }

    # 3. per-window latency on every window of the subject's imagery sessions
    sessions = eegmmidb_session_windows(subject, list(m.meta.ch_names), list(m.meta.classes), 0.0, 4.0, data_dir)
    ws = np.concatenate([w for _, w, _, _ in sessions]).astype(np.float32)
    np.save(work / "windows.npy", ws)
    r = subprocess.run([py, "-c", _LATENCY, str(model), str(work / "windows.npy")], capture_output=True, text=True,
                       env=env, timeout=600)
    if r.returncode != 0:
        raise NeuroFedError(f"runtime latency run failed: {r.stderr.strip()[-500:]}")
    rt_lat = _pct(json.loads(r.stdout.strip().splitlines()[-1]))
    eng = InferenceEngine(m, m.meta.ch_names, 160.0, decoder=StandaloneStep(m, 160.0))
    for w in ws[:5]:
        eng.process(w, 0.0)
    eng.state = eng.decoder.init_state()
    t = []
    for w in ws:
        t0 = time.perf_counter()
        eng.process(w, 0.0)
        t.append(time.perf_counter() - t0)
    full_lat = _pct(t)

    # 4. peak RSS decoding a live stream (real time), each decoder in its own process
    run_file = sessions[0][0]
    rec = load_recording(resolve_data_dir(data_dir) / "eegmmidb" / f"S{subject:03d}" / run_file,
                         RUN_EVENT_LABELS[int(Path(run_file).stem[-2:])])
    stream = f"bench-runtime-{os.getpid()}"
    n_windows = int(live_seconds / m.info.step_s)
    rt_hwm, rt_rss, out = _live(rec, stream + "-rt", [py, "-m", "neurofed_runtime.lsl", str(model), stream + "-rt",
                                                      "--windows", str(n_windows), "--timeout", "30"], env,
                                live_seconds + 120)
    rt_decoded = len([ln for ln in out.splitlines() if ln.strip()])
    infer = [sys.executable, "-c", "from neurofed.edge.cli import main; main()", "infer", "--model", str(model),
             "--stream", stream + "-full", "--mode", "sliding", "--duration", str(live_seconds), "--quiet",
             "--timeout", "30"]
    full_hwm, full_rss, _ = _live(rec, stream + "-full", infer, None, live_seconds + 120)

    res = {
        "model": {"path": str(model), "checkpoint": None if checkpoint is None else str(checkpoint),
                  "architecture": m.meta.model, "channels": m.meta.n_channels, "rate_hz": m.info.rate},
        "subject": f"S{subject:03d}",
        "load_average_1_5_15": list(os.getloadavg()),
        "installed_size_mb": {
            "fresh_venv_bare": bare,
            "fresh_venv_with_neurofed_runtime": size_runtime,
            "fresh_venv_with_neurofed_runtime_lsl": size_lsl,
            "neurofed_runtime_closure_in_this_env": rt_mb,
            "neurofed_closure_in_this_env": full_mb,
            "runtime_closure_distributions": rt_dists,
            "full_closure_distributions": len(full_dists),
            "torch_in_runtime_venv": has_torch,
        },
        "import_ms_median_of_5": imports,
        "latency_per_window": {"runtime_venv_Decoder.decode": rt_lat,
                               "full_package_InferenceEngine_standalone": full_lat},
        "live_lsl_rss_mb": {
            "seconds": live_seconds, "stream": f"S{subject:03d} {run_file} replayed in real time (64 ch, 160 Hz)",
            "runtime_venv_python_-m_neurofed_runtime.lsl": {"peak_rss_mb": rt_hwm, "max_polled_rss_mb": rt_rss,
                                                            "windows": rt_decoded},
            "full_package_edge-client_infer": {"peak_rss_mb": full_hwm, "max_polled_rss_mb": full_rss},
        },
        "targets": {
            "installed_size_le_150mb": size_lsl <= TARGET_SIZE_MB,
            "live_rss_le_120mb": rt_hwm <= TARGET_RSS_MB,
        },
    }
    write_result(name, res, out_dir)
    return res

