"""Errors of the standalone graph's building blocks on real EEGMMIDB sessions (docs/apps.md).

* the preprocessing matrix ``P`` against scipy (``sosfiltfilt`` + ``resample_poly``);
* Newton-Schulz ``R^{-1/2}`` after k iterations against the eigendecomposition, on the running
  EA covariance after every window of each subject's three imagery runs.

Run: ``python experiments/standalone/ns_error.py`` -> experiments/standalone/ns_error.json
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from export.standalone import eegmmidb_session_windows, newton_schulz_inv_sqrt, preprocess_matrix
from trainer.data import PreprocessConfig
from trainer.data.preprocess import preprocess_epochs

SUBJECTS = (3, 5, 7, 24, 33, 45)
ITERS = (12, 15, 18, 20, 24, 30)


def main() -> None:
    cfg = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
    chs = list(cfg.channels)
    p = preprocess_matrix(cfg, 160.0)
    conds, errs, perr = [], {k: [] for k in ITERS}, []
    for s in SUBJECTS:
        cov, n = np.zeros((21, 21)), 0
        for _, x, _, _ in eegmmidb_session_windows(s, chs, ["left_fist", "right_fist"], 0.0, 4.0):
            y, _, _ = preprocess_epochs(x, 160.0, chs, cfg)
            perr.append(float(np.abs(x.astype(np.float32) @ p.astype(np.float32) - y).max() / np.abs(y).max()))
            for w in y:
                cov += w @ w.T / w.shape[1]
                n += 1
                r = cov / n
                ev = np.linalg.eigvalsh(r)
                conds.append(float(ev.max() / ev.min()))
                ref = _eigh_inv_sqrt(r)
                for k in ITERS:
                    got = newton_schulz_inv_sqrt(torch.from_numpy(r), k).numpy()
                    errs[k].append(float(np.abs(got - ref).max() / np.abs(ref).max()))
    out = {
        "subjects": [f"S{s:03d}" for s in SUBJECTS],
        "windows": len(conds),
        "condition_number": {"max": max(conds), "median": float(np.median(conds))},
        "newton_schulz_max_rel_error": {str(k): max(v) for k, v in errs.items()},
        "preprocess_matrix_float32_max_rel_error": max(perr),
    }
    path = Path(__file__).with_suffix(".json")
    path.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


def _eigh_inv_sqrt(r: np.ndarray) -> np.ndarray:
    """The reference: eigendecomposition, eigenvalues floored at 1e-10 x the largest (as ``ea_matrix``)."""
    w, v = np.linalg.eigh(r)
    w = np.clip(w, w.max() * 1e-10, None)
    return (v / np.sqrt(w)) @ v.T


if __name__ == "__main__":
    main()
