"""neurofed_runtime.model: loading and checking exported models (one-line errors), the standalone run, the plain
graph's minimum batch. Real exports of a checkpoint trained on real EEGMMIDB trials."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from neurofed_runtime import ModelError, NeuroFedError, PlainModel, SmallBatchWarning, StandaloneModel, load
from neurofed_runtime.model import open_model

from neurofed.export.decoder import StandaloneModel as MainStandaloneModel
from neurofed.export.runtime import OnnxModel
from tests.runtime.conftest import eight_channel_card, with_card


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


def test_load_picks_the_kind_by_metadata(eegnet_bs, standalone_model):
    plain, sa = load(eegnet_bs[1]), load(standalone_model)
    assert isinstance(plain, PlainModel) and isinstance(sa, StandaloneModel)
    assert sa.card.n_channels == 21 and sa.info.rate == 160.0 and sa.info.window_samples == 640
    assert plain.card.classes == sa.card.classes == ["left_fist", "right_fist"]
    assert sa.card.min_windows == 1 and plain.min_windows == 8  # batch-specific BN, test batch 8


def test_the_main_package_runs_the_runtime(eegnet_bs, standalone_model):
    """One implementation: neurofed's classes are the runtime's, with the full (pydantic) model card as meta."""
    assert issubclass(MainStandaloneModel, StandaloneModel) and issubclass(OnnxModel, PlainModel)
    m = MainStandaloneModel(standalone_model)
    assert m.meta.model_hash == m.card.model_hash and m.meta.ch_names == m.card.ch_names
    assert m.meta.standalone == m.card.standalone


def test_missing_and_unreadable_files_are_one_line(tmp_path):
    with pytest.raises(ModelError, match="missing.onnx: ONNX model file not found") as exc:
        StandaloneModel(tmp_path / "missing.onnx")
    _one_line(exc)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx at all")
    with pytest.raises(ModelError, match="bad.onnx: not a readable ONNX model") as exc:
        load(bad)
    _one_line(exc)


def test_graph_metadata_mismatch_is_one_line(eegnet_bs, standalone_model, tmp_path):
    """A card declaring 8 channels on a 21-channel graph: refused on load, before onnxruntime sees a window."""
    for src in (eegnet_bs[1], standalone_model):
        bad = eight_channel_card(src, tmp_path / f"bad_{src.name}")
        with pytest.raises(ModelError, match="metadata declares 8 channels but the graph's input") as exc:
            load(bad)
        assert "has 21" in _one_line(exc)
        with pytest.raises(ModelError):
            open_model(bad)
    wrong_classes = with_card(standalone_model, tmp_path / "classes.onnx", n_classes=3,
                              classes=["left_fist", "right_fist", "feet"])
    with pytest.raises(ModelError, match="declares 3 classes") as exc:
        StandaloneModel(wrong_classes)
    _one_line(exc)


def test_invalid_or_missing_card_is_one_line(standalone_model, tmp_path):
    bad = with_card(standalone_model, tmp_path / "card.onnx", n_channels="21")
    with pytest.raises(ModelError, match="invalid NeuroFed metadata") as exc:
        load(bad)
    _one_line(exc)
    inconsistent = with_card(standalone_model, tmp_path / "names.onnx", ch_names=["C3", "C4"])
    with pytest.raises(ModelError, match="2 channel names for n_channels 21"):
        load(inconsistent)
    import onnx

    proto = onnx.load(str(standalone_model))
    del proto.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    bare.write_bytes(proto.SerializeToString())
    with pytest.raises(ModelError, match="has no 'neurofed' metadata"):
        load(bare)


def test_kind_mismatch_is_refused(eegnet_bs, standalone_model):
    with pytest.raises(ModelError, match="not a standalone export"):
        StandaloneModel(eegnet_bs[1])
    with pytest.raises(ModelError, match="a standalone model"):
        PlainModel(standalone_model)


def test_state_is_carried_and_checked(standalone_model, data_dir):
    from neurofed.export.standalone import eegmmidb_session_windows

    m = StandaloneModel(standalone_model)
    (_, ws, _, _), *_ = eegmmidb_session_windows(3, list(m.card.ch_names), list(m.card.classes), 0.0, 4.0, data_dir)
    s0 = m.initial_state()
    p, s1 = m.run(ws[0], s0)
    assert p.shape == (2,) and abs(float(p.sum()) - 1) < 1e-5 and not np.array_equal(s0, s1)
    with pytest.raises(NeuroFedError, match="state belongs to another model"):
        m.run(ws[1], np.zeros_like(s1))
    with pytest.raises(NeuroFedError, match="window shape"):
        m.run(ws[1][:8], s1)


def test_plain_batch_specific_graph_warns_below_its_minimum_batch(eegnet_bs, data_dir):
    """The batch-1 trap: a plain export of a batch-specific-BN model fed one window warns once (strict: refuses)."""
    m = PlainModel(eegnet_bs[1])
    x = np.random.default_rng(0).standard_normal((8, 21, 320)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.forward(x)  # a whole batch: no warning
    with pytest.warns(SmallBatchWarning, match=r"1 window\(s\) in one batch.*needs >= 8.*standalone") as rec:
        m.forward(x[:1])
        m.forward(x[:1])
    assert len(rec) == 1 and "\n" not in str(rec[0].message)
    strict = PlainModel(eegnet_bs[1], strict=True)
    with pytest.raises(NeuroFedError, match="needs >= 8"):
        strict.logits(x[:3])
    assert strict.logits(x).shape == (8, 2)


def test_the_card_names_both_rates_and_the_graph_describes_itself(eegnet_bs, standalone_model):
    """ONNX metadata other tools read: a real model_version (not the exporter's 2**63 - 1), a doc_string, and the
    training rate vs the input rate named (80 Hz network, 160 Hz device for the standalone graph)."""
    import onnx

    sa, plain = StandaloneModel(standalone_model), PlainModel(eegnet_bs[1])
    assert (sa.card.training_rate_hz, sa.card.input_rate_hz, sa.info.rate) == (80.0, 160.0, 160.0)
    assert (plain.card.training_rate_hz, plain.card.input_rate_hz) == (80.0, 80.0)
    assert "training_rate_hz" in sa.card.rates_note and "input_rate_hz" in sa.card.rates_note
    assert plain.card.min_batch == 8 and sa.card.min_batch is None
    for path, words in ((standalone_model, "Standalone decoder"), (eegnet_bs[1], "feed at least 8 windows")):
        proto = onnx.load(str(path), load_external_data=False)
        assert proto.model_version == 1 and words in proto.doc_string and "left_fist" in proto.doc_string
        meta = sa.session.get_modelmeta() if path == standalone_model else plain.session.get_modelmeta()
        assert meta.version == 1 and meta.description == proto.doc_string
