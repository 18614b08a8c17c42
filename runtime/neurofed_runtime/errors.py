"""NeuroFed's error types: the root of every error NeuroFed raises on purpose, and those the runtime raises.

``neurofed.trainer.errors`` re-exports :class:`NeuroFedError` and :class:`DataError` from here, so the main
package and the runtime share one error hierarchy: a CLI that turns a ``NeuroFedError`` into one line and exit 2
does the same for a runtime error.
"""

from __future__ import annotations


class NeuroFedError(Exception):
    """Base class of every error NeuroFed raises on purpose (shown to users without a traceback)."""


class DataError(NeuroFedError, ValueError):
    """Bad or missing input data: folder, file, channels, sampling rate, units, events."""


class ModelError(NeuroFedError, ValueError):
    """A model file that cannot be used: missing, unreadable, or its metadata disagrees with its graph."""


class WindowRejected(NeuroFedError):
    """The input guard refused a window (the state is unchanged); ``bad_channels`` by kind."""

    def __init__(self, reason: str, bad_channels: dict[str, list[str]]) -> None:
        super().__init__(reason)
        self.bad_channels = bad_channels


class SmallBatchWarning(UserWarning):
    """A plain (non-standalone) batch-specific-BN graph was run on fewer windows than its minimum batch."""


def one_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (onnxruntime's run to dozens of lines)."""
    text = str(exc).strip()
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)[:300]


__all__ = ["DataError", "ModelError", "NeuroFedError", "SmallBatchWarning", "WindowRejected", "one_line"]
