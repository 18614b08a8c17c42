"""The CLIs' shared typer option parsers and console (``neurofed``, ``edge-client``, ``headset-sim``).

Parsing is the lab's typer-free schema (:mod:`neurofed.trainer.experiments.spec`); this module turns its
:class:`~neurofed.trainer.experiments.spec.SpecError` into typer's ``BadParameter`` (a usage error naming the
option) and holds what only a command line needs: the rich console, result tables, strategy options.
"""

from __future__ import annotations

import inspect
import typing
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from neurofed.trainer.data.eegmmidb import parse_subjects  # re-exported: CLIs use it
from neurofed.trainer.experiments import spec
from neurofed.trainer.experiments.spec import SpecError, preprocess_from_options
from neurofed.trainer.fl.strategies import ALGORITHMS, PARAMS
from neurofed.trainer.presets import PRESETS

console = Console()

__all__ = ["algorithm_help", "build_sim_config", "console", "parse_attacks", "parse_int_list", "parse_name_list",
           "parse_subjects", "preprocess_from_options", "preset_help", "print_results", "with_strategy_options"]


def _bad(exc: SpecError) -> typer.BadParameter:
    """The schema's error as typer's usage error (which adds "Invalid value for OPTION" itself)."""
    return typer.BadParameter(exc.message, param_hint=exc.param_hint)


def parse_int_list(value: str, option: str) -> list[int]:
    """``"0,1, 2"`` -> [0, 1, 2]; a clear error naming ``option`` for anything but comma-separated integers.

    Parameters
    ----------
    value : str
        The option's text as typed.
    option : str
        The option's name (``--seeds``), shown in the error.

    Returns
    -------
    list of int
        The integers in the order given (empty for an empty string).
    """
    try:
        return spec.int_list(value, option)
    except SpecError as exc:
        raise _bad(exc) from None


def parse_name_list(value: str | None) -> list[str]:
    """``"fedbs, safe,"`` -> ["fedbs", "safe"]: a comma-separated option's names, blanks dropped (None -> [])."""
    return spec.name_list(value)


def parse_attacks(value: str | None) -> list[list]:
    """``pgd:0.03,fgsm:0.01`` -> [["pgd", 0.03], ["fgsm", 0.01]] (names: :data:`neurofed.trainer.attacks.ATTACKS`)."""
    try:
        return spec.attack_list(value)
    except SpecError as exc:
        raise _bad(exc) from None


def print_results(results: dict) -> None:
    """Per-subject table and summary."""
    metrics = list(results["summary"])
    t = Table(title=f"{results['algorithm']} / {results['model']}: balanced accuracy per held-out subject")
    t.add_column("subject")
    for m in metrics:
        t.add_column(m, justify="right")
    for s, row in results["per_subject"].items():
        t.add_row(s, *[f"{100 * row[m]:.1f}" for m in metrics])
    t.add_row("mean ± std", *[f"{100 * results['summary'][m]['mean']:.1f} ± {100 * results['summary'][m]['std_subjects']:.1f}"
                              for m in metrics], style="bold")
    console.print(t)
    if results.get("per_profile"):
        console.print("held-out BCA per device profile: " + ", ".join(
            f"{p} {100 * r['bca']:.1f}% (n={r['n']})" for p, r in results["per_profile"].items()))


def algorithm_help() -> str:
    return "; ".join(f"{a.name}: {a.summary}" for a in ALGORITHMS.values())


def preset_help() -> str:
    return " | ".join(f"{p.name}: {p.summary}" + (f" (NOTE: {p.caveat})" if p.caveat else "") for p in PRESETS.values())


def build_sim_config(opts: dict):
    """The :class:`~neurofed.trainer.experiments.simulate.SimConfig` of ``neurofed simulate``'s option values (by
    parameter name, strategy parameters included; ``neurofed grid`` parses spec lines into the same values through
    :mod:`neurofed.trainer.experiments.spec`), validated. Unset training options take the preset's values."""
    try:
        return spec.parse_options(opts).to_sim_config(warn=lambda m: console.print(f"[yellow]{m}[/yellow]"))
    except SpecError as exc:
        raise _bad(exc) from None


def with_strategy_options(func):
    """Give ``func`` (which takes ``**strategy_params``) one CLI option per registered strategy parameter.

    The options come from :data:`neurofed.trainer.fl.strategies.PARAMS`, so a new algorithm's parameters appear in
    ``neurofed simulate --help`` without touching this file. Each defaults to None (= the algorithm's value).
    """
    if getattr(func, "_strategy_options", False):  # already given its options (idempotent)
        return func
    sig = inspect.signature(func)
    hints = typing.get_type_hints(func, include_extras=True)  # keep typer's Annotated options
    fixed = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
             if p.kind != inspect.Parameter.VAR_KEYWORD]
    extra = []
    for prm in PARAMS.values():
        decl = prm.flag or f"--{prm.name.replace('_', '-')}"
        choices = f" ({', '.join(str(c) for c in prm.choices if c != '')})" if prm.choices else ""
        opt = typer.Option(decl, help=f"{prm.help}{choices}", rich_help_panel="Strategy parameters (override the algorithm's)")
        extra.append(inspect.Parameter(prm.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                       annotation=Annotated[prm.type | None, opt]))
    func.__signature__ = sig.replace(parameters=[*fixed, *extra])
    func._strategy_options = True
    return func
