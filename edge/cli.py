"""The ``edge-client`` command (headset-side host): record, join, infer.

Each feature module adds its commands with ``register(app)``: one line per module below.
"""

from __future__ import annotations

import logging

import typer

app = typer.Typer(name="edge-client", help="NeuroFed headset-side client: capture trials, train with the federation, decode live.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


# --- feature modules register their commands here (one line each) ---
from neurofed.edge.record_cli import register as _register_record; _register_record(app)
from neurofed.edge.join_cli import register as _register_join; _register_join(app)
from neurofed.edge.infer_cli import register as _register_infer; _register_infer(app)
from neurofed.trainer.errors import run_cli


def main() -> None:
    """Entry point: NeuroFed's own errors print one clear line and exit 2."""

    run_cli(app)
