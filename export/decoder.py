"""The standalone decoder at run time: ``neurofed_runtime.model.StandaloneModel``, with the full model card.

``probs, state = StandaloneModel(path).run(window, state)``: one raw device window in, class probabilities and the
next state out; :class:`WindowRejected` when the graph's input guard refuses a window. The implementation is the
torch-free runtime distribution's (``neurofed_runtime``: load, check the metadata against the graph, carry the
state); here ``meta`` is additionally validated against the main package's full schema
(:class:`neurofed.export.runtime.OnnxModelMeta`), as the rest of NeuroFed reads it. The graph itself is built by
:mod:`neurofed.export.standalone` (torch).
"""

from __future__ import annotations

import os

from neurofed_runtime import model as _rt
from neurofed_runtime.card import HASH_WORDS, INPUTS, OUTPUTS, StandaloneInfo
from neurofed_runtime.errors import WindowRejected
from neurofed_runtime.model import guard_reason

from neurofed.export.runtime import meta_from_json


class StandaloneModel(_rt.StandaloneModel):
    """:class:`neurofed_runtime.StandaloneModel` whose ``meta`` is the validated
    :class:`~neurofed.export.runtime.OnnxModelMeta` (``card`` keeps the runtime's reading)."""

    def __init__(self, path: str | os.PathLike, threads: int = 1) -> None:
        super().__init__(path, threads)
        self.meta = meta_from_json(self.card.json, str(path))


__all__ = ["HASH_WORDS", "INPUTS", "OUTPUTS", "StandaloneInfo", "StandaloneModel", "WindowRejected", "guard_reason"]
