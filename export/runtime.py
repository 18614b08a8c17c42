"""onnxruntime sessions for exported NeuroFed models (forward passes without torch), and their model card.

The runtime layer: onnxruntime, onnx (to read the graph and its metadata), numpy and pydantic; no torch. The
metadata embedded in exported models (``metadata_props``, key ``neurofed``, JSON: the checkpoint's
:class:`~neurofed.trainer.model_meta.ModelMeta` plus what the export adds) is read and validated here; it is
written by :mod:`neurofed.export.metadata`.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from pydantic import ConfigDict, ValidationError, create_model, field_validator

from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.model_meta import ModelMeta, meta_fields

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


def make_session(model: str | os.PathLike | bytes, threads: int = 1) -> ort.InferenceSession:
    """A CPU session with ``threads`` intra-op threads (1 by default: predictable latency)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    src = model if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(src, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise NeuroFedError(f"onnxruntime cannot load the model ({exc})") from None


def load_model(path: str | os.PathLike) -> tuple[onnx.ModelProto, OnnxModelMeta]:
    """An exported ``.onnx`` file and its validated NeuroFed metadata, with clear errors."""
    if not Path(path).is_file():
        raise NeuroFedError(f"{path}: ONNX model file not found")
    try:
        proto = onnx.load(str(path))
    except Exception as exc:
        raise NeuroFedError(f"{path}: not a readable ONNX model ({exc})") from None
    return proto, meta_from_model(proto, str(path))


class OnnxModel:
    """An exported model: its metadata and an onnxruntime session.

    Parameters
    ----------
    path : path
        ``.onnx`` file written by ``neurofed export``.
    threads : int
        Intra-op threads of the session.
    """

    def __init__(self, path: str | os.PathLike, threads: int = 1) -> None:
        self.path = Path(path)
        proto, self.meta = load_model(path)
        if self.meta.standalone:
            raise NeuroFedError(
                f"{path}: a standalone model (raw window + state); run it with "
                "neurofed.export.decoder.StandaloneModel, or export the plain model without --standalone"
            )
        self.session = make_session(proto.SerializeToString(), threads)
        self._in = self.session.get_inputs()[0].name
        self._out = self.session.get_outputs()[0].name

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Logits of one batch ``(n, channels, times)`` (the whole batch shares BN statistics)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        m = self.meta
        if x.ndim != 3 or x.shape[1:] != (m.n_channels, m.n_times):
            raise NeuroFedError(
                f"{self.path.name}: input shape {x.shape} does not fit the model's "
                f"(batch, {m.n_channels}, {m.n_times})"
            )
        return self.session.run([self._out], {self._in: x})[0]

    def logits(self, X: np.ndarray, batch_size: int | None = None) -> np.ndarray:
        """Logits in consecutive batches of ``batch_size`` (default: the model's test batch size)."""
        bs = batch_size or self.meta.test_batch_size
        out = [self.forward(X[i : i + bs]) for i in range(0, len(X), bs)]
        return np.concatenate(out) if out else np.zeros((0, self.meta.n_classes), np.float32)

    def predict(self, X: np.ndarray, batch_size: int | None = None) -> np.ndarray:
        """Class indices (see :meth:`logits`)."""
        return self.logits(X, batch_size).argmax(1)
