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


def logits_many(model: nn.Module, Xs: list[np.ndarray], batch_size: int = 8) -> list[np.ndarray]:
    """:func:`logits` of several trial sets (e.g. every held-out subject of a fold) in few calls.

    Each set is cut into consecutive batches of ``batch_size`` exactly as :func:`logits` cuts it (with batch-specific
    BN a trial's output depends on its batch), and every batch of one size, across all sets, goes through the model
    in one vmapped call (:func:`torch.func.vmap`: BN statistics per batch). Equal to :func:`logits` per set to
    float rounding.
    """
    from torch.func import vmap  # here: torch.func loads functorch (not needed by the one-set path)

    model.eval()
    cuts = [[(i, min(i + batch_size, len(X))) for i in range(0, len(X), batch_size)] for X in Xs]
    by_size: dict[int, list[tuple[int, int]]] = {}
    for s, cs in enumerate(cuts):
        for j, (a, b) in enumerate(cs):
            by_size.setdefault(b - a, []).append((s, j))
    out: list[list[np.ndarray | None]] = [[None] * len(cs) for cs in cuts]
    with torch.no_grad():
        for members in by_size.values():
            xb = torch.stack([torch.as_tensor(Xs[s][slice(*cuts[s][j])]) for s, j in members])
            res = vmap(model)(xb).numpy()
            for (s, j), r in zip(members, res):
                out[s][j] = r
    return [np.concatenate(o) if o else np.zeros((0, 0), np.float32) for o in out]


def predict_many(model: nn.Module, Xs: list[np.ndarray], batch_size: int = 8) -> list[np.ndarray]:
    """:func:`predict` of several trial sets in few calls (:func:`logits_many`)."""
    return [lg.argmax(1) for lg in logits_many(model, Xs, batch_size)]


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
