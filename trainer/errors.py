"""Errors raised by the trainer package. Each message names the file or value at fault."""


class NeuroFedError(Exception):
    """Base class of every error NeuroFed raises on purpose (shown to users without a traceback)."""


class DataError(NeuroFedError, ValueError):
    """Bad or missing input data: folder, file, channels, sampling rate, events."""


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
