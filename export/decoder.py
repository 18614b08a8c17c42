"""The standalone decoder at run time: a ``neurofed export --standalone`` graph in onnxruntime, without torch.

``probs, state = StandaloneModel(path).run(window, state)``: one raw device window in, class probabilities and the
next state out (BatchNorm context, Euclidean-alignment running mean and the model hash travel in the state);
:class:`WindowRejected` when the graph's input guard refuses a window. The graph itself is built by
:mod:`neurofed.export.standalone` (torch); this module is the runtime layer (onnxruntime + numpy).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from neurofed.export.runtime import load_model, make_session
from neurofed.trainer.data.guard import GUARD_KINDS
from neurofed.trainer.data.guard import guard_reason as reason_text
from neurofed.trainer.errors import NeuroFedError

#: The model hash travels in the state as this many 24-bit integers (exact in float64).
HASH_WORDS = 4
INPUTS = ("window", "state")
OUTPUTS = ("probs", "next_state", "guard")


class StandaloneInfo(BaseModel):
    """What an app needs to run the standalone graph (metadata key ``neurofed``, field ``standalone``)."""

    model_config = ConfigDict(extra="forbid")

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


class WindowRejected(NeuroFedError):
    """The input guard refused a window (the state is unchanged); ``bad_channels`` by kind."""

    def __init__(self, reason: str, bad_channels: dict[str, list[str]]) -> None:
        super().__init__(reason)
        self.bad_channels = bad_channels


def guard_reason(flags: np.ndarray, ch_names: list[str]) -> tuple[str, dict[str, list[str]]]:
    """One line naming the rejected channels by kind (``""`` if none), and the channels by kind."""
    bad = {
        kind: [ch_names[i] for i in np.flatnonzero(row > 0)]
        for kind, row in zip(GUARD_KINDS, np.asarray(flags))
        if (row > 0).any()
    }
    return reason_text(bad), bad


class StandaloneModel:
    """A standalone ``.onnx`` decoder in onnxruntime: ``probs, state = model.run(window, state)``.

    Parameters
    ----------
    path : path
        File written by ``neurofed export --standalone``.
    threads : int
        Intra-op threads of the onnxruntime session.
    """

    def __init__(self, path: str | os.PathLike, threads: int = 1) -> None:
        self.path = Path(path)
        proto, self.meta = load_model(path)
        raw = self.meta.standalone
        if not raw:
            raise NeuroFedError(f"{path}: not a standalone export; use `neurofed export --standalone`")
        self.info = StandaloneInfo.model_validate(raw)
        self.session = make_session(proto.SerializeToString(), threads)

    def initial_state(self) -> np.ndarray:
        """The state before a session's first window (zeros with the model hash)."""
        s = np.zeros(self.info.state_size, np.float64)
        s[:HASH_WORDS] = self.info.hash_words
        return s

    def check(self, window: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Validated float32 window and float64 state, or a :class:`NeuroFedError` naming the problem."""
        info = self.info
        w = np.asarray(window)
        want = (self.meta.n_channels, info.window_samples)
        if w.shape != want:
            raise NeuroFedError(
                f"window shape {w.shape}, expected {want}: {want[0]} channels ({', '.join(self.meta.ch_names)}) "
                f"x {want[1]} samples ({info.window_samples / info.rate:g} s at {info.rate:g} Hz, {info.unit})"
            )
        s = np.asarray(state, np.float64)
        if s.shape != (info.state_size,):
            raise NeuroFedError(f"state shape {s.shape}, expected ({info.state_size},) for this model")
        if not np.array_equal(s[:HASH_WORDS], info.hash_words):
            raise NeuroFedError(
                "state belongs to another model (hash words "
                f"{[int(v) if np.isfinite(v) else v for v in s[:HASH_WORDS]]}, this model {info.hash_words}); "
                "start from model.initial_state()"
            )
        return np.ascontiguousarray(w, np.float32), np.ascontiguousarray(s)

    def run(self, window: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decode one raw window: ``(probs, next_state)``; :class:`WindowRejected` if the guard refuses it."""
        w, s = self.check(window, state)
        probs, nxt, flags = self.session.run(list(OUTPUTS), {"window": w, "state": s})
        if flags.any():
            reason, bad = guard_reason(flags, list(self.meta.ch_names))
            raise WindowRejected(reason, bad)
        return probs, nxt


__all__ = ["HASH_WORDS", "INPUTS", "OUTPUTS", "StandaloneInfo", "StandaloneModel", "WindowRejected", "guard_reason"]
