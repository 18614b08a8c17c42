"""MOABB motor-imagery datasets (online), with a clear error in under 5 s when offline.

MOABB retries failed downloads for tens of seconds. When none of the usual dataset hosts
answers, the load runs in a child process with a 4 s budget (enough for files already on
disk) and a :class:`~neurofed.trainer.errors.DownloadUnavailable` names the problem otherwise.

Offline with local EEGMMIDB files: :func:`eegmmidb_as_mne_data` lays them out as MNE's download folder
(symlinks), and with ``MNE_DATA`` pointing there and ``MOABB_DOWNLOAD_PROVIDER=upstream`` MOABB's own
``PhysionetMI`` reads them (it would otherwise retry a mirror for minutes); the runs absent from disk
are dropped from its run list, and such subjects load in this process without the offline budget.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.dataset import SubjectData, _finish
from neurofed.trainer.data.eegmmidb import network_reachable, subjects_root
from neurofed.trainer.data.io import epochs_from_raw
from neurofed.trainer.errors import DataError, DownloadUnavailable

_HOSTS = (("zenodo.org", 443), ("physionet.org", 443), ("lampx.tugraz.at", 443), ("bnci-horizon-2020.eu", 443))
OFFLINE_BUDGET_S = 4.0


def _online() -> bool:
    """True when any of the dataset hosts answers; the hosts are tried at once, so this takes at most ~1 s."""
    with ThreadPoolExecutor(len(_HOSTS)) as pool:
        return any(pool.map(lambda h: network_reachable(h, timeout=1.0), _HOSTS))


#: Where MNE's EEGBCI fetcher (and MOABB's PhysionetMI) keeps EEGMMIDB files under ``MNE_DATA``.
EEGBCI_LAYOUT = ("MNE-eegbci-data", "files", "eegmmidb", "1.0.0")


def eegmmidb_as_mne_data(data_dir: str | Path, target: str | Path, subjects: list[int] | None = None) -> Path:
    """Symlink local EEGMMIDB recordings into MNE's download layout under ``target`` (the ``MNE_DATA`` to use).

    ``target/MNE-eegbci-data/files/eegmmidb/1.0.0/SNNN/SNNNRkk.edf`` -> ``data_dir/.../SNNN/SNNNRkk.edf``.

    Returns
    -------
    Path
        ``target`` (set ``MNE_DATA`` to it and ``MOABB_DOWNLOAD_PROVIDER=upstream`` before using MOABB).
    """

    root = subjects_root(Path(data_dir))
    if root is None:
        raise DataError(f"{data_dir}: no EEGMMIDB subject folders (SNNN/SNNNRkk.edf)")
    dest = Path(target).joinpath(*EEGBCI_LAYOUT)
    for sdir in sorted(root.glob("S[0-9][0-9][0-9]")):
        if subjects is not None and int(sdir.name[1:]) not in subjects:
            continue
        (dest / sdir.name).mkdir(parents=True, exist_ok=True)
        for f in sorted(sdir.glob(f"{sdir.name}R[0-9][0-9].edf")):
            link = dest / sdir.name / f.name
            if not link.exists():
                link.symlink_to(f.resolve())
    return Path(target)


def _eegbci_runs_on_disk(subject: int) -> set[int] | None:
    """Runs of ``subject`` in MNE's download layout under the configured ``MNE_DATA`` (None: no folder)."""
    import mne

    base = mne.get_config("MNE_DATA") or mne.get_config("MNE_DATASETS_EEGBCI_PATH")
    if not base:
        return None
    sdir = Path(base).joinpath(*EEGBCI_LAYOUT, f"S{subject:03d}")
    if not sdir.is_dir():
        return None
    return {int(f.stem[-2:]) for f in sdir.glob(f"S{subject:03d}R[0-9][0-9].edf")}


def make_dataset(dataset: str, subject: int | None = None):
    """A MOABB dataset object; ``PhysionetMI`` (imagery) keeps only the runs of ``subject`` found on disk."""
    try:
        import moabb.datasets as mds
    except ImportError:
        raise DataError("MOABB datasets need the optional dependency: pip install 'neurofed[moabb]'") from None
    if not hasattr(mds, dataset):
        raise DataError(f"unknown MOABB dataset {dataset!r}")
    if dataset != "PhysionetMI":
        return getattr(mds, dataset)()
    ds = mds.PhysionetMI(imagined=True, executed=False)
    runs = _eegbci_runs_on_disk(subject) if subject is not None else None
    if runs:  # drop runs absent from disk (the shared data holds only the left/right imagery runs 4/8/12)
        ds.hand_runs = [r for r in ds.hand_runs if r in runs]
        ds.feet_runs = [r for r in ds.feet_runs if r in runs]
    return ds


def _load_raw_epochs(dataset: str, subject: int, tmin: float, tmax: float) -> tuple[np.ndarray, list[str], float, list[str]]:
    ds = make_dataset(dataset, subject)
    data = ds.get_data([subject])[subject]
    label_map = {k: k for k in ds.event_id if k != "rest"}  # imagery classes only (PhysionetMI marks rest too)
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
    if (dataset == "PhysionetMI" and _eegbci_runs_on_disk(subject)) or _online():
        x, labels, sfreq, chs = _load_raw_epochs(dataset, subject, cfg.tmin, cfg.tmax)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "epochs.npz"
            code = (
                "import json,sys,numpy as np;from neurofed.trainer.data.moabb_source import _load_raw_epochs as f;"
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
