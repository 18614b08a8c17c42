"""Per-subject datasets: load, preprocess, align and cache."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from neurofed.trainer.data import cache
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS, TASKS, subject_files
from neurofed.trainer.data.io import check_consistent, epochs_from_raw, read_raw, sha256_file
from neurofed.trainer.data.preprocess import euclidean_alignment, preprocess_epochs
from neurofed.trainer.errors import DataError

logger = logging.getLogger("neurofed.trainer")


@dataclass
class SubjectData:
    """One subject's preprocessed trials.

    Attributes
    ----------
    subject : str
        Identifier, e.g. ``"S001"``.
    X : ndarray, float32, shape (n_trials, n_channels, n_times)
    y : ndarray, int64, shape (n_trials,)
        Index into ``classes``.
    classes : tuple of str
    sfreq : float
    ch_names : list of str
    file_hashes : dict
        File name -> SHA-256 of the source recording.
    """

    subject: str
    X: np.ndarray
    y: np.ndarray
    classes: tuple[str, ...]
    sfreq: float
    ch_names: list[str]
    file_hashes: dict[str, str] = field(default_factory=dict)

    @property
    def n_trials(self) -> int:
        return int(self.X.shape[0])


def _finish(
    subject: str,
    xs: list[np.ndarray],
    labels: list[str],
    sfreq: float,
    ch_names: list[str],
    classes: Sequence[str],
    cfg: PreprocessConfig,
    hashes: dict[str, str],
) -> SubjectData:
    x = np.concatenate(xs)
    x, new_sfreq, names = preprocess_epochs(x, sfreq, ch_names, cfg)
    if cfg.ea:
        x = euclidean_alignment(x)
    y = np.array([list(classes).index(lab) for lab in labels], dtype=np.int64)
    return SubjectData(subject, x.astype(np.float32), y, tuple(classes), new_sfreq, names, hashes)


def load_recordings(
    paths: Sequence[str | os.PathLike],
    label_maps: Sequence[Mapping[str, str]] | Mapping[str, str],
    cfg: PreprocessConfig,
    subject: str,
    classes: Sequence[str] | None = None,
) -> SubjectData:
    """Load any MNE-readable recordings of one subject (EDF/GDF/FIF/BrainVision...) with events.

    Parameters
    ----------
    paths : sequence of path
    label_maps : mapping or sequence of mappings
        Annotation description -> class name, one for all files or one per file (EEGMMIDB's T1/T2
        mean different things in different runs).
    cfg : PreprocessConfig
    subject : str
    classes : sequence of str, optional
        Class order (default: sorted class names found).
    """
    return load_raws([(str(p), read_raw(p)) for p in paths], label_maps, cfg, subject, classes,
                     {Path(p).name: sha256_file(p) for p in paths})


def load_raws(
    raws: Sequence[tuple[str, object]],
    label_maps: Sequence[Mapping[str, str]] | Mapping[str, str],
    cfg: PreprocessConfig,
    subject: str,
    classes: Sequence[str] | None = None,
    hashes: Mapping[str, str] | None = None,
) -> SubjectData:
    """Like :func:`load_recordings`, from ``(source name, mne.io.Raw)`` pairs already in memory
    (e.g. a recording presented through a device profile, :mod:`neurofed.trainer.data.profiles`)."""
    if isinstance(label_maps, Mapping):
        label_maps = [label_maps] * len(raws)
    if len(label_maps) != len(raws):
        raise ValueError("one label map per file is needed")
    xs, labels, sfreqs, chs = [], [], [], []
    paths = [src for src, _ in raws]
    for (p, raw), lm in zip(raws, label_maps):
        x, lab = epochs_from_raw(raw, lm, cfg.tmin, cfg.tmax, source=str(p))
        xs.append(x)
        labels += lab
        sfreqs.append(float(raw.info["sfreq"]))
        chs.append(list(raw.ch_names))
    check_consistent([str(p) for p in paths], sfreqs, chs)
    # reorder every file's channels to the first file's order
    order = chs[0]
    xs = [x if c == order else x[:, [c.index(o) for o in order], :] for x, c in zip(xs, chs)]
    cls = list(classes) if classes is not None else sorted(set(labels))
    unknown = sorted(set(labels) - set(cls))
    if unknown:
        raise DataError(f"subject {subject}: labels {unknown} are not among classes {cls}")
    return _finish(subject, xs, labels, sfreqs[0], order, cls, cfg, dict(hashes or {}))


def load_eegmmidb_subject(
    subject: int,
    cfg: PreprocessConfig | None = None,
    data_dir: str | os.PathLike | None = None,
    task: str = "left_right",
    use_cache: bool = True,
) -> SubjectData:
    """Load one EEGMMIDB subject's imagery runs, preprocessed (cached by a hash of all parameters).

    Labels are mapped per run (runs 4/8/12: T1 left fist, T2 right fist; runs 6/10/14: T1 both
    fists, T2 both feet).
    """
    cfg = cfg or PreprocessConfig()
    if task not in TASKS:
        raise DataError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    runs, classes = TASKS[task]
    paths = subject_files(data_dir, subject, runs)
    hashes = {p.name: sha256_file(p) for p in paths}
    key = cache.make_key(kind="eegmmidb", subject=subject, task=task, cfg=cfg.to_dict(), files=hashes)
    if use_cache:
        hit = cache.load(key)
        if hit is not None:
            return SubjectData(
                f"S{subject:03d}", hit["X"], hit["y"], tuple(str(c) for c in hit["classes"]),
                float(hit["sfreq"]), [str(c) for c in hit["ch_names"]], hashes,
            )
    label_maps = [{k: v for k, v in RUN_EVENT_LABELS[r].items()} for r in runs]
    sd = load_recordings(paths, label_maps, cfg, f"S{subject:03d}", classes)
    if use_cache:
        cache.save(key, {
            "X": sd.X, "y": sd.y, "classes": np.array(sd.classes), "sfreq": np.array(sd.sfreq),
            "ch_names": np.array(sd.ch_names),
        })
    return sd


def load_subjects(
    subjects: Iterable[int],
    cfg: PreprocessConfig | None = None,
    data_dir: str | os.PathLike | None = None,
    task: str = "left_right",
    use_cache: bool = True,
) -> list[SubjectData]:
    """Load several EEGMMIDB subjects (see :func:`load_eegmmidb_subject`)."""
    return [load_eegmmidb_subject(s, cfg, data_dir, task, use_cache) for s in subjects]
