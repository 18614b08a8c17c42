"""PhysioNet EEG Motor Movement/Imagery Database (EEGMMIDB): where files are and what labels mean.

Files are found in either layout:

* the shared folder ``DATA/eegmmidb/SNNN/SNNNRkk.edf``;
* MNE's own download ``~/mne_data/MNE-eegbci-data/files/eegmmidb/1.0.0/SNNN/SNNNRkk.edf``
  (``mne.datasets.eegbci``), or any folder holding ``SNNN/SNNNRkk.edf``.

Nothing downloads at run time unless asked (:func:`download`), and then a reachability probe
fails in under 5 s when offline.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable
from pathlib import Path

from neurofed.trainer.data.io import check_edf_size
from neurofed.trainer.errors import DataError, DownloadUnavailable, NeuroFedError

#: Left vs right fist imagery runs; T1/T2 meaning depends on the run.
LR_IMAGERY_RUNS: tuple[int, ...] = (4, 8, 12)
#: Both fists vs both feet imagery runs.
FF_IMAGERY_RUNS: tuple[int, ...] = (6, 10, 14)

RUN_EVENT_LABELS: dict[int, dict[str, str]] = {
    **{r: {"T1": "left_fist", "T2": "right_fist"} for r in (3, 4, 7, 8, 11, 12)},
    **{r: {"T1": "both_fists", "T2": "both_feet"} for r in (5, 6, 9, 10, 13, 14)},
}

TASKS: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
    "left_right": (LR_IMAGERY_RUNS, ("left_fist", "right_fist")),
    "fists_feet": (FF_IMAGERY_RUNS, ("both_fists", "both_feet")),
}

ENV_VAR = "NEUROFED_DATA"
_SUBJECT_DIR = re.compile(r"^S(\d{3})$")
_PHYSIONET_HOST = ("physionet.org", 443)


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def candidate_data_dirs() -> list[Path]:
    """Where the data folder is looked for when none is given, in order."""
    out: list[Path] = []
    if os.environ.get(ENV_VAR):
        out.append(Path(os.environ[ENV_VAR]))
    out += [Path.cwd() / ".." / "shared" / "data", _repo_root().parent / "shared" / "data"]
    mne_home = os.environ.get("MNE_DATA") or str(Path.home() / "mne_data")
    out.append(Path(mne_home) / "MNE-eegbci-data")
    return out


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Return the data folder: ``data_dir`` if given, else ``$NEUROFED_DATA``, else ../shared/data.

    Raises
    ------
    DataError
        If the given folder does not exist, or none of the default places holds EEGMMIDB files.
    """
    if data_dir is not None:
        p = Path(data_dir).expanduser()
        if not p.is_dir():
            raise DataError(f"data folder {p} does not exist (set --data-dir or ${ENV_VAR})")
        return p.resolve()
    for p in candidate_data_dirs():
        if p.is_dir() and subjects_root(p) is not None:
            return p.resolve()
    tried = ", ".join(str(p) for p in candidate_data_dirs())
    raise DataError(
        f"no EEGMMIDB data found (tried {tried}); pass --data-dir or set ${ENV_VAR} to a folder "
        "holding eegmmidb/SNNN/SNNNRkk.edf"
    )


def subjects_root(data_dir: Path) -> Path | None:
    """The folder whose children are SNNN subject folders, within the known layouts."""
    for rel in ("eegmmidb", "eegmmidb/1.0.0", "files/eegmmidb/1.0.0",
                "MNE-eegbci-data/files/eegmmidb/1.0.0", "."):
        root = data_dir / rel
        if root.is_dir() and any(_SUBJECT_DIR.match(c.name) for c in root.iterdir() if c.is_dir()):
            return root
    return None


def list_subjects(data_dir: str | os.PathLike | None = None, task: str = "left_right") -> list[int]:
    """Subjects that have every run of ``task`` in the data folder, sorted."""
    root = subjects_root(resolve_data_dir(data_dir))
    if root is None:
        raise DataError(f"no SNNN subject folders under {data_dir}")
    runs = TASKS[task][0]
    subjects = []
    for c in sorted(root.iterdir()):
        m = _SUBJECT_DIR.match(c.name)
        if m and all((c / f"{c.name}R{r:02d}.edf").is_file() for r in runs):
            subjects.append(int(m.group(1)))
    return subjects


def subject_files(data_dir: str | os.PathLike | None, subject: int, runs: Iterable[int]) -> list[Path]:
    """EDF paths of one subject's runs; a clear error names every missing file."""
    base = resolve_data_dir(data_dir)
    root = subjects_root(base)
    if root is None:
        raise DataError(f"no EEGMMIDB subject folders (SNNN/) under {base}")
    sid = f"S{subject:03d}"
    paths = [root / sid / f"{sid}R{r:02d}.edf" for r in runs]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataError(
            f"subject {subject}: missing files {missing}. Offline, copy them there; online, "
            "`neurofed data download` fetches them with MNE"
        )
    return paths


def network_reachable(host: tuple[str, int] = _PHYSIONET_HOST, timeout: float = 3.0) -> bool:
    """True when a TCP connection to ``host`` opens within ``timeout`` seconds."""
    try:
        with socket.create_connection(host, timeout=timeout):
            return True
    except OSError:
        return False


def download(subjects: Iterable[int], runs: Iterable[int] = LR_IMAGERY_RUNS, path: str | None = None) -> list[str]:
    """Download EEGMMIDB files with MNE (``mne.datasets.eegbci.load_data``), if online.

    Raises
    ------
    DownloadUnavailable
        Within ~3 s when physionet.org cannot be reached, saying how to use local files.
    """
    if not network_reachable():
        raise DownloadUnavailable(
            "cannot download EEGMMIDB: physionet.org is not reachable from this machine. "
            f"Point --data-dir or ${ENV_VAR} at a folder holding eegmmidb/SNNN/SNNNRkk.edf "
            "(e.g. ../shared/data) instead."
        )
    import mne

    out: list[str] = []
    for s in subjects:
        out += [str(p) for p in mne.datasets.eegbci.load_data(s, list(runs), path=path, update_path=False)]
    return out


def check_file(path: Path, run: int, window_s: float = 4.0) -> tuple[int, list[str]]:
    """Check one EEGMMIDB recording without loading its samples.

    Header vs file size (:func:`neurofed.trainer.data.io.check_edf_size`, the same check as loading), EDF
    header and annotations readable by MNE, both cue classes of the run present, and every cue's
    ``window_s`` window inside the recording.

    Returns
    -------
    n_cues, problems : int, list of str
        Usable cues of the run's two classes, and one line per problem (empty: the file is fine).
    """
    import mne

    try:
        check_edf_size(path)
    except DataError as exc:
        return 0, [str(exc).removeprefix(f"{path}: ")]
    try:
        raw = mne.io.read_raw_edf(path, preload=False, verbose="error")
    except Exception as exc:  # noqa: BLE001 - MNE raises many types for bad files; report the cause
        return 0, [f"header or annotations unreadable ({type(exc).__name__}: {exc})"]
    labels = RUN_EVENT_LABELS.get(run, {})
    desc = [str(d) for d in raw.annotations.description]
    onsets = raw.annotations.onset
    problems = [f"no {code} ({cls}) cue among its annotations" for code, cls in sorted(labels.items())
                if code not in desc]
    end = raw.n_times / raw.info["sfreq"]
    cues = [t for t, d in zip(onsets, desc) if d in labels]
    late = [t for t in cues if t + window_s > end + 1e-9]
    if late:
        problems.append(f"{len(late)} cue(s) at {', '.join(f'{t:.1f}' for t in late)} s end past the recording "
                        f"({end:.1f} s) within their {window_s:g} s window")
    return len(cues) - len(late), problems


def check_files(data_dir: str | os.PathLike | None = None, task: str = "left_right",
                on_file=None) -> dict[int, dict]:
    """:func:`check_file` on every subject folder's runs of ``task``; missing runs are problems too.

    Returns
    -------
    dict
        Subject -> ``{"files": {name: {"cues": int, "problems": [...]}}, "ok": bool}``, sorted by subject.
    """
    root = subjects_root(resolve_data_dir(data_dir))
    if root is None:
        raise DataError(f"no SNNN subject folders under {data_dir}")
    runs = TASKS[task][0]
    out: dict[int, dict] = {}
    for c in sorted(root.iterdir()):
        m = _SUBJECT_DIR.match(c.name)
        if not (m and c.is_dir()):
            continue
        files = {}
        for r in runs:
            p = c / f"{c.name}R{r:02d}.edf"
            if not p.is_file():
                files[p.name] = {"cues": 0, "problems": ["missing"]}
                continue
            n, problems = check_file(p, r)
            files[p.name] = {"cues": n, "problems": problems}
            if on_file:
                on_file(p)
        out[int(m.group(1))] = {"files": files, "ok": not any(f["problems"] for f in files.values())}
    return out


def parse_subjects(spec: str | None, data_dir: str | None) -> list[int]:
    """``all`` / None -> every subject in the data folder; else ``1,2,5-9``."""
    if spec in (None, "", "all"):
        return list_subjects(data_dir)
    out: list[int] = []
    try:
        for part in spec.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                out += list(range(int(a), int(b) + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise NeuroFedError(f"--subjects {spec!r}: use e.g. 1-6 or 1,2,5") from None
    return sorted(set(out))
