"""Evaluation protocols over subjects: leave-one-subject-out, subject-wise k-fold, or none."""

from __future__ import annotations

import numpy as np


def make_folds(subjects: list[int], protocol: str, seed: int = 0) -> list[list[int]]:
    """Held-out subject groups.

    Parameters
    ----------
    subjects : list of int
    protocol : str
        ``loso`` (one fold per subject), ``kfold:K`` (K groups of held-out subjects, drawn with a
        fixed seed), or ``none`` (one fold with no held-out subject: train on all, ship the model).
    seed : int
        Seed of the k-fold grouping (fixed across algorithms so comparisons are paired).
    """
    subjects = sorted(subjects)
    if protocol == "loso":
        return [[s] for s in subjects]
    if protocol == "none":
        return [[]]
    if protocol.startswith("kfold:"):
        k = int(protocol.split(":", 1)[1])
        if not 2 <= k <= len(subjects):
            raise ValueError(f"kfold needs 2 <= K <= {len(subjects)} subjects, got K={k}")
        perm = np.random.default_rng(seed).permutation(subjects)
        return [sorted(int(s) for s in g) for g in np.array_split(perm, k)]
    raise ValueError(f"unknown protocol {protocol!r}: use loso, kfold:K or none")
