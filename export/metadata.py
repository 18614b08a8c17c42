"""Metadata embedded in exported ONNX models (``metadata_props``, key ``neurofed``, JSON).

Everything a consumer needs to feed the model correctly travels inside the ``.onnx`` file: the
checkpoint's own model description (:class:`neurofed.trainer.checkpoint.ModelMeta`: channel order,
sampling rate, classes, preprocessing, test batch size, strategy, training data hashes) plus
what the export adds (band-pass/window, EA policy, a hash of the weights, and for standalone
graphs the state layout).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Mapping
from dataclasses import asdict

import onnx
import torch

from neurofed.export.runtime import (  # the model card's reader is the runtime's (no torch); re-exported here
    INPUT_NAME,
    META_KEY,
    OUTPUT_NAME,
    ModelCard,
    OnnxModelMeta,
    meta_from_model,
    read_onnx_meta,
)
from neurofed.trainer.checkpoint import ModelMeta, device_of


def model_hash(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of the weights: every tensor (sorted by key) as name, dtype, shape and raw bytes."""
    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k].detach().cpu().contiguous()
        h.update(k.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()


def package_version() -> str:
    """The installed NeuroFed distribution's version (without importing the CLI package)."""
    try:
        return importlib.metadata.version("neurofed")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_meta(ckpt_meta: ModelMeta, state: Mapping[str, torch.Tensor]) -> OnnxModelMeta:
    """ONNX metadata: the checkpoint's :class:`~neurofed.trainer.checkpoint.ModelMeta` plus what export adds."""

    device = device_of(ckpt_meta)
    pre = dict(ckpt_meta.preprocess or {})
    ea = bool(pre.get("ea", False))
    ea_policy = (
        {
            "train": "per-subject: R^-1/2 of the mean covariance of all of that subject's trials",
            "online": "running mean of the covariances of the user's own windows (identity or an offline "
            "reference first; ABAT-style)",
        }
        if ea
        else {"train": "none", "online": "none"}
    )
    return OnnxModelMeta(
        **asdict(ckpt_meta),
        bandpass=(float(pre.get("fmin", 0.0)), float(pre.get("fmax", 0.0))),
        window=(float(pre.get("tmin", 0.0)), float(pre.get("tmax", 0.0))),
        ea_policy=ea_policy,
        model_hash=model_hash(state),
        neurofed_version=package_version(),
        profile=device.to_dict() if device is not None else None,
    )


def embed_meta(model: onnx.ModelProto, meta: OnnxModelMeta) -> None:
    """Write ``meta`` as JSON under ``metadata_props['neurofed']`` (replacing any previous one)."""
    keep = [p for p in model.metadata_props if p.key != META_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in keep}, META_KEY: meta.model_dump_json()})


__all__ = ["INPUT_NAME", "META_KEY", "OUTPUT_NAME", "ModelCard", "OnnxModelMeta", "build_meta", "embed_meta",
           "meta_from_model", "model_hash", "package_version", "read_onnx_meta"]
