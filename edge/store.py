"""Crash-safe on-device store of raw captured trials.

Layout of a store folder::

    meta.json          sampling rate, channel labels, subject (written once, atomically)
    trials/000042.npz  one raw trial (float32 microvolts, channels x times), written atomically
    index.jsonl        one JSON line per committed trial, with the sha256 of its .npz

A trial is committed when its index line (fsync'ed) is complete. ``kill -9`` at any moment loses at
most the trial in flight: a half-written .npz is a temp file or an orphan without an index line, and a
torn last index line is cut off when the store is reopened. Earlier trials are never rewritten.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from neurofed.edge import logger
from neurofed.edge.capture import RawTrial
from neurofed.trainer.atomic import atomic_write_bytes
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.dataset import SubjectData
from neurofed.trainer.data.preprocess import apply_ea, ea_matrix, preprocess_epochs
from neurofed.trainer.errors import DataError

FORMAT = "neurofed-trials/1"

#: errors that mean "no room left" for a write: a full file system, a quota, the process's file size limit
#: (``ulimit -f``; Python ignores SIGXFSZ, so the write fails with EFBIG)
NO_ROOM = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EFBIG: "file size limit reached"}


class StoreWriteError(DataError):
    """A trial could not be written (disk full, quota, file size limit, I/O error); the store is left as it was."""


def _undo(f, end: int, trial_path: Path) -> None:
    """Best effort after a failed index write: truncate the index back to ``end`` and remove the trial's file."""
    try:
        f.truncate(end)
    except OSError:  # a torn last line is also cut when the store is reopened
        pass
    trial_path.unlink(missing_ok=True)


class LocalStore:
    """Append-only store of raw trials for one subject/headset.

    Parameters
    ----------
    path : path
        Folder (created if needed).
    subject : str
        Identifier kept in ``meta.json`` (first use only).
    classes : sequence of str, optional
        Class order kept in ``meta.json`` (first use only; default: sorted labels found).
    """

    def __init__(self, path: str | os.PathLike, subject: str = "local", classes: Sequence[str] | None = None) -> None:
        self.path = Path(path)
        try:
            (self.path / "trials").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            what = NO_ROOM.get(exc.errno or 0, "cannot create the store")
            raise StoreWriteError(f"{self.path}: {what} ({exc.strerror or exc})") from None
        self.index_path = self.path / "index.jsonl"
        self.meta_path = self.path / "meta.json"
        self.subject = subject
        self.classes = list(classes) if classes is not None else None
        self.meta: dict | None = None
        if self.meta_path.exists():
            try:
                self.meta = json.loads(self.meta_path.read_text())
            except json.JSONDecodeError as exc:
                raise DataError(f"{self.meta_path}: unreadable ({exc})") from None
            self.subject = self.meta.get("subject", subject)
            self.classes = self.meta.get("classes") or self.classes
        self.entries = self._read_index(repair=True)
        files = [int(p.stem) for p in (self.path / "trials").glob("*.npz") if p.stem.isdigit()]
        self._next = max([e["seq"] for e in self.entries] + files, default=-1) + 1

    # --- index ---
    def _read_index(self, repair: bool) -> list[dict]:
        if not self.index_path.exists():
            return []
        raw = self.index_path.read_bytes()
        good_end = raw.rfind(b"\n") + 1
        if good_end < len(raw):
            logger.warning("%s: dropping a torn last line (%d bytes; trial in flight at a crash)",
                           self.index_path, len(raw) - good_end)
            if repair:
                with open(self.index_path, "r+b") as f:
                    f.truncate(good_end)
                    f.flush()
                    os.fsync(f.fileno())
        entries = []
        for n, line in enumerate(raw[:good_end].splitlines(), 1):
            if not line.strip():
                continue
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                raise DataError(f"{self.index_path}: line {n} is corrupt") from None
        return entries

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def labels(self) -> list[str]:
        return [e["label"] for e in self.entries]

    # --- writing ---
    def _check_meta(self, trial: RawTrial) -> None:
        if self.meta is None:
            self.meta = {"format": FORMAT, "subject": self.subject, "sfreq": trial.sfreq,
                         "ch_names": list(trial.ch_names), "classes": self.classes, "unit": "microvolts",
                         "created": time.time()}
            atomic_write_bytes(self.meta_path, json.dumps(self.meta, indent=1).encode())
            return
        if trial.sfreq != self.meta["sfreq"]:
            raise DataError(f"{self.path}: trial at {trial.sfreq:g} Hz, store holds {self.meta['sfreq']:g} Hz")
        if list(trial.ch_names) != self.meta["ch_names"]:
            raise DataError(f"{self.path}: trial channels differ from the store's ({len(self.meta['ch_names'])} ch)")

    def append(self, trial: RawTrial) -> int:
        """Commit one raw trial; returns its sequence number.

        Raises
        ------
        StoreWriteError
            The disk is full (or another write error): one line naming the problem; the trial is not
            committed and every trial committed before is intact (a torn index line is cut back, an orphaned
            trial file removed).
        """
        try:
            return self._append(trial)
        except OSError as exc:
            what = NO_ROOM.get(exc.errno or 0, "cannot write")
            raise StoreWriteError(f"{self.path}: {what} ({exc.strerror or exc}) storing trial {self._next}; the "
                                  f"{len(self)} trials already stored are intact") from None

    def _append(self, trial: RawTrial) -> int:
        self._check_meta(trial)
        data = np.asarray(trial.data, dtype=np.float32)
        if data.ndim != 2 or data.shape[0] != len(trial.ch_names):
            raise DataError(f"trial data shape {data.shape} does not match {len(trial.ch_names)} channels")
        seq = self._next
        bio = io.BytesIO()
        np.savez(bio, data=data, label=np.array(trial.label), onset=np.array(trial.onset))
        payload = bio.getvalue()
        name = f"{seq:06d}.npz"
        trial_path = atomic_write_bytes(self.path / "trials" / name, payload)
        entry = {"seq": seq, "file": f"trials/{name}", "sha256": hashlib.sha256(payload).hexdigest(),
                 "label": trial.label, "onset": trial.onset, "n_times": int(data.shape[1]), "time": time.time()}
        line = memoryview((json.dumps(entry) + "\n").encode())
        with open(self.index_path, "ab", buffering=0) as f:  # unbuffered: a failed write fails here, not at close
            end = f.seek(0, os.SEEK_END)
            try:
                while line:
                    line = line[f.write(line):]
                os.fsync(f.fileno())
            except OSError:  # e.g. the disk filled up mid-line: cut the torn line, drop the uncommitted trial
                _undo(f, end, trial_path)
                raise
        self.entries.append(entry)
        self._next = seq + 1
        return seq

    # --- reading ---
    def read_trial(self, entry: dict) -> np.ndarray:
        """Raw trial data after checking its sha256."""
        p = self.path / entry["file"]
        try:
            payload = p.read_bytes()
        except FileNotFoundError:
            raise DataError(f"{p}: trial file missing (store damaged)") from None
        if hashlib.sha256(payload).hexdigest() != entry["sha256"]:
            raise DataError(f"{p}: checksum mismatch (file corrupted)")
        with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            return z["data"]

    def verify(self) -> list[str]:
        """Problems found (empty when every committed trial is intact)."""
        bad = []
        for e in self.entries:
            try:
                self.read_trial(e)
            except DataError as exc:
                bad.append(str(exc))
        return bad

    def raw_trials(self) -> tuple[np.ndarray, list[str]]:
        """All raw trials ``(n, channels, times)`` float32 and their labels."""
        if not self.entries:
            raise DataError(f"{self.path}: no trials captured yet")
        return np.stack([self.read_trial(e) for e in self.entries]), self.labels

    def ea_reference(self, cfg: PreprocessConfig) -> np.ndarray:
        """EA matrix ``R^-1/2`` of this device's preprocessed trials (computed here, never uploaded)."""
        x, _, _ = self._preprocessed(cfg)
        return ea_matrix(x)

    def _preprocessed(self, cfg: PreprocessConfig) -> tuple[np.ndarray, float, list[str]]:
        x, _ = self.raw_trials()
        assert self.meta is not None
        return preprocess_epochs(x, float(self.meta["sfreq"]), self.meta["ch_names"], cfg)

    def load_subject_data(self, cfg: PreprocessConfig, classes: Sequence[str] | None = None) -> SubjectData:
        """Preprocess the captured trials like trainer does (+ EA on device) for local training."""
        x, sfreq, names = self._preprocessed(cfg)
        if cfg.ea:
            x = apply_ea(x, ea_matrix(x))
        cls = list(classes or self.classes or sorted(set(self.labels)))
        unknown = sorted(set(self.labels) - set(cls))
        if unknown:
            raise DataError(f"{self.path}: labels {unknown} are not among classes {cls}")
        y = np.array([cls.index(lab) for lab in self.labels], dtype=np.int64)
        hashes = {e["file"]: e["sha256"] for e in self.entries}
        return SubjectData(self.subject, x.astype(np.float32), y, tuple(cls), sfreq, names, hashes)


def store_loader(path: str | os.PathLike) -> Callable[[Any], SubjectData]:
    """``ModelSpec -> SubjectData`` of a captured store, read afresh at each call (``edge-client join --store``):
    the federation's preprocessing (``spec.preprocess``) and class order (``spec.classes``)."""
    def load(spec: Any) -> SubjectData:
        return LocalStore(path).load_subject_data(PreprocessConfig.from_dict(spec.preprocess),
                                                  classes=list(spec.classes))

    return load


def store_montage(path: str | os.PathLike) -> Callable[[], tuple[list[str], float]]:
    """``() -> (channels, rate)`` of the device that filled a store (refused while it holds no trial)."""
    def montage() -> tuple[list[str], float]:
        st = LocalStore(path)
        if not st.meta:
            raise DataError(f"{path}: the store holds no trials yet, so its device is unknown")
        return list(st.meta["ch_names"]), float(st.meta["sfreq"])

    return montage
