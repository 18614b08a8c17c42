"""MOABB offline on the real EDF files: NeuroFed's MOABB path equals its own loader; NeuroFed models in a
MOABB evaluation (sklearn estimators)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("moabb")

from neurofed.trainer.data import PreprocessConfig, load_eegmmidb_subject
from neurofed.trainer.data.moabb_source import eegmmidb_as_mne_data, load_moabb_subject, make_dataset

SUBJECTS = [1, 2, 3]


@pytest.fixture
def mne_data(tmp_path, data_dir, monkeypatch):
    """The shared EDF files laid out as MNE's download folder (symlinks), MOABB told to use the upstream host."""
    target = eegmmidb_as_mne_data(data_dir, tmp_path / "mne_data", SUBJECTS)
    monkeypatch.setenv("MNE_DATA", str(target))
    monkeypatch.setenv("MOABB_DOWNLOAD_PROVIDER", "upstream")
    return target


def test_layout_links_every_run(mne_data, data_dir):
    files = sorted((mne_data / "MNE-eegbci-data/files/eegmmidb/1.0.0/S002").glob("*.edf"))
    assert [f.name for f in files] == ["S002R04.edf", "S002R08.edf", "S002R12.edf"]
    assert all(f.is_symlink() and f.resolve().is_file() for f in files)
    ds = make_dataset("PhysionetMI", 2)
    assert ds.hand_runs == [4, 8, 12] and ds.feet_runs == []  # runs absent from disk dropped


def test_moabb_physionetmi_equals_neurofed_loader(mne_data, data_dir):
    cfg = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
    via_moabb = load_moabb_subject("PhysionetMI", 1, cfg)
    own = load_eegmmidb_subject(1, cfg, data_dir)
    assert via_moabb.classes == ("left_hand", "right_hand") and own.classes == ("left_fist", "right_fist")
    np.testing.assert_array_equal(via_moabb.y, own.y)
    np.testing.assert_allclose(via_moabb.X, own.X, atol=1e-3 * float(np.abs(own.X).max()))


def test_neurofed_model_in_a_moabb_evaluation(mne_data, tmp_path):
    from moabb.evaluations import CrossSubjectEvaluation
    from moabb.paradigms import LeftRightImagery

    from neurofed.trainer.sklearn_api import NeuroFedClassifier

    ds = make_dataset("PhysionetMI", 1)
    ds.subject_list = SUBJECTS
    paradigm = LeftRightImagery(resample=160.0)
    ch_names = paradigm.get_data(ds, [1], return_epochs=True)[0].ch_names
    ev = CrossSubjectEvaluation(paradigm=paradigm, datasets=[ds], overwrite=True,
                                hdf5_path=str(tmp_path / "moabb"), n_jobs=1)
    res = ev.process({"neurofed-ct": NeuroFedClassifier(algorithm="ct", rounds=1, sfreq=160.0, ch_names=ch_names)})
    assert sorted(res["subject"].astype(int)) == SUBJECTS
    assert res["score"].between(0, 1).all() and res["pipeline"].eq("neurofed-ct").all()


def test_federated_fit_with_groups_and_sklearn_clone(subjects4):
    from sklearn.base import clone

    from neurofed.trainer.data import SENSORIMOTOR_21
    from neurofed.trainer.sklearn_api import NeuroFedClassifier

    X = np.concatenate([sd.X for sd in subjects4[:3]])  # already 80 Hz / 21 channels: no resampling
    y = np.array(["left", "right"])[np.concatenate([sd.y for sd in subjects4[:3]])]
    groups = np.concatenate([[i] * len(sd.y) for i, sd in enumerate(subjects4[:3])])
    clf = clone(NeuroFedClassifier(algorithm="fedavg", rounds=1, sfreq=80.0, ch_names=list(SENSORIMOTOR_21),
                                   resample=None, fraction=1.0))
    clf.fit(X, y, groups=groups)
    pred = clf.predict(subjects4[3].X)
    assert set(pred) <= {"left", "right"} and len(pred) == len(subjects4[3].y)
    assert clf.predict_proba(subjects4[3].X[:8]).sum(1) == pytest.approx(np.ones(8), abs=1e-5)


def test_checkpoint_classifier_predicts_like_the_model(subjects4, tmp_path):
    from neurofed.trainer.checkpoint import ModelMeta, save_checkpoint
    from neurofed.trainer.data import SENSORIMOTOR_21
    from neurofed.trainer.data.preprocess import euclidean_alignment, preprocess_epochs
    from neurofed.trainer.errors import DataError
    from neurofed.trainer.evaluate import predict
    from neurofed.trainer.models import build_model
    from neurofed.trainer.sklearn_api import NeuroFedCheckpointClassifier

    sd = subjects4[0]
    pre = PreprocessConfig.from_preset("sensorimotor21", resample=None)
    model = build_model("eegnet", 21, 2, sd.X.shape[2], 80.0, "batch_specific")
    meta = ModelMeta("eegnet", 21, 2, sd.X.shape[2], 80.0, "batch_specific", list(SENSORIMOTOR_21),
                     ["left", "right"], pre.to_dict())
    ckpt = save_checkpoint(tmp_path / "m.safetensors", model.state_dict(), meta)
    clf = NeuroFedCheckpointClassifier(str(ckpt), 80.0, list(SENSORIMOTOR_21)).fit(sd.X, np.array(["l", "r"])[sd.y])
    x = euclidean_alignment(preprocess_epochs(sd.X, 80.0, SENSORIMOTOR_21, pre)[0]).astype(np.float32)
    np.testing.assert_array_equal(clf.predict(sd.X), np.array(["l", "r"])[predict(model, x, 8)])
    with pytest.raises(DataError, match="samples per trial"):
        clf.predict(sd.X[..., :100])
