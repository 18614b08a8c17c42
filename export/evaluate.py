"""Balanced accuracy of an exported ONNX model on recordings, clean and under attack.

Forward passes run in onnxruntime only, in consecutive batches of the model's test batch size
(batch-specific BN). White-box attacks need gradients: they are computed on a torch twin (rebuilt from a
checkpoint, or from the ONNX initializers when they hold the full state dict) whose weight hash
must equal the model's ``model_hash``; the adversarial trials are then classified by onnxruntime.
Black-box attacks (Square, HopSkipJump) need no weights: they query the deployed graph itself through
onnxruntime, as an attacker holding only the app's model file would (:func:`query_attack_batches`).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from neurofed_runtime.errors import SmallBatchWarning
from onnx import numpy_helper
from torch import nn

from neurofed.export.metadata import OnnxModelMeta, model_hash
from neurofed.export.runtime import OnnxModel
from neurofed.trainer.attacks import ATTACKS, art_attacks_module, attack_budgets
from neurofed.trainer.checkpoint import load_checkpoint
from neurofed.trainer.data import PreprocessConfig, load_eegmmidb_subject
from neurofed.trainer.data.dataset import load_recordings
from neurofed.trainer.data.eegmmidb import TASKS
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.evaluate import adversarial_batches, bca
from neurofed.trainer.model_meta import subject_id, training_subjects  # noqa: F401  (subject_id: part of this API)

logger = logging.getLogger("neurofed.export")


def torch_twin(
    meta: OnnxModelMeta, onnx_path: str | os.PathLike, checkpoint: str | os.PathLike | None = None
) -> nn.Module:
    """A torch model with exactly the exported weights (checked against ``meta.model_hash``).

    From ``checkpoint`` if given, else from the ONNX initializers (possible for batch-specific
    BN exports, whose initializers keep the state-dict names; standard-BN exports fold BN into
    the convolutions, so they need the checkpoint).
    """
    if checkpoint is not None:
        model, _ = load_checkpoint(checkpoint)
        source = str(checkpoint)
    else:
        model = meta.model_meta().build()  # any model a checkpoint describes, ensembles included
        inits = {i.name: i for i in onnx.load(str(onnx_path)).graph.initializer}
        state = model.state_dict()
        missing = [k for k, v in state.items() if k not in inits or tuple(inits[k].dims) != tuple(v.shape)]
        if missing:
            raise NeuroFedError(
                f"{onnx_path}: cannot rebuild torch weights from the ONNX initializers (missing or reshaped: "
                f"{missing[:4]}{'...' if len(missing) > 4 else ''}); pass --checkpoint for attacks"
            )
        model.load_state_dict({k: torch.from_numpy(numpy_helper.to_array(inits[k]).copy()) for k in state})
        source = f"{onnx_path} initializers"
    if model_hash(model.state_dict()) != meta.model_hash:
        raise NeuroFedError(
            f"torch twin from {source} has weights different from the exported model "
            "(model_hash mismatch); use the checkpoint the model was exported from"
        )
    return model.eval()


def attack_batches(
    twin: nn.Module, X: np.ndarray, y: np.ndarray, attack: str, eps: float, batch_size: int, seed: int = 0
) -> np.ndarray:
    """Adversarial trials built on the torch twin, batch by batch (same batches as the forward pass)."""

    if attack not in ATTACKS:
        raise NeuroFedError(f"unknown attack {attack!r}; choose from {sorted(ATTACKS)}")
    xs = adversarial_batches(twin, X, y, attack, eps, batch_size, seed)
    return np.concatenate([xa.numpy() for xa in xs]).astype(np.float32)


#: Attacks that only query the model (scores or labels): run against the ONNX graph, no torch twin.
BLACK_BOX_ATTACKS = ("square", "hsj")


def query_attack_batches(
    om: OnnxModel, X: np.ndarray, y: np.ndarray, attack: str, eps: float, batch_size: int, seed: int = 0
) -> np.ndarray:
    """Adversarial trials found by a black-box library attack querying the ONNX graph (onnxruntime).

    Batch by batch as the forward pass (batch ``b`` with seed ``seed + b``), through the same std-scaled
    wrapper, budgets and box as the torch attacks (:func:`neurofed.trainer.art_attacks.blackbox_on_scores`).
    """
    if attack not in BLACK_BOX_ATTACKS:
        raise NeuroFedError(f"attack {attack!r} is not a black-box attack ({', '.join(BLACK_BOX_ATTACKS)})")

    blackbox_on_scores = art_attacks_module(attack).blackbox_on_scores
    out = [blackbox_on_scores(attack, om.forward, X[i : i + batch_size], y[i : i + batch_size], eps, seed + b)
           for b, i in enumerate(range(0, len(X), batch_size))]
    return np.concatenate(out).astype(np.float32)


def load_eegmmidb_for(
    meta: OnnxModelMeta, subjects: Sequence[int], data_dir
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """EEGMMIDB subjects preprocessed as the model's metadata says (channels, band, rate, window, EA)."""

    task = next((t for t, (_, cls) in TASKS.items() if list(cls) == list(meta.classes)), None)
    if task is None:
        raise NeuroFedError(f"the model's classes {meta.classes} match no EEGMMIDB task ({sorted(TASKS)})")
    cfg = PreprocessConfig.from_dict(meta.preprocess)
    out = {}
    for s in subjects:
        sd = load_eegmmidb_subject(s, cfg, data_dir, task=task)
        out[sd.subject] = check_fit(meta, sd)
    return out


def load_files_for(
    meta: OnnxModelMeta, paths: Sequence[str | os.PathLike], event_map: Mapping[str, str]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Generic MNE-readable recordings, one subject per file, preprocessed as the metadata says."""

    cfg = PreprocessConfig.from_dict(meta.preprocess)
    if cfg.channels is None:  # select/reorder to the model's channels explicitly
        cfg = PreprocessConfig.from_dict({**meta.preprocess, "channels": list(meta.ch_names)})
    out = {}
    for p in paths:
        if not Path(p).is_file():
            raise NeuroFedError(f"{p}: recording not found")
        sd = load_recordings([p], event_map, cfg, Path(p).stem, meta.classes)
        out[sd.subject] = check_fit(meta, sd)
    return out


def check_fit(meta: OnnxModelMeta, sd) -> tuple[np.ndarray, np.ndarray]:
    """Trials of ``sd`` if their channels, rate and length fit the model; else a clear error."""
    if [c.lower() for c in sd.ch_names] != [c.lower() for c in meta.ch_names]:
        raise NeuroFedError(f"{sd.subject}: channels {sd.ch_names} differ from the model's {meta.ch_names}")
    if abs(sd.sfreq - meta.sfreq) > 1e-6:
        raise NeuroFedError(
            f"{sd.subject}: sampling rate {sd.sfreq} Hz after preprocessing, model expects {meta.sfreq} Hz"
        )
    if sd.X.shape[2] != meta.n_times:
        raise NeuroFedError(f"{sd.subject}: {sd.X.shape[2]} samples per trial, model expects {meta.n_times}")
    return sd.X.astype(np.float32), sd.y


def _budget(attack: str) -> dict:
    return attack_budgets([attack])[attack]


def group_summary(rows: Mapping[str, dict], metrics: Sequence[str]) -> dict:
    """Per metric: mean, sample std (ddof=1; 0 for one subject) and number of subjects; {} if no rows."""
    if not rows:
        return {}
    out = {}
    for m in metrics:
        v = np.array([r[m] for r in rows.values()], dtype=float)
        out[m] = {"mean": float(v.mean()), "std_subjects": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                  "n_subjects": len(v)}
    return out


def evaluate(
    model_path: str | os.PathLike,
    data: Mapping[str, tuple[np.ndarray, np.ndarray]],
    attack: str | None = None,
    eps: float = 0.03,
    checkpoint: str | os.PathLike | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    on_subject: Callable[[str], None] | None = None,
    trained_on: Sequence[str] | None = None,
) -> dict:
    """BCA per subject (onnxruntime forward), clean and optionally attacked; JSON-ready dict.

    Training subjects (``trained_on``, else the model's ``data_hashes``) are scored on trials they
    trained on: their rows carry ``trained_on: true`` and they are summarised apart
    (``summary_training``), never mixed into ``summary`` (held-out subjects, or every subject when
    the model does not say what it was trained on: ``training_subjects`` is then null).
    Standard deviations are sample ones (ddof=1) over subjects.
    """

    om = OnnxModel(model_path)
    bs = batch_size or om.meta.test_batch_size
    need = om.min_windows  # a plain batch-specific-BN export's minimum batch (1 otherwise)
    if bs < need:
        logger.warning("--batch-size %d is below the model's minimum batch %d (batch-specific BN): every batch is "
                       "normalised with too few windows, BCA falls", bs, need)
    black_box = attack in BLACK_BOX_ATTACKS
    twin = torch_twin(om.meta, model_path, checkpoint) if attack and not black_box else None
    per: dict[str, dict] = {}
    with warnings.catch_warnings():  # the minimum batch is said in one log line (above, and per subject below)
        warnings.simplefilter("ignore", SmallBatchWarning)
        for subj, (X, y) in data.items():
            if 0 < len(X) < need:
                logger.warning("%s: %d trials, fewer than the model's minimum batch %d (batch-specific BN): its "
                               "BCA is computed from under-filled batches", subj, len(X), need)
            row = {"n_trials": len(X), "bca": bca(y, om.predict(X, bs))}
            if attack:
                Xa = (query_attack_batches(om, X, y, attack, eps, bs, seed) if black_box
                      else attack_batches(twin, X, y, attack, eps, bs, seed))
                row["bca_attacked"] = bca(y, om.predict(Xa, bs))
            per[subj] = row
            if on_subject:
                on_subject(subj)
    metrics = ["bca"] + (["bca_attacked"] if attack else [])
    trained, source = training_subjects(om.meta, trained_on)
    for subj, row in per.items():
        row["trained_on"] = None if trained is None else subj in trained
    held = {s: r for s, r in per.items() if not r["trained_on"]}
    seen = {s: r for s, r in per.items() if r["trained_on"]}
    return {
        "model": str(model_path),
        "model_hash": om.meta.model_hash,
        "architecture": om.meta.model,
        "bn_mode": om.meta.bn_mode,
        "quantized": om.meta.quantized,
        "test_batch_size": bs,
        "attack": ({"name": attack, "eps": eps, "seed": seed}
                   | ({"queried": "onnxruntime (the exported graph)", "budget": _budget(attack)} if black_box else {})
                   if attack else None),
        "training_subjects": None if trained is None else sorted(trained),
        "training_subjects_source": source,
        "per_subject": per,
        "summary": group_summary(held, metrics),
        "summary_training": group_summary(seen, metrics),
    }
