"""The ``neurofed`` command: each package contributes its commands through ``register(app, bench)``.

Errors NeuroFed raises on purpose (:class:`neurofed.trainer.errors.NeuroFedError`) print one clear line
and exit 2, never a bare traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys

import typer

from neurofed import __version__

app = typer.Typer(
    name="neurofed", help="Federated, attack-robust motor-imagery BCI: train, federate, export, benchmark.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
bench = typer.Typer(help="Benchmarks: results go to docs/bench/*.json and are summarised in docs/BENCHMARKS.md.",
                    no_args_is_help=True)
app.add_typer(bench, name="bench")

#: Packages that contribute commands, in help order.
COMMAND_MODULES = ("neurofed.trainer.cli", "neurofed.broker.cli", "neurofed.export.cli",
                   "neurofed.demo")


def _version(value: bool) -> None:
    if value:
        print(f"neurofed {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


for _mod in COMMAND_MODULES:
    try:
        importlib.import_module(_mod).register(app, bench)
    except ImportError as _exc:  # a broken optional part must not take the other commands down
        print(f"warning: commands of {_mod.split('.')[0]}/ unavailable ({_exc})", file=sys.stderr)
try:
    from neurofed.bench_standalone import register as _register_standalone_bench

    _register_standalone_bench(bench)
except ImportError as _exc:
    print(f"warning: standalone benchmark unavailable ({_exc})", file=sys.stderr)
try:
    from neurofed.bench_secagg import register as _register_secagg_bench

    _register_secagg_bench(bench)
except ImportError as _exc:
    print(f"warning: secure aggregation benchmark unavailable ({_exc})", file=sys.stderr)
try:
    from neurofed.bench_e2e import register as _register_e2e_bench
    from neurofed.edge.bench_lsl import register_bench as _register_lsl_bench

    _register_lsl_bench(bench)
    _register_e2e_bench(bench)
except ImportError as _exc:
    print(f"warning: LSL benchmarks unavailable ({_exc})", file=sys.stderr)


def main() -> None:
    """Entry point: run the CLI, turning NeuroFed's own errors into one clear line."""
    from neurofed.trainer.errors import run_cli

    run_cli(app)


if __name__ == "__main__":
    main()
