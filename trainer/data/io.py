"""Reading recordings with MNE and cutting labelled epochs, with errors that name the file."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from neurofed.trainer.errors import DataError

logger = logging.getLogger("neurofed.trainer")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def check_edf_size(path: Path) -> None:
    """Raise if an EDF/BDF file's size disagrees with its header (truncated or CRLF-mangled)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
            if len(head) < 256:
                raise DataError(f"{path}: not an EDF file (only {len(head)} bytes)")
            n_records = int(head[236:244].decode("ascii").strip())
            ns = int(head[252:256].decode("ascii").strip())
            header_bytes = int(head[184:192].decode("ascii").strip())
            f.seek(256 + ns * 216)
            nsamp = [int(f.read(8).decode("ascii").strip()) for _ in range(ns)]
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: corrupt EDF header ({exc})") from None
    sample_bytes = 3 if head[:1] == b"\xff" else 2  # BDF uses 24-bit samples
    expected = header_bytes + n_records * sum(nsamp) * sample_bytes
    actual = path.stat().st_size
    if n_records > 0 and actual != expected:
        raise DataError(
            f"{path}: file is {actual} bytes but its header describes {expected} bytes "
            "(truncated, or corrupted e.g. by a text-mode CRLF conversion)"
        )


def read_raw(path: str | os.PathLike):
    """Read any MNE-readable recording (EDF/BDF/GDF/FIF/BrainVision...) with data preloaded.

    Channel names are standardised to 10-05 names for EEGMMIDB-style labels (``Fc5.`` -> ``FC5``).
    """
    import mne

    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: file not found")
    if p.suffix.lower() in (".edf", ".bdf"):
        check_edf_size(p)
    try:
        raw = mne.io.read_raw(p, preload=True, verbose="error")
    except Exception as exc:  # MNE raises many types for bad files; name the file and the cause
        raise DataError(f"{p}: cannot be read as an EEG recording ({type(exc).__name__}: {exc})") from None
    if any(c.endswith(".") for c in raw.ch_names):
        mne.datasets.eegbci.standardize(raw)
    raw.pick("eeg", verbose="error") if "eeg" in raw else None
    return raw


def cue_samples(raw, label_map: Mapping[str, str]) -> list[tuple[int, str]]:
    """Cue positions and class names of the annotations in ``label_map``, sorted by sample.

    The one rule placing an annotation on a sample (``mne.events_from_annotations``, relative to the first
    sample of ``raw``): offline epochs (:func:`epochs_from_raw`) and the cues a simulated headset streams
    (firmware_sim) both use it.

    Parameters
    ----------
    raw : mne.io.Raw
    label_map : mapping
        Annotation description -> class name; other annotations are ignored.

    Returns
    -------
    list of (int, str)
        (sample index from the start of the data, class name).
    """
    import mne

    present = set(map(str, raw.annotations.description))
    wanted = {d: i + 1 for i, d in enumerate(sorted(label_map)) if d in present}
    if not wanted:
        return []
    events, _ = mne.events_from_annotations(raw, event_id=wanted, verbose="error")
    code_to_desc = {v: k for k, v in wanted.items()}
    return [(int(s) - raw.first_samp, label_map[code_to_desc[int(c)]]) for s, _, c in events]


def epochs_from_raw(
    raw,
    label_map: Mapping[str, str],
    tmin: float,
    tmax: float,
    source: str = "",
) -> tuple[np.ndarray, list[str]]:
    """Cut ``[tmin, tmax)`` epochs after each annotation whose description is in ``label_map``.

    Parameters
    ----------
    raw : mne.io.Raw
    label_map : mapping
        Annotation description -> class name (e.g. ``{"T1": "left_fist", "T2": "right_fist"}``).
    tmin, tmax : float
        Seconds relative to each annotation onset.
    source : str
        Shown in error messages (file name).

    Returns
    -------
    x : ndarray, shape (n_epochs, n_channels, n_times), float64, microvolts
    labels : list of str
    """
    sfreq = float(raw.info["sfreq"])
    n_times = int(round((tmax - tmin) * sfreq))
    data = raw.get_data() * 1e6  # MNE returns volts; models and EA work in microvolts
    present = sorted(set(map(str, raw.annotations.description)))
    starts, labels = [], []
    for cue, label in cue_samples(raw, label_map):
        start = cue + int(round(tmin * sfreq))
        if start < 0 or start + n_times > data.shape[1]:
            logger.warning("%s: epoch at sample %d runs past the recording; skipped", source, cue + raw.first_samp)
            continue
        starts.append(start)
        labels.append(label)
    if not starts:
        raise DataError(
            f"{source or 'recording'}: no events among {sorted(label_map)} "
            f"(annotations present: {present})"
        )
    x = np.stack([data[:, s : s + n_times] for s in starts])
    if not np.all(np.isfinite(x)):
        raise DataError(f"{source}: epochs contain NaN or infinite samples")
    return x, labels


def check_consistent(files: Sequence[str], sfreqs: Sequence[float], ch_lists: Sequence[list[str]]) -> None:
    """Every file of one subject must share sampling rate and channel set."""
    for f, s, chs in zip(files[1:], sfreqs[1:], ch_lists[1:]):
        if s != sfreqs[0]:
            raise DataError(f"{f}: sampling rate {s} Hz differs from {files[0]} ({sfreqs[0]} Hz)")
        if set(chs) != set(ch_lists[0]):
            diff = sorted(set(chs) ^ set(ch_lists[0]))
            raise DataError(f"{f}: channel set differs from {files[0]} (differs in {diff})")
