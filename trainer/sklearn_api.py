"""NeuroFed models as scikit-learn estimators, for MOABB evaluations and sklearn pipelines.

Both take raw epochs ``X`` of shape (n_trials, n_channels, n_times) at ``sfreq`` with channels named
``ch_names`` in microvolts (MOABB's paradigms give microvolts; ``scale=1e6`` converts MNE's volts), apply
NeuroFed's preprocessing (channels, band-pass, resampling) and Euclidean alignment over the trials of
each ``fit``/``predict`` call (MOABB predicts one subject's session at a time, i.e. per-subject EA),
and predict in consecutive test batches (batch-specific BN).

* :class:`NeuroFedCheckpointClassifier`: a trained NeuroFed checkpoint (e.g. FedBS/SAFE EEGNet from
  ``neurofed simulate --test-subjects none``); ``fit`` only learns the label order.
* :class:`NeuroFedClassifier`: trains NeuroFed's model and local rule of a strategy on ``fit``'s data:
  centrally (CT), or federated with one client per group when ``fit(X, y, groups=...)`` names subjects.

Honest by default:

* a federated algorithm needs to know whose trials are whose: ``fit(X, y, groups=subject_ids)``, or
  ``subjects=`` (MOABB's target-aware cross-subject evaluation passes ``subjects`` to an estimator whose ``fit``
  accepts it). Plain MOABB evaluations call ``fit(X, y)`` with neither: that is refused in one line, unless
  ``allow_pooled=True`` (then one warning, and the training pools all trials as one client: centralised);
* both know the subjects they were trained on (``training_subjects_``: the checkpoint's ``data_hashes``, or
  ``fit``'s groups), and ``score(X, y, subjects=...)`` warns when it scores one of them;
* a batch-specific-BN model scored on fewer trials than its test batch is warned about (one line,
  :class:`neurofed_runtime.errors.SmallBatchWarning`): its statistics then come from too few windows.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
from neurofed_runtime.errors import SmallBatchWarning
from sklearn.base import BaseEstimator, ClassifierMixin

from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.dataset import SubjectData
from neurofed.trainer.data.preprocess import euclidean_alignment, n_times_for, preprocess_epochs
from neurofed.trainer.errors import DataError, NeuroFedError
from neurofed.trainer.model_meta import subject_id, training_subjects


def _prepare(X: np.ndarray, sfreq: float, ch_names: Sequence[str], pre: PreprocessConfig, scale: float) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64) * scale
    if X.ndim != 3 or X.shape[1] != len(ch_names):
        raise DataError(f"X must be (trials, {len(ch_names)} channels, times) matching ch_names, got {X.shape}")
    n = n_times_for(sfreq, pre)
    if X.shape[2] < n:
        raise DataError(f"X has {X.shape[2]} samples per trial; the model needs {pre.tmax - pre.tmin:g} s = {n} "
                        f"at {sfreq:g} Hz (e.g. a MOABB paradigm with tmax={pre.tmax - pre.tmin:g})")
    X = X[..., :n]  # MOABB's epochs include the end sample
    x, _, _ = preprocess_epochs(X, sfreq, ch_names, pre)
    if pre.ea:
        x = euclidean_alignment(x)
    return x.astype(np.float32)


def _proba(model, x: np.ndarray, batch: int) -> np.ndarray:
    from scipy.special import softmax

    from neurofed.trainer.evaluate import logits  # lazy: torch (loaded only when used)
    from neurofed.trainer.models import bn_mode_of  # lazy: torch (loaded only when used)

    if 0 < len(x) < batch and bn_mode_of(model) == "batch_specific":
        warnings.warn(f"{len(x)} trial(s) scored with a batch-specific-BN model whose test batch is {batch}: its BN "
                      "statistics come from fewer windows than it was evaluated with (score whole sessions, or "
                      "decode one window at a time with the standalone export)", SmallBatchWarning, stacklevel=3)
    return softmax(logits(model, x, batch), axis=1)


def _subject_ids(values) -> set[str]:
    """Subject ids as ``SNNN`` where they are subject numbers (3, "S3", "S003"), else as given."""
    out = set()
    for v in np.unique(np.asarray(values).astype(str)):
        try:
            out.add(subject_id(v))
        except NeuroFedError:
            out.add(v)
    return out


def _warn_scored_training_subjects(trained: set[str] | None, subjects) -> None:
    """One warning when ``subjects`` (the scored trials' subject ids) include subjects the model trained on."""
    if subjects is None or not trained:
        return
    seen = sorted(_subject_ids(subjects) & trained)
    if seen:
        warnings.warn(f"scoring subjects the model was trained on ({', '.join(seen)}): their scores are "
                      "training-set scores, not accuracy estimates", UserWarning, stacklevel=3)


class _Scoring:
    """``score(X, y, subjects=None)``: accuracy, warning when a scored subject is in ``training_subjects_``."""

    training_subjects_: set[str] | None = None

    def score(self, X: np.ndarray, y: np.ndarray, sample_weight=None, subjects=None) -> float:
        _warn_scored_training_subjects(self.training_subjects_, subjects)
        return super().score(X, y, sample_weight=sample_weight)  # type: ignore[misc]


class NeuroFedCheckpointClassifier(_Scoring, ClassifierMixin, BaseEstimator):
    """A trained NeuroFed checkpoint as a classifier.

    Parameters
    ----------
    checkpoint : str
        ``.safetensors`` checkpoint written by NeuroFed (preprocessing, channels, test batch in its metadata).
    sfreq : float
        Sampling rate of ``X``.
    ch_names : sequence of str
        Channel names of ``X`` (must include the model's channels).
    scale : float
        Factor to microvolts (1 for MOABB paradigm data, 1e6 for MNE epochs in volts).
    classes : sequence or None
        Labels of ``y`` in the model's class order (default: ``fit``'s sorted labels).
    """

    def __init__(self, checkpoint: str, sfreq: float = 160.0, ch_names: Sequence[str] = (), scale: float = 1.0,
                 classes: Sequence | None = None) -> None:
        self.checkpoint = checkpoint
        self.sfreq = sfreq
        self.ch_names = ch_names
        self.scale = scale
        self.classes = classes

    def fit(self, X: np.ndarray, y: np.ndarray) -> NeuroFedCheckpointClassifier:
        """No training: checks the model and learns which label is which output (and, from the checkpoint's
        ``data_hashes``, which subjects it was trained on: ``training_subjects_``)."""
        from neurofed.trainer.checkpoint import load_checkpoint  # lazy: torch (loaded only when used)

        self.model_, self.meta_ = load_checkpoint(self.checkpoint)
        self.training_subjects_ = training_subjects(self.meta_)[0]
        self.classes_ = np.asarray(self.classes if self.classes is not None else np.unique(y))
        if len(self.classes_) != self.meta_.n_classes:
            raise DataError(f"{len(self.classes_)} labels but the checkpoint has {self.meta_.n_classes} classes")
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Softmax of the logits, columns in ``classes_`` order (test batches of the model's size)."""
        pre = PreprocessConfig.from_dict(self.meta_.preprocess)
        return _proba(self.model_, _prepare(X, self.sfreq, list(self.ch_names), pre, self.scale),
                      self.meta_.test_batch_size)

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.classes_[self.predict_proba(X).argmax(1)]


class NeuroFedClassifier(_Scoring, ClassifierMixin, BaseEstimator):
    """NeuroFed's model trained with a strategy's local rule on ``fit``'s data.

    Parameters
    ----------
    algorithm : str
        A NeuroFed strategy (``ct`` = centralised with plain local training; ``fedavg``, ``fedbs``, ``safe``...).
    model : str
        ``eegnet``, ``shallow`` or ``deep``.
    rounds : int
        Communication rounds (or CT epochs).
    sfreq, ch_names, scale :
        As for :class:`NeuroFedCheckpointClassifier`.
    channels, resample, fmin, fmax : preprocessing (NeuroFed's reduced protocol by default).
    lr, batch_size, local_epochs, fraction, test_batch, seed : training settings.
    allow_pooled : bool
        Let a federated ``algorithm`` train on ``fit(X, y)`` without groups (one warning; all trials pooled as one
        client: centralised training). Default: refused, since the result would not be federated.
    """

    def __init__(self, algorithm: str = "fedbs", model: str = "eegnet", rounds: int = 50, sfreq: float = 160.0,
                 ch_names: Sequence[str] = (), scale: float = 1.0, channels: str = "sensorimotor21",
                 resample: float | None = 80.0, fmin: float = 8.0, fmax: float = 30.0, lr: float = 0.05,
                 batch_size: int = 8, ct_batch_size: int = 64, local_epochs: int = 2, fraction: float = 0.5,
                 test_batch: int = 8, seed: int = 0, allow_pooled: bool = False) -> None:
        self.algorithm = algorithm
        self.model = model
        self.rounds = rounds
        self.sfreq = sfreq
        self.ch_names = ch_names
        self.scale = scale
        self.channels = channels
        self.resample = resample
        self.fmin = fmin
        self.fmax = fmax
        self.lr = lr
        self.batch_size = batch_size
        self.ct_batch_size = ct_batch_size
        self.local_epochs = local_epochs
        self.fraction = fraction
        self.test_batch = test_batch
        self.seed = seed
        self.allow_pooled = allow_pooled

    def _pre(self, n_times: int) -> PreprocessConfig:
        return PreprocessConfig.from_preset(self.channels, resample=self.resample, fmin=self.fmin, fmax=self.fmax,
                                            tmin=0.0, tmax=n_times / self.sfreq)

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None,
            subjects: np.ndarray | None = None) -> NeuroFedClassifier:
        """Train: one federated client per group (``groups``, or ``subjects`` as MOABB's target-aware evaluation
        passes them), or centrally for ``ct``.

        A federated algorithm without groups is refused (``allow_pooled=True``: trained centrally, with a warning).
        EA runs per group (per subject) when groups are given, else over all of ``X``.
        """
        from neurofed.trainer.experiments.runner import (  # lazy: torch (loaded only when used)
            run_centralised,
            run_federated,
        )
        from neurofed.trainer.fl.local import LocalConfig  # lazy: torch (loaded only when used)
        from neurofed.trainer.fl.strategies import get_strategy  # lazy: torch (loaded only when used)

        X, y = np.asarray(X), np.asarray(y)
        self.classes_, yi = np.unique(y, return_inverse=True)
        pre = self._pre(X.shape[2])
        if groups is None:
            groups = subjects
        n_groups = 0 if groups is None else len(np.unique(np.asarray(groups)))
        if self.algorithm != "ct" and n_groups < 2:
            why = "no groups" if groups is None else "one group"
            if not self.allow_pooled:
                raise DataError(f"{self.algorithm}: federated training got {why} (MOABB calls fit(X, y)): pass "
                                "fit(X, y, groups=subject_ids) (or subjects=...), use algorithm='ct', or "
                                "allow_pooled=True to train centrally on the pooled trials")
            warnings.warn(f"{self.algorithm}: federated training got {why}: training centrally on the pooled "
                          "trials (allow_pooled=True); the result is not a federated model", UserWarning,
                          stacklevel=2)
        groups = np.zeros(len(y), dtype=int) if groups is None else np.asarray(groups)
        self.training_subjects_ = None if n_groups == 0 else _subject_ids(groups)
        clients = {}
        for g in np.unique(groups):
            m = groups == g
            x = _prepare(X[m], self.sfreq, list(self.ch_names), pre, self.scale)
            clients[f"S{len(clients):03d}"] = SubjectData(str(g), x, yi[m].astype(np.int64),
                                                          tuple(map(str, self.classes_)),
                                                          float(self.resample or self.sfreq), list(pre.channels or []))
        strategy = get_strategy(self.algorithm)
        if self.algorithm == "ct" or len(clients) == 1:
            local = LocalConfig(lr=self.lr, batch_size=self.ct_batch_size, local_epochs=1)
            self.model_, _ = run_centralised(list(clients.values()), self.model, strategy, local, self.rounds, self.seed)
        else:
            local = LocalConfig(lr=self.lr, batch_size=self.batch_size, local_epochs=self.local_epochs)
            self.model_, _ = run_federated(clients, self.model, strategy, local, self.rounds, self.fraction, self.seed)
        self.pre_ = pre
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Softmax of the logits, columns in ``classes_`` order (MOABB scores binary tasks by ROC AUC)."""
        return _proba(self.model_, _prepare(X, self.sfreq, list(self.ch_names), self.pre_, self.scale), self.test_batch)

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.classes_[self.predict_proba(X).argmax(1)]
