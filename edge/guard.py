"""Input guard: reject EEG windows that must not reach the decoder, with a reason.

The check (non-finite, flat, saturated channels of the raw window in microvolts) is the runtime's
(``neurofed_runtime.guard.check_window``), re-exported for the edge.
"""

from __future__ import annotations

from neurofed_runtime.guard import GuardConfig, GuardResult, check_window

__all__ = ["GuardConfig", "GuardResult", "check_window"]
