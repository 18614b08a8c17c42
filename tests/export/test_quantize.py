"""Dynamic int8 quantisation: graph, metadata and the accuracy cost on real held-out trials."""

from __future__ import annotations

import onnx
import pytest

from neurofed.export.metadata import read_onnx_meta
from neurofed.export.onnx_export import held_out_data
from neurofed.export.quantize import accuracy_delta, quantize
from neurofed.trainer.checkpoint import read_meta
from neurofed.trainer.errors import NeuroFedError


@pytest.mark.parametrize("ops", ["all", "linear"])
def test_quantize_and_accuracy_delta(eegnet_bs, tmp_path, data_dir, ops):
    ckpt, fp32 = eegnet_bs
    q = quantize(fp32, tmp_path / "q.onnx", ops)
    types = {n.op_type for n in onnx.load(str(q)).graph.node}
    assert "MatMulInteger" in types
    assert ("ConvInteger" in types) == (ops == "all")
    assert "BatchNormalization" in types and "ReduceMean" in types  # batch-specific BN kept in float
    assert read_onnx_meta(q).quantized == f"dynamic int8 ({ops})"
    X, y, _, _ = held_out_data(read_meta(ckpt), data_dir)
    d = accuracy_delta(fp32, q, X, y)
    assert d["n_trials"] == 45 and 0 <= d["bca_int8"] <= 1
    assert d["agreement"] >= 0.8  # int8 rounding flips few decisions
    assert d["max_abs_logit_diff"] < 0.5


def test_unknown_quant_scope(eegnet_bs, tmp_path):
    with pytest.raises(NeuroFedError, match="choose from"):
        quantize(eegnet_bs[1], tmp_path / "q.onnx", "everything")
