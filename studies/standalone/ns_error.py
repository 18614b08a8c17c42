"""Errors of the standalone graph's building blocks on real EEGMMIDB sessions (docs/apps.md).

* the preprocessing matrix ``P`` against scipy (``sosfiltfilt`` + ``resample_poly``);
* Newton-Schulz ``R^{-1/2}`` against the eigendecomposition, on the running EA covariance after every
  window of each subject's imagery runs, at 21 channels (sensorimotor21) and 64 (the lab64 profile's
  channels): the graph's scaled iteration (Frobenius scaling, :data:`neurofed.export.standalone.NS_ALPHAS`) and
  the earlier plain trace-scaled one after k steps;
* both on synthetic 64 x 64 SPD matrices of growing condition number (log-spaced spectrum).

Run: ``python studies/standalone/ns_error.py`` -> studies/standalone/ns_error.json
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from neurofed.export.standalone import (
    NS_FLOOR,
    NS_ITERS,
    eegmmidb_session_windows,
    newton_schulz_inv_sqrt,
    preprocess_matrix,
)
from neurofed.trainer.data import PreprocessConfig
from neurofed.trainer.data.preprocess import ea_inv_sqrt, preprocess_epochs
from neurofed.trainer.data.profiles import get_profile

SUBJECTS = (3, 5, 7, 24, 33, 45)
PLAIN_ITERS = (12, 15, 18, 20, 24, 30)
SYNTH_CONDS = (1e4, 1e5, 1e6, 1e7, 1e8)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def sessions_block(cfg: PreprocessConfig) -> dict:
    """Errors over the running covariances of :data:`SUBJECTS`' imagery runs with channels ``cfg.channels``."""
    chs = list(cfg.channels)
    p = preprocess_matrix(cfg, 160.0)
    c = len(chs)
    conds, fro, tr, perr = [], [], [], []
    scaled, plain = [], {k: [] for k in PLAIN_ITERS}
    for s in SUBJECTS:
        cov, n = np.zeros((c, c)), 0
        for _, x, _, _ in eegmmidb_session_windows(s, chs, ["left_fist", "right_fist"], 0.0, 4.0):
            y, _, _ = preprocess_epochs(x, 160.0, chs, cfg)
            perr.append(float(np.abs(x.astype(np.float32) @ p.astype(np.float32) - y).max() / np.abs(y).max()))
            for w in y:
                cov += w @ w.T / w.shape[1]
                n += 1
                r = cov / n
                ev = np.linalg.eigvalsh(r)
                conds.append(float(ev.max() / ev.min()))
                fro.append(float(np.linalg.norm(r) / ev.max()))
                tr.append(float(ev.sum() / ev.max()))
                ref = ea_inv_sqrt(r)
                scaled.append(rel_err(newton_schulz_inv_sqrt(torch.from_numpy(r)).numpy(), ref))
                for k in PLAIN_ITERS:
                    plain[k].append(rel_err(newton_schulz_inv_sqrt(torch.from_numpy(r), k, "trace").numpy(), ref))
    return {
        "channels": c,
        "windows": len(conds),
        "condition_number": {"max": max(conds), "median": float(np.median(conds))},
        "frobenius_over_largest_eigenvalue_max": max(fro),
        "trace_over_largest_eigenvalue_max": max(tr),
        f"graph_scaled_{NS_ITERS}_iters_max_rel_error": max(scaled),
        "plain_trace_scaled_max_rel_error": {str(k): max(v) for k, v in plain.items()},
        "preprocess_matrix_float32_max_rel_error": max(perr),
    }


def synthetic_block(n: int = 64) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for cond in SYNTH_CONDS:
        q, _ = np.linalg.qr(rng.standard_normal((n, n)))
        r = (q * np.logspace(0, -np.log10(cond), n)) @ q.T
        r = (r + r.T) / 2
        ref = ea_inv_sqrt(r)
        out[f"{cond:g}"] = {
            f"graph_scaled_{NS_ITERS}": rel_err(newton_schulz_inv_sqrt(torch.from_numpy(r)).numpy(), ref),
            "plain_trace_scaled_24": rel_err(newton_schulz_inv_sqrt(torch.from_numpy(r), 24, "trace").numpy(), ref),
        }
    return out


def main() -> None:
    torch.set_num_threads(1)
    cfg21 = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
    cfg64 = PreprocessConfig.from_dict({**cfg21.to_dict(), "channels": list(get_profile("lab64").channels)})
    out = {
        "subjects": [f"S{s:03d}" for s in SUBJECTS],
        "ns_floor": NS_FLOOR,
        "ns_iters": NS_ITERS,
        "sessions_21_channels": sessions_block(cfg21),
        "sessions_64_channels": sessions_block(cfg64),
        "synthetic_64x64_log_spectrum": synthetic_block(),
    }
    path = Path(__file__).with_suffix(".json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
