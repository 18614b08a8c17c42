"""Commands that broker/ adds to ``neurofed``."""

from __future__ import annotations

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this package's commands (and benchmarks) to the CLI."""
