"""Dynamic int8 quantisation of exported models and its accuracy cost on real held-out trials.

``onnxruntime.quantization.quantize_dynamic`` stores weights as int8 and quantises activations
on the fly. With ``ops="all"`` Conv becomes ConvInteger and Gemm/MatMul become MatMulInteger
(onnxruntime's CPU provider runs both); ``ops="linear"`` quantises only the classifier
(Gemm/MatMul) and keeps convolutions in float. BatchNormalization and its in-graph batch
statistics (ReduceMean) stay in float either way.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx

from neurofed.export.metadata import embed_meta, meta_from_model
from neurofed.export.runtime import OnnxModel
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.evaluate import bca

QUANT_OPS: dict[str, list[str] | None] = {"all": None, "linear": ["Gemm", "MatMul"]}


def quantize(src: str | os.PathLike, dst: str | os.PathLike, ops: str = "all") -> Path:
    """Write a dynamically int8-quantised copy of ``src`` to ``dst`` (metadata kept, ``quantized`` set)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if ops not in QUANT_OPS:
        raise NeuroFedError(f"quantisation ops {ops!r}: choose from {sorted(QUANT_OPS)}")
    proto = onnx.load(str(src))
    meta = meta_from_model(proto, str(src))
    # the exporter's value_info conflicts with the quantiser's shape inference (Gemm shapes): drop it
    del proto.graph.value_info[:]
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain.onnx"
        onnx.save(proto, str(plain))
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantiser logs a pre-processing hint on the root logger
        try:
            quantize_dynamic(
                str(plain),
                str(Path(tmp) / "q.onnx"),
                weight_type=QuantType.QInt8,
                op_types_to_quantize=QUANT_OPS[ops],
            )
        except Exception as exc:
            raise NeuroFedError(f"int8 quantisation of {src} failed: {exc}") from None
        finally:
            root.setLevel(level)
        q = onnx.load(str(Path(tmp) / "q.onnx"))
    embed_meta(q, meta.model_copy(update={"quantized": f"dynamic int8 ({ops})"}))
    onnx.save(q, str(dst))
    return dst


def accuracy_delta(fp32: str | os.PathLike, int8: str | os.PathLike, X: np.ndarray, y: np.ndarray) -> dict:
    """BCA of both models on ``(X, y)`` (test batch from metadata), agreement and max logit change."""

    a, b = OnnxModel(fp32), OnnxModel(int8)
    la, lb = a.logits(X), b.logits(X)
    pa, pb = la.argmax(1), lb.argmax(1)
    return {
        "n_trials": len(X),
        "bca_fp32": bca(y, pa),
        "bca_int8": bca(y, pb),
        "bca_delta": bca(y, pb) - bca(y, pa),
        "agreement": float((pa == pb).mean()),
        "max_abs_logit_diff": float(np.abs(la - lb).max()),
        "size_fp32_bytes": Path(fp32).stat().st_size,
        "size_int8_bytes": Path(int8).stat().st_size,
    }
