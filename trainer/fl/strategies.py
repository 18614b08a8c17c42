"""The registry of federated algorithms: the one place the CLIs, federation.toml, the wire validation
and the docs' algorithm table come from.

Adding an algorithm = one module in :mod:`neurofed.trainer.fl.algorithms` (its components and its
:class:`~neurofed.trainer.fl.api.Algorithm` entry) + one line in ``ALGORITHMS`` below + its tests.
See docs/methods.md, "How to add an algorithm".
"""

from __future__ import annotations

from typing import Any

from neurofed.trainer.fl.algorithms import (
    base,
    classical,
    dp,
    fal,
    fedavgm,
    fedbm,
    fedbs,
    fedfa,
    fedprox,
    ga,
    hierarchical,
    moon,
    robust,
    safe,
    scaffold,
)
from neurofed.trainer.fl.api import Algorithm, Component, Param, Strategy

#: every algorithm, in the order of the docs' table
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    base.CT,
    base.FEDAVG,
    fedprox.FEDPROX,
    scaffold.SCAFFOLD,
    moon.MOON,
    base.FEDBN,
    fedbs.FEDBS,
    safe.SAFE,
    fedavgm.FEDAVGM,
    fal.FAL,
    fal.CT_AT,
    robust.FEDMEDIAN,
    dp.DPFEDAVG,
    fedbm.FEDBM,
    hierarchical.FLEEG,
    fedfa.FEDFA,  # after MOON: its hooks must not be in MOON's frozen copies
    ga.GA,
    classical.FED_CSP_LDA,
    classical.FED_TANGENT,
)}

#: component types in registry order (the order in which loss terms and weight perturbations compose)
COMPONENTS: tuple[type[Component], ...] = tuple(dict.fromkeys(c for a in ALGORITHMS.values() for c in a.components))

#: every tunable setting: the BN rule's and each component's, by flat name
PARAMS: dict[str, Param] = {p.name: p for p in (*base.BN_PARAMS, *(p for c in COMPONENTS for p in c.PARAMS))}


def _check_registry() -> None:
    names = [p.name for p in (*base.BN_PARAMS, *(p for c in COMPONENTS for p in c.PARAMS))]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise RuntimeError(f"strategy parameters defined twice: {sorted(dup)}")
    for a in ALGORITHMS.values():
        unknown = set(a.settings) - set(PARAMS)
        if unknown:
            raise RuntimeError(f"algorithm {a.name} sets unknown parameters {sorted(unknown)}")


_check_registry()


def get_strategy(name: str, **overrides: Any) -> Strategy:
    """A named algorithm with optional parameter overrides (ablations, compositions).

    ``get_strategy("fedbs", sam_rho=0)`` is FedBS without SAM; ``get_strategy("fedavg", prox_mu=1.0,
    sam_rho=0.1)`` composes a FedProx term and SAM. ``None`` values are ignored.

    Raises
    ------
    ValueError
        Unknown algorithm or parameter, or a value out of range (the message names it).
    """
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose from {', '.join(ALGORITHMS)}")
    algo = ALGORITHMS[name]
    settings = {p.name: p.default for p in PARAMS.values()}
    settings.update(algo.settings)
    for k, v in overrides.items():
        if v is None:
            continue
        if k not in PARAMS:
            raise ValueError(f"unknown strategy parameter {k!r}; known: {', '.join(PARAMS)}")
        settings[k] = PARAMS[k].check(v)
    components = tuple(c for cls in COMPONENTS if (c := cls.build(settings)) is not None)
    rules = [type(c).__name__ for c in components if type(c).state_aggregator is not Component.state_aggregator]
    if len(rules) > 1:
        raise ValueError(f"{' and '.join(rules)} both replace the server's aggregation rule; choose one")
    weights = [type(c).__name__ for c in components if type(c).reweighting is not Component.reweighting]
    if len(weights) > 1:
        raise ValueError(f"{' and '.join(weights)} both replace the aggregation weights; choose one")
    return Strategy(name, settings, components, algo.centralised)


def algorithm_table() -> str:
    """The docs' algorithm table (markdown), generated from the registry (docs/methods.md embeds it)."""
    rows = ["| algorithm | BN | BN sent down | settings | what it does | reference |", "|---|---|---|---|---|---|"]
    for a in ALGORITHMS.values():
        st = get_strategy(a.name)
        bn = st.bn_mode.replace("_", "-")
        down = "-" if a.centralised else ("no" if st.local_bn and st.bn_sync == "local" else "yes")
        own = ", ".join(f"{k}={v}" for k, v in a.settings.items() if k not in ("bn_mode", "local_bn")) or "-"
        summary = a.summary.replace("|", "\\|")
        rows.append(f"| {a.name} | {bn} | {down} | {own} | {summary} | {a.reference or '-'} |")
    return "\n".join(rows)


def parameter_table() -> str:
    """Every strategy parameter (markdown): name, type, neutral value, meaning."""
    rows = ["| parameter | type | off / default | meaning |", "|---|---|---|---|"]
    for p in PARAMS.values():
        rows.append(f"| `{p.name}` | {p.type.__name__} | {p.default} | {p.help} |")
    return "\n".join(rows)


def docs_tables() -> str:
    """Both tables, as docs/methods.md embeds them."""
    return algorithm_table() + "\n\n" + parameter_table()
