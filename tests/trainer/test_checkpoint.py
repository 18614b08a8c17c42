"""Checkpoints: safetensors + JSON round trip, no pickle, clear errors."""

from __future__ import annotations

import pytest
import torch

from neurofed.trainer.checkpoint import ModelMeta, load_checkpoint, read_meta, save_checkpoint
from neurofed.trainer.errors import NeuroFedError


def test_round_trip(tmp_path):
    meta = ModelMeta("eegnet", 21, 2, 320, 80.0, "batch_specific", [f"C{i}" for i in range(21)], ["l", "r"],
                     {"fmin": 8.0}, "fedbs", 8, {"a.edf": "00"}, {"round": 3})
    model = meta.build()
    p = save_checkpoint(tmp_path / "m.safetensors", model.state_dict(), meta)
    assert p.read_bytes()[8:9] == b"{"  # safetensors: 8-byte length then a JSON header, no pickle
    m2, meta2 = load_checkpoint(p)
    assert meta2 == meta and read_meta(p).strategy == "fedbs"
    for k, v in model.state_dict().items():
        torch.testing.assert_close(m2.state_dict()[k], v)
    assert not list(tmp_path.glob("*.tmp"))


def test_not_a_checkpoint(tmp_path):
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"\x80\x04pickle")
    with pytest.raises(NeuroFedError, match="x.safetensors"):
        load_checkpoint(bad)


def test_meta_fields_follow_modelmeta():
    from dataclasses import fields

    from neurofed.trainer.checkpoint import MODEL_FIELDS, meta_fields

    allf = meta_fields()
    assert list(allf) == [f.name for f in fields(ModelMeta)]
    assert allf["model"] == (str, ...) and allf["test_batch_size"] == (int, 8) and allf["preprocess"][1] == {}
    assert list(meta_fields(MODEL_FIELDS)) == list(MODEL_FIELDS)
    with pytest.raises(NeuroFedError, match="no fields"):
        meta_fields(["model", "weights"])
