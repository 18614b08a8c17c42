"""The scikit-learn wrappers are honest: a federated fit without groups is refused (or, allowed, warned about),
groups come as ``groups=`` or MOABB's ``subjects=``, scoring a training subject warns, and a batch-specific-BN model
scored on fewer trials than its test batch warns. Real EEGMMIDB trials (S001-S004)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from neurofed_runtime.errors import SmallBatchWarning

from neurofed.trainer.data import SENSORIMOTOR_21
from neurofed.trainer.errors import DataError
from neurofed.trainer.sklearn_api import NeuroFedClassifier


def _data(subjects4, n=3):
    X = np.concatenate([sd.X for sd in subjects4[:n]])  # already 80 Hz / 21 channels
    y = np.array(["left", "right"])[np.concatenate([sd.y for sd in subjects4[:n]])]
    subj = np.concatenate([[i + 1] * len(sd.y) for i, sd in enumerate(subjects4[:n])])
    return X, y, subj


def _clf(algorithm="fedavg", **kw):
    return NeuroFedClassifier(algorithm=algorithm, rounds=1, sfreq=80.0, ch_names=list(SENSORIMOTOR_21),
                              resample=None, fraction=1.0, **kw)


def test_federated_fit_without_groups_is_refused_or_warned(subjects4):
    X, y, _ = _data(subjects4)
    with pytest.raises(DataError, match="fedavg: federated training got no groups.*allow_pooled=True"):
        _clf().fit(X, y)  # what MOABB's evaluations call
    with pytest.warns(UserWarning, match="training centrally on the pooled trials") as rec:
        clf = _clf(allow_pooled=True).fit(X, y)
    assert len(rec) == 1 and clf.training_subjects_ is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NeuroFedClassifier(algorithm="ct", rounds=1, sfreq=80.0, ch_names=list(SENSORIMOTOR_21), resample=None,
                           ct_batch_size=16).fit(X, y)  # centralised on purpose: nothing to warn about


def test_subjects_are_groups_and_scoring_a_training_subject_warns(subjects4):
    X, y, subj = _data(subjects4)
    clf = _clf().fit(X, y, subjects=subj)  # MOABB's target-aware evaluation passes `subjects`
    assert clf.training_subjects_ == {"S001", "S002", "S003"}
    held = subjects4[3]
    yh = np.array(["left", "right"])[held.y]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        acc = clf.score(held.X, yh, subjects=np.full(len(yh), "S004"))
    assert 0.0 <= acc <= 1.0
    with pytest.warns(UserWarning, match=r"scoring subjects the model was trained on \(S002\)"):
        clf.score(X[subj == 2], y[subj == 2], subjects=subj[subj == 2])


def test_scoring_fewer_trials_than_the_test_batch_warns(subjects4):
    X, y, subj = _data(subjects4)
    clf = _clf("fedbs").fit(X, y, groups=subj)  # FedBS keeps batch-specific BN
    with pytest.warns(SmallBatchWarning, match=r"1 trial\(s\) scored with a batch-specific-BN model") as rec:
        clf.predict_proba(subjects4[3].X[:1])
    assert "\n" not in str(rec[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBatchWarning)
        clf.predict_proba(subjects4[3].X[:8])
