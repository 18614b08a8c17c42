"""neurofed-runtime: decode NeuroFed's exported models with onnxruntime and numpy only (no torch).

::

    from neurofed_runtime import Decoder
    dec = Decoder.load("model.onnx", ch_names=labels, sfreq=160.0, units="microvolts")
    res = dec.decode(window)             # (stream channels, window samples) -> Result(probs, index, label)

Modules: :mod:`~neurofed_runtime.model` (load and check a model, run it), :mod:`~neurofed_runtime.decode`
(:class:`Decoder`: a window, a sliding stream, ``mne.Epochs``), :mod:`~neurofed_runtime.channels` (channel picking and
units from an LSL description or an ``mne.Info``), :mod:`~neurofed_runtime.guard` (the input guard),
:mod:`~neurofed_runtime.card` (the model card), :mod:`~neurofed_runtime.lsl` (a live LSL loop; ``[lsl]`` extra),
:mod:`~neurofed_runtime.release` (signed releases; ``[signed]``), :mod:`~neurofed_runtime.follow` (follow signed
releases over MQTT and swap a running :class:`Decoder` between two windows; ``[follow]``),
:mod:`~neurofed_runtime.errors`. The names below load onnxruntime on first use only: importing
``neurofed_runtime.errors`` (as the main package does for its error types) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Decoder": "decode", "Result": "decode",
    "StandaloneModel": "model", "PlainModel": "model", "load": "model", "make_session": "model",
    "ModelCard": "card", "StandaloneInfo": "card",
    "GuardConfig": "guard", "check_window": "guard",
    "match_stream": "channels", "lsl_channels": "channels", "mne_channels": "channels",
    "NeuroFedError": "errors", "DataError": "errors", "ModelError": "errors", "WindowRejected": "errors",
    "SmallBatchWarning": "errors",
    "ReleaseFollower": "follow",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"neurofed_runtime.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'neurofed_runtime' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
