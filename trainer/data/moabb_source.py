"""MOABB motor-imagery datasets (online), with a clear error in under 5 s when offline.

MOABB retries failed downloads for tens of seconds. When none of the usual dataset hosts
answers, the load runs in a child process with a 4 s budget (enough for files already on
disk) and a :class:`~trainer.errors.DownloadUnavailable` names the problem otherwise.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from trainer.data.config import PreprocessConfig
from trainer.data.dataset import SubjectData, _finish
from trainer.data.eegmmidb import network_reachable
from trainer.data.io import epochs_from_raw
from trainer.errors import DataError, DownloadUnavailable

_HOSTS = (("zenodo.org", 443), ("physionet.org", 443), ("lampx.tugraz.at", 443), ("bnci-horizon-2020.eu", 443))
OFFLINE_BUDGET_S = 4.0


def _online() -> bool:
    return any(network_reachable(h, timeout=1.0) for h in _HOSTS)


def _load_raw_epochs(dataset: str, subject: int, tmin: float, tmax: float) -> tuple[np.ndarray, list[str], float, list[str]]:
    try:
        import moabb.datasets as mds
    except ImportError:
        raise DataError("MOABB datasets need the optional dependency: pip install 'neurofed[moabb]'") from None
    if not hasattr(mds, dataset):
        raise DataError(f"unknown MOABB dataset {dataset!r}")
    ds = getattr(mds, dataset)()
    data = ds.get_data([subject])[subject]
    label_map = {k: k for k in ds.event_id}
    xs, labels, sfreq, chs = [], [], None, None
    for session in data.values():
        for raw in session.values():
            raw = raw.copy().pick("eeg", verbose="error")
            x, lab = epochs_from_raw(raw, label_map, tmin + ds.interval[0], tmax + ds.interval[0], f"{dataset} S{subject}")
            xs.append(x)
            labels += lab
            sfreq, chs = float(raw.info["sfreq"]), list(raw.ch_names)
    return np.concatenate(xs), labels, float(sfreq), list(chs)


def load_moabb_subject(dataset: str, subject: int, cfg: PreprocessConfig | None = None) -> SubjectData:
    """One subject of a MOABB dataset (e.g. ``BNCI2014_001``), epochs relative to the dataset's cue
    interval start, preprocessed like EEGMMIDB (band-pass, resampling, channels, EA)."""
    cfg = cfg or PreprocessConfig()
    if _online():
        x, labels, sfreq, chs = _load_raw_epochs(dataset, subject, cfg.tmin, cfg.tmax)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "epochs.npz"
            code = (
                "import json,sys,numpy as np;from trainer.data.moabb_source import _load_raw_epochs as f;"
                f"x,l,s,c=f({dataset!r},{subject},{cfg.tmin},{cfg.tmax});"
                f"np.savez({str(out)!r},x=x,l=np.array(l),s=s,c=np.array(c))"
            )
            try:
                proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      timeout=OFFLINE_BUDGET_S, check=False)
                ok = proc.returncode == 0 and out.exists()
            except subprocess.TimeoutExpired:
                ok = False
            if not ok:
                raise DownloadUnavailable(
                    f"cannot load MOABB {dataset} subject {subject}: this machine is offline and the files are "
                    "not on disk. Download them where online (MNE_DATA), or use local recordings with --data-dir."
                )
            with np.load(out, allow_pickle=False) as z:
                x, labels, sfreq, chs = z["x"], [str(v) for v in z["l"]], float(z["s"]), [str(v) for v in z["c"]]
    classes = sorted(set(labels))
    return _finish(f"{dataset}-S{subject:03d}", [x], labels, sfreq, chs, classes, cfg, {})
