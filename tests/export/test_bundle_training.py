"""``neurofed app bundle`` marks recordings the model was trained on (its data_hashes): the bundle's metadata says
which sessions are training data, so a page or script scoring them can say so. The fixture model trained on
S001-S002 (tests/export/conftest.py)."""

from __future__ import annotations

import json
import logging

from neurofed.export.apps import make_bundle


def test_bundle_marks_training_recordings(eegnet_bs, tmp_path, data_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="neurofed.export"):
        make_bundle(eegnet_bs[0], 1, tmp_path / "s1", data_dir)
    doc = json.loads((tmp_path / "s1" / "recording.json").read_text())
    assert doc["sessions"] and all(s["trained_on"] is True for s in doc["sessions"])
    assert doc["training_data_source"] == "model metadata (data_hashes)"
    assert any("S001: the model was trained on these recordings" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="neurofed.export"):
        make_bundle(eegnet_bs[0], 3, tmp_path / "s3", data_dir)
    doc = json.loads((tmp_path / "s3" / "recording.json").read_text())
    assert [s["trained_on"] for s in doc["sessions"]] == [False, False, False]
    assert not [r for r in caplog.records if "trained on" in r.getMessage()]
