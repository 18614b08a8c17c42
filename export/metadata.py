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
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

import onnx
import torch
from neurofed.trainer.checkpoint import ModelMeta, meta_fields
from neurofed.trainer.errors import NeuroFedError
from pydantic import ConfigDict, ValidationError, create_model, field_validator

META_KEY = "neurofed"
INPUT_NAME = "x"
OUTPUT_NAME = "logits"


#: The model card: exactly the checkpoint's fields, validated (one description, not a copy).
ModelCard = create_model(  # type: ignore[call-overload]
    "ModelCard", __config__=ConfigDict(extra="allow", protected_namespaces=()), **meta_fields()
)


class OnnxModelMeta(ModelCard):  # type: ignore[misc, valid-type]
    """Validated NeuroFed metadata of an exported model: the checkpoint's model card plus what
    the export adds (derived band-pass/window, EA policy, weights hash, graph I/O names)."""

    bandpass: tuple[float, float]
    window: tuple[float, float]
    ea_policy: dict[str, Any]
    model_hash: str
    neurofed_version: str
    input_name: str = INPUT_NAME
    output_name: str = OUTPUT_NAME
    quantized: str | None = None
    standalone: dict[str, Any] | None = None
    #: the device profile the model is for (:meth:`neurofed.trainer.data.profiles.DeviceProfile.to_dict`: name,
    #: channels and rate of the stream it decodes); None: a model for no particular device
    profile: dict[str, Any] | None = None

    @field_validator("test_batch_size")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError("test_batch_size must be >= 1")
        return v

    @property
    def ea(self) -> bool:
        """Whether the model expects Euclidean-aligned input."""
        return bool(self.preprocess.get("ea", False))

    def model_meta(self) -> ModelMeta:
        """The checkpoint description this export was made from."""
        return ModelMeta(**{f.name: getattr(self, f.name) for f in fields(ModelMeta)})


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
    from neurofed.trainer.checkpoint import device_of

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


def meta_from_model(model: onnx.ModelProto, source: str = "model") -> OnnxModelMeta:
    """Parse and validate the NeuroFed metadata of an in-memory ONNX model."""
    props = {p.key: p.value for p in model.metadata_props}
    if META_KEY not in props:
        raise NeuroFedError(
            f"{source}: ONNX model has no '{META_KEY}' metadata; export it with `neurofed export`"
        )
    try:
        return OnnxModelMeta.model_validate(json.loads(props[META_KEY]))
    except (ValidationError, json.JSONDecodeError) as exc:
        raise NeuroFedError(f"{source}: invalid NeuroFed metadata ({exc})") from None


def read_onnx_meta(path: str | os.PathLike) -> OnnxModelMeta:
    """Metadata of an exported ``.onnx`` file (weights are not loaded into a session)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise NeuroFedError(f"{path}: not a readable ONNX model ({exc})") from None
    return meta_from_model(model, str(path))
