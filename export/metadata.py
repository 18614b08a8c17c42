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
from neurofed.trainer.model_meta import FORMAT_VERSION

#: what ``training_rate_hz`` and ``input_rate_hz`` mean (written into every card beside them)
RATES_NOTE = ("training_rate_hz: the rate the network was trained at (sfreq, after resampling; n_times samples per "
              "window); input_rate_hz: the rate of the samples the graph's input takes (a plain graph takes "
              "preprocessed windows at the training rate; a standalone graph takes raw device samples at the "
              "device rate and resamples them itself)")


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
        min_batch=int(ckpt_meta.test_batch_size) if ckpt_meta.bn_mode == "batch_specific" else None,
        training_rate_hz=float(ckpt_meta.sfreq),
        input_rate_hz=float(ckpt_meta.sfreq),
        rates_note=RATES_NOTE,
    )


def doc_string(meta: OnnxModelMeta) -> str:
    """The graph's one-paragraph description (ONNX ``doc_string``): what it takes and gives."""
    classes = ", ".join(meta.classes)
    if meta.standalone:
        sa = meta.standalone
        io = (f"Standalone decoder: raw window ({meta.n_channels} channels in ch_names order x {sa['window_samples']} "
              f"samples at {sa['rate']:g} Hz, {sa['unit']}) and state in; class probabilities, next state and "
              "input-guard flags out. Decodes one window at a time.")
    else:
        io = (f"Plain graph: preprocessed windows (batch x {meta.n_channels} x {meta.n_times} at "
              f"{meta.sfreq:g} Hz) in, logits out." + (
                  f" Batch-specific BN: feed at least {meta.min_batch} windows per run (metadata min_batch); "
                  "use the standalone export for one window at a time." if meta.min_batch else ""))
    return (f"NeuroFed {meta.model} motor-imagery decoder ({classes}). {io} Full description: metadata_props "
            f"'{META_KEY}' (JSON). model_version = NeuroFed ONNX metadata format {FORMAT_VERSION}.")


def embed_meta(model: onnx.ModelProto, meta: OnnxModelMeta) -> None:
    """Write ``meta`` as JSON under ``metadata_props['neurofed']`` (replacing any previous one), the graph's
    ``doc_string`` and its ``model_version`` (the metadata format version, not the exporter's 2**63 - 1)."""
    keep = [p for p in model.metadata_props if p.key != META_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in keep}, META_KEY: meta.model_dump_json()})
    model.doc_string = doc_string(meta)
    model.model_version = FORMAT_VERSION


__all__ = ["INPUT_NAME", "META_KEY", "OUTPUT_NAME", "ModelCard", "OnnxModelMeta", "build_meta", "embed_meta",
           "meta_from_model", "model_hash", "package_version", "read_onnx_meta"]
