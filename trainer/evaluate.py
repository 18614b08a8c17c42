"""Evaluation: predictions with a fixed test batch (batch-specific BN), BCA, attacked BCA."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from neurofed.trainer.attacks import ATTACKS


def bca(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Balanced classification accuracy: mean per-class recall (``sklearn.metrics.balanced_accuracy_score``)."""
    from sklearn.metrics import balanced_accuracy_score  # here: importing sklearn costs a headset host ~1.5 s

    return float(balanced_accuracy_score(np.asarray(y_true), np.asarray(y_pred)))


def predict(model: nn.Module, X: np.ndarray, batch_size: int = 8) -> np.ndarray:
    """Class predictions in eval mode, in consecutive batches of ``batch_size`` (trial order kept).

    With batch-specific BN a trial's output depends on its batch, so the test batch size is part
    of the protocol (8, as in FedBS/SAFE).
    """
    return logits(model, X, batch_size).argmax(1)


def logits(model: nn.Module, X: np.ndarray, batch_size: int = 8) -> np.ndarray:
    """Logits in eval mode, in consecutive batches of ``batch_size``."""
    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(X), batch_size):
            out.append(model(torch.as_tensor(X[i : i + batch_size])).numpy())
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def mean_loss(model: nn.Module, X: np.ndarray, y: np.ndarray, batch_size: int = 8) -> float:
    """Mean cross-entropy over the trials in eval mode (consecutive batches of ``batch_size``); the model's
    train/eval mode is restored afterwards."""
    if len(X) == 0:
        raise ValueError("mean_loss of no trials")
    was_training = model.training
    out = torch.as_tensor(logits(model, X, batch_size))
    model.train(was_training)
    return float(torch.nn.functional.cross_entropy(out, torch.as_tensor(y, dtype=torch.long), reduction="mean"))


def adversarial_batches(
    model: nn.Module, X: np.ndarray, y: np.ndarray, attack: str, eps: float, batch_size: int = 8, seed: int = 0,
) -> list[Tensor]:
    """Adversarial trials built batch by batch (any attack of ``ATTACKS``; batch ``b`` uses seed ``seed + b``).

    Each test batch of ``batch_size`` is attacked as a whole (batch-specific BN: the deployment setting).
    The model's mode (train/eval) is left as it is.
    """
    fn = ATTACKS[attack]
    out = []
    for b, i in enumerate(range(0, len(X), batch_size)):
        xb = torch.as_tensor(X[i : i + batch_size])
        yb = torch.as_tensor(y[i : i + batch_size])
        out.append(fn(model, xb, yb, eps, seed=seed + b))
    return out


def attacked_predict(
    model: nn.Module, X: np.ndarray, y: np.ndarray, attack: str, eps: float, batch_size: int = 8, seed: int = 0,
) -> np.ndarray:
    """Predictions on :func:`adversarial_batches` (eval mode), each batch decoded as it was attacked."""
    model.eval()
    preds = []
    for xa in adversarial_batches(model, X, y, attack, eps, batch_size, seed):
        with torch.no_grad():
            preds.append(model(xa).argmax(1).numpy())
    return np.concatenate(preds)
