"""Ensemble distillation inside each client's local training (issue 57: one model with an ensemble's knowledge).

An ensemble of federated models decodes held-out subjects better than any member (studies/table46: six models,
+1.7 points over SAFE), but it costs one full pass per member at every window. Distillation trains one model to
match the ensemble (Hinton, Vinyals, Dean 2015). Federated, nothing leaves a client: the teachers are global models
the federation released earlier (every client already holds them); each client decodes its own trials with them,
once, as a deployment decodes (eval mode, consecutive batches of the test batch size, so batch-specific BN sees
the batches it was built for), and trains on the soft targets

    q = (1 - w) * onehot(y) + w * mean_t softmax(teacher_t(x))

with the usual cross-entropy ``-sum_c q_c log p_c``. This is Hinton's loss at temperature 1: ``(1 - w) CE(y) + w
KL(teacher || student)`` plus a constant (the teachers' entropy), so every engine and every loss that takes
class-probability targets (``torch.nn.functional.cross_entropy``; FGSM's and mixup's included) distils without a
code path of its own. A temperature above 1 would soften the teachers further; with two classes and teachers at
60-80 % confidence on training trials it was not needed and is not offered.

The student is an ordinary model of the run's architecture: its export, standalone graph and per-window cost are
those of the same model trained without distillation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import nn


def teacher_probabilities(teachers: Sequence[nn.Module], X: np.ndarray, batch_size: int) -> np.ndarray:
    """The mean of the teachers' softmax outputs on ``X`` (eval mode, consecutive batches of ``batch_size``)."""
    from scipy.special import softmax

    from neurofed.trainer.evaluate import logits  # one decoding path: the evaluation's

    if not teachers:
        raise ValueError("distillation needs at least one teacher")
    return np.mean([softmax(logits(t, X, batch_size), axis=1) for t in teachers], axis=0)


def soft_targets(y: np.ndarray, probs: np.ndarray, weight: float) -> np.ndarray:
    """``(1 - weight) * onehot(y) + weight * probs`` as float32 (trials, classes); rows sum to 1.

    Raises
    ------
    ValueError
        ``weight`` outside [0, 1], or ``probs`` not one row of class probabilities per label.
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"distill weight must be in [0, 1], got {weight}")
    y = np.asarray(y)
    if probs.ndim != 2 or len(probs) != len(y) or (len(y) and int(y.max()) >= probs.shape[1]):
        raise ValueError(f"teacher probabilities of shape {probs.shape} do not fit {len(y)} labels")
    onehot = np.eye(probs.shape[1], dtype=np.float64)[y]
    return ((1.0 - weight) * onehot + weight * probs).astype(np.float32)


def is_soft(y: np.ndarray) -> bool:
    """Whether ``y`` holds class-probability targets (trials, classes) rather than class indices."""
    return np.asarray(y).ndim == 2


__all__ = ["is_soft", "soft_targets", "teacher_probabilities"]
