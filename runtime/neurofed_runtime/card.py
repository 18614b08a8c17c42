"""The model card of an exported NeuroFed model, read from its ONNX metadata without onnx, torch or pydantic.

``neurofed export`` writes a JSON document under the model's ``metadata_props`` key ``neurofed`` (the main
package's ``neurofed.export.metadata``; its full schema is ``neurofed.export.runtime.OnnxModelMeta``). The runtime
reads it through onnxruntime's own metadata accessor and checks the fields it uses (:class:`ModelCard`), and
checks that the card describes the graph it travels with (:func:`check_graph`): a card declaring 21 channels on
a graph taking 8 is refused in one line, before any window reaches onnxruntime.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from neurofed_runtime.errors import ModelError

META_KEY = "neurofed"
INPUT_NAME = "x"
OUTPUT_NAME = "logits"
#: The model hash travels in a standalone graph's state as this many 24-bit integers (exact in float64).
HASH_WORDS = 4
#: A standalone graph's inputs and outputs, in this order.
INPUTS = ("window", "state")
OUTPUTS = ("probs", "next_state", "guard")
#: BN mode whose plain graph normalises each batch with its own statistics (metadata ``bn_mode``).
BATCH_SPECIFIC = "batch_specific"

#: Fields the runtime relies on, with their types (the rest of the card is kept as it is).
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "model": str, "n_channels": int, "n_classes": int, "n_times": int, "sfreq": (int, float), "bn_mode": str,
    "ch_names": list, "classes": list, "model_hash": str,
}
_OPTIONAL: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "preprocess": (dict, {}), "test_batch_size": (int, 8), "data_hashes": (dict, {}), "extra": (dict, {}),
    "standalone": ((dict, type(None)), None), "input_name": (str, INPUT_NAME), "output_name": (str, OUTPUT_NAME),
    "profile": ((dict, type(None)), None), "min_batch": ((int, type(None)), None),
}


class ModelCard:
    """The validated NeuroFed metadata of an exported model (attribute access to every key of the card).

    Attributes
    ----------
    raw : dict
        The whole card as written by ``neurofed export``.
    json : str
        The card's JSON text (what the main package validates against its full schema).
    """

    def __init__(self, raw: dict[str, Any], text: str, source: str = "model") -> None:
        problems = []
        for key, typ in _REQUIRED.items():
            if key not in raw:
                problems.append(f"missing {key!r}")
            elif not isinstance(raw[key], typ) or isinstance(raw[key], bool):
                problems.append(f"{key!r} is {type(raw[key]).__name__}")
        for key, (typ, _) in _OPTIONAL.items():
            if key in raw and not isinstance(raw[key], typ):
                problems.append(f"{key!r} is {type(raw[key]).__name__}")
        if not problems:
            if len(raw["ch_names"]) != raw["n_channels"]:
                problems.append(f"{len(raw['ch_names'])} channel names for n_channels {raw['n_channels']}")
            if len(raw["classes"]) != raw["n_classes"]:
                problems.append(f"{len(raw['classes'])} class names for n_classes {raw['n_classes']}")
            if raw.get("test_batch_size", 8) < 1:
                problems.append("test_batch_size < 1")
        if problems:
            raise ModelError(f"{source}: invalid NeuroFed metadata ({'; '.join(problems[:4])})")
        self.raw = {**{k: d for k, (_, d) in _OPTIONAL.items()}, **raw}
        self.json = text
        self.source = source

    def __getattr__(self, name: str) -> Any:
        raw = self.__dict__.get("raw", {})
        if name in raw:
            return raw[name]
        raise AttributeError(f"the model card has no {name!r}")

    @property
    def ea(self) -> bool:
        """Whether the model expects Euclidean-aligned input."""
        return bool(self.raw["preprocess"].get("ea", False))

    @property
    def min_windows(self) -> int:
        """Fewest windows one run of a plain graph should get (batch-specific BN); 1 for standalone graphs."""
        if self.raw["standalone"]:
            return 1
        if self.raw["min_batch"] is not None:
            return int(self.raw["min_batch"])
        return int(self.raw["test_batch_size"]) if self.raw["bn_mode"] == BATCH_SPECIFIC else 1


@dataclass(frozen=True)
class StandaloneInfo:
    """What an app needs to run the standalone graph (the card's ``standalone`` section)."""

    inputs: dict[str, Any]
    outputs: dict[str, Any]
    rate: float
    unit: str
    unit_to_uv: float
    window_samples: int
    step_s: float
    context_windows: int
    state_size: int
    state_layout: list[dict[str, Any]]
    state_init: dict[str, Any]
    hash_words: list[int]
    guard: dict[str, float]
    guard_kinds: list[str]
    ea_calibration: str
    preprocess_matrix: str
    ea_inverse_sqrt: str

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "model") -> StandaloneInfo:
        """Validated from the card's ``standalone`` section (unknown or missing keys are refused)."""
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in raw]
        extra = sorted(set(raw) - set(names))
        if missing or extra:
            raise ModelError(f"{source}: invalid standalone metadata (missing {missing}, unknown {extra})")
        num = {"rate": float, "unit_to_uv": float, "step_s": float, "window_samples": int, "context_windows": int,
               "state_size": int}
        vals = dict(raw)
        for k, typ in num.items():
            if isinstance(vals[k], bool) or not isinstance(vals[k], (int, float)) or (
                    typ is int and not float(vals[k]).is_integer()):
                raise ModelError(f"{source}: invalid standalone metadata ({k!r} is {vals[k]!r})")
            vals[k] = typ(vals[k])
        return cls(**vals)

    def to_dict(self) -> dict[str, Any]:
        """The ``standalone`` section as written into the card."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def parse_card(text: str | None, source: str = "model") -> ModelCard:
    """The card from its JSON text (``None``: the model has no NeuroFed metadata)."""
    if text is None:
        raise ModelError(f"{source}: ONNX model has no '{META_KEY}' metadata; export it with `neurofed export`")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{source}: invalid NeuroFed metadata (not JSON: {exc})") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{source}: invalid NeuroFed metadata (not a JSON object)")
    return ModelCard(raw, text, source)


def _dims(shape: list[Any]) -> list[int | None]:
    return [d if isinstance(d, int) else None for d in shape]


def check_graph(card: ModelCard, inputs: list[Any], outputs: list[Any], source: str = "model") -> None:
    """Refuse a card that does not describe its graph (one line naming the first disagreement).

    ``inputs``/``outputs`` are onnxruntime's ``NodeArg`` lists (``name``, ``shape``) of the session.
    """
    ins = {a.name: _dims(a.shape) for a in inputs}
    outs = {a.name: _dims(a.shape) for a in outputs}

    def want(where: dict[str, list[int | None]], name: str, axis: int, value: int, what: str, kind: str) -> None:
        if name not in where:
            raise ModelError(f"{source}: the graph has no {kind} {name!r} (it has {sorted(where)}); its metadata "
                             "belongs to another graph: export the model again")
        shape = where[name]
        got = shape[axis] if -len(shape) <= axis < len(shape) else None
        if got is not None and got != value:
            raise ModelError(f"{source}: metadata declares {value} {what} but the graph's {kind} {name!r} has "
                             f"{got} (shape {shape}): the metadata belongs to another graph; export the model again")

    if card.standalone:
        info = card.standalone
        want(ins, "window", 0, card.n_channels, "channels", "input")
        want(ins, "window", 1, int(info.get("window_samples", 0)), "window samples", "input")
        want(ins, "state", 0, int(info.get("state_size", 0)), "state values", "input")
        want(outs, "probs", -1, card.n_classes, "classes", "output")
        want(outs, "guard", -1, card.n_channels, "channels", "output")
    else:
        want(ins, card.input_name, -2, card.n_channels, "channels", "input")
        want(ins, card.input_name, -1, card.n_times, "samples per window", "input")
        want(outs, card.output_name, -1, card.n_classes, "classes", "output")


__all__ = ["BATCH_SPECIFIC", "HASH_WORDS", "INPUTS", "INPUT_NAME", "META_KEY", "ModelCard", "OUTPUTS",
           "OUTPUT_NAME", "StandaloneInfo", "check_graph", "parse_card"]
