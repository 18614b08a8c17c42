"""Exported NeuroFed models in onnxruntime (no torch): the runtime's models with the full model card.

Loading, checking the metadata against the graph and running the session are the torch-free runtime
distribution's (``neurofed_runtime.model``: :class:`~neurofed_runtime.model.PlainModel`, ``make_session``); this
module adds the main package's full schema of the metadata embedded in exported models (``metadata_props``, key
``neurofed``, JSON: the checkpoint's :class:`~neurofed.trainer.model_meta.ModelMeta` plus what the export adds),
:class:`OnnxModelMeta`, written by :mod:`neurofed.export.metadata`, and readers of it from an ``onnx`` proto.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, NamedTuple

import onnx
from neurofed_runtime import model as _rt
from neurofed_runtime.card import INPUT_NAME, META_KEY, OUTPUT_NAME, check_graph, parse_card
from neurofed_runtime.errors import ModelError
from neurofed_runtime.model import make_session
from pydantic import ConfigDict, ValidationError, create_model, field_validator

from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.model_meta import ModelMeta, meta_fields

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
    #: fewest windows one run of a plain graph of a batch-specific-BN model must get (None: no minimum; a
    #: standalone graph decodes one window at a time with its context in the state)
    min_batch: int | None = None
    #: the rate the network was trained at (= sfreq) and the rate of the samples the graph's input takes (plain:
    #: the same; standalone: the device's); ``rates_note`` says so in the card itself. None: an older export
    training_rate_hz: float | None = None
    input_rate_hz: float | None = None
    rates_note: str | None = None

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


def meta_from_json(text: str | None, source: str = "model") -> OnnxModelMeta:
    """Parse and validate the NeuroFed metadata JSON of an exported model (``None``: it has none)."""
    if text is None:
        raise ModelError(f"{source}: ONNX model has no '{META_KEY}' metadata; export it with `neurofed export`")
    try:
        return OnnxModelMeta.model_validate(json.loads(text))
    except (ValidationError, json.JSONDecodeError) as exc:
        first = str(exc).splitlines()
        raise ModelError(f"{source}: invalid NeuroFed metadata ({' '.join(first[:3])})") from None


class _Arg(NamedTuple):
    """A graph input or output as onnxruntime's ``NodeArg`` shows it (``name``, ``shape``)."""

    name: str
    shape: list[int | str | None]


def graph_args(model: onnx.ModelProto) -> tuple[list[_Arg], list[_Arg]]:
    """The graph's real inputs (initializers excluded) and outputs with their static dimensions."""
    inits = {t.name for t in model.graph.initializer}

    def args(values) -> list[_Arg]:
        return [_Arg(v.name, [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                              for d in v.type.tensor_type.shape.dim]) for v in values if v.name not in inits]

    return args(model.graph.input), args(model.graph.output)


def meta_from_model(model: onnx.ModelProto, source: str = "model") -> OnnxModelMeta:
    """Parse and validate the NeuroFed metadata of an in-memory ONNX model, and check that it describes the graph
    (the runtime's rule: :func:`neurofed_runtime.card.check_graph`, one line on a mismatch)."""
    props = {p.key: p.value for p in model.metadata_props}
    meta = meta_from_json(props.get(META_KEY), source)
    ins, outs = graph_args(model)
    check_graph(parse_card(props[META_KEY], source), ins, outs, source)
    return meta


def read_onnx_meta(path: str | os.PathLike) -> OnnxModelMeta:
    """Metadata of an exported ``.onnx`` file (weights are not loaded into a session)."""
    if not Path(path).is_file():
        raise ModelError(f"{path}: ONNX model file not found")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"{path}: not a readable ONNX model ({str(exc).strip().splitlines()[0][:200]})") from None
    return meta_from_model(model, str(path))


def load_model(path: str | os.PathLike) -> tuple[onnx.ModelProto, OnnxModelMeta]:
    """An exported ``.onnx`` file and its validated NeuroFed metadata, checked against its graph (one-line
    errors: ``neurofed_runtime.model.open_model``)."""
    _rt.open_model(path)
    proto = onnx.load(str(path))
    return proto, meta_from_model(proto, str(path))


class OnnxModel(_rt.PlainModel):
    """A plain exported model (:class:`neurofed_runtime.PlainModel`: metadata checked against the graph, batch
    forward passes, the minimum-batch warning) whose ``meta`` is the validated :class:`OnnxModelMeta`.

    Parameters
    ----------
    path : path
        ``.onnx`` file written by ``neurofed export``.
    threads : int
        Intra-op threads of the session.
    strict : bool
        Refuse a batch smaller than the model's minimum instead of warning.
    """

    def __init__(self, path: str | os.PathLike, threads: int = 1, strict: bool = False) -> None:
        super().__init__(path, threads, strict)
        self.meta = meta_from_json(self.card.json, str(path))


__all__ = ["INPUT_NAME", "META_KEY", "OUTPUT_NAME", "ModelCard", "NeuroFedError", "OnnxModel", "OnnxModelMeta",
           "load_model", "make_session", "meta_from_json", "meta_from_model", "read_onnx_meta"]
