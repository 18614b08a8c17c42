"""The input guard's definition (kinds, thresholds, reason text): ``neurofed_runtime.guard``, re-exported.

``neurofed.edge.guard.check_window`` (the Python edge path) and the standalone ONNX graph
(``neurofed.export.standalone``) reject the same raw windows: one definition, in the runtime distribution.
"""

from __future__ import annotations

from neurofed_runtime.guard import GUARD_KINDS, GuardConfig, guard_reason

__all__ = ["GUARD_KINDS", "GuardConfig", "guard_reason"]
