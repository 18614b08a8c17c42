"""Errors raised by the trainer package. Each message names the file or value at fault.

The root :class:`NeuroFedError` and :class:`DataError` are the runtime's (``neurofed_runtime.errors``, the
torch-free distribution the main package depends on): one hierarchy, so ``run_cli`` turns a runtime error into
one line and exit 2 as it does any other.
"""

from neurofed_runtime.errors import DataError, ModelError, NeuroFedError, WindowRejected

__all__ = ["DataError", "DownloadUnavailable", "ModelConfigError", "ModelError", "NeuroFedError", "WindowRejected",
           "run_cli"]


class DownloadUnavailable(DataError):
    """A dataset would have to be downloaded but the network cannot reach its host."""


class ModelConfigError(NeuroFedError, ValueError):
    """A model cannot be built for the requested signal shape."""


def run_cli(app) -> None:
    """Run a typer app; NeuroFed's own errors print one clear line (no traceback) and exit 2."""
    import sys

    try:
        app()
    except NeuroFedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
