"""Server side: seeded client selection, downlink, streaming aggregation of a round, server state.

One aggregation path for the simulation and the MQTT coordinator: :class:`RoundAggregator` takes
each accepted update once (on arrival, or in client-id order for bit-reproducible runs) and
:func:`server_update` is that aggregator fed in sorted order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from neurofed.trainer.fl.aggregate import WeightedSum
from neurofed.trainer.fl.api import GROUP_MARK, Strategy, group_key, is_grouped
from neurofed.trainer.fl.client import ClientUpdate

__all__ = ["CLIPPED_KEY", "RoundAggregator", "ServerState", "WeightedSum", "clipped_in_round", "downlink",
           "select_clients", "server_extras_for_clients", "server_update"]


def select_clients(client_ids: Sequence[str], fraction: float, round_idx: int, seed: int) -> list[str]:
    """Seeded partial participation: ``max(1, floor(fraction * N))`` clients, returned sorted.

    The draw depends only on (sorted ids, fraction, round, seed), never on arrival order.
    """
    ids = sorted(client_ids)
    if not ids:
        return []
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    k = max(1, math.floor(fraction * len(ids) + 1e-9))
    rng = np.random.default_rng([seed, round_idx])
    return sorted(ids[i] for i in rng.choice(len(ids), size=k, replace=False))


def downlink(global_state: Mapping[str, Tensor], strategy: Strategy, model: nn.Module, group: str = "") -> dict[str, Tensor]:
    """What the server sends to the clients of ``group`` (the strategy's BN and grouping rules decide)."""
    return strategy.downlink(global_state, model, group)


CLIPPED_KEY = "robust.stat_clipped"  # server extra: updates scaled down by the adaptive norm clip so far this run


def clipped_in_round(before: ServerState, after: ServerState) -> int | None:
    """Updates the adaptive norm clip scaled down between two server states (None: the rule does not clip)."""
    if CLIPPED_KEY not in after.extras:
        return None
    return int(after.extras[CLIPPED_KEY]) - int(before.extras.get(CLIPPED_KEY, torch.tensor(0)))


@dataclass
class ServerState:
    """The coordinator's learning state.

    Attributes
    ----------
    global_state : dict
        Current global model (aggregated BN included).
    round : int
        Completed rounds.
    extras : dict
        Strategy state, e.g. ``scaffold_c.<param>``.
    """

    global_state: dict[str, Tensor]
    round: int = 0
    extras: dict[str, Tensor] = field(default_factory=dict)

    def to_tensors(self) -> dict[str, Tensor]:
        out = {f"global.{k}": v for k, v in self.global_state.items()}
        out.update({f"extra.{k}": v for k, v in self.extras.items()})
        return out

    @classmethod
    def from_tensors(cls, flat: dict[str, Tensor], round_idx: int) -> ServerState:
        g = {k[7:]: v for k, v in flat.items() if k.startswith("global.")}
        e = {k[6:]: v for k, v in flat.items() if k.startswith("extra.")}
        return cls(g, round_idx, e)


def server_extras_for_clients(server: ServerState, strategy: Strategy) -> dict[str, Tensor]:
    """Strategy tensors the clients need this round (e.g. SCAFFOLD's ``c``)."""
    return strategy.downlink_extras(server.extras)


class RoundAggregator:
    """Aggregates one round in O(model) memory: :meth:`add` each accepted update once, then :meth:`result`.

    The global state is the trial-weighted mean of the clients' state dicts (every entry, BN
    included; what is *sent* is the strategy's downlink rule). Under a hierarchical strategy
    (``strategy.group_prefixes``, e.g. ``local.``) the entries under those prefixes are averaged
    only over the updates of the same group (``update.group``, the device profile; trial-count
    weights within the group) and kept as ``@<group>/<key>``; a group with no update this round
    keeps its module. Each component with a server rule
    (SCAFFOLD's control variate, server momentum ...) accumulates its extras alongside and edits
    the result.

    Each update's weight is its trial count unless a component reweights (GA: per-client weights the
    server keeps, so :meth:`add` then needs the client's id).

    Parameters
    ----------
    server : ServerState
        The state the round started from.
    strategy : Strategy
    n_clients_total : int
        Clients known to the federation (SCAFFOLD's ``|S|/N``).
    rounds_total : int
        Rounds of the whole run (GA's step decay; 0 = unknown, refused by rules that need it).
    """

    def __init__(self, server: ServerState, strategy: Strategy, n_clients_total: int, rounds_total: int = 0) -> None:
        self.server = server
        self.states = strategy.state_aggregator(server.global_state, server.round, n_clients_total)
        self.parts = strategy.server_rounds(server.extras, n_clients_total)
        self.weights = strategy.reweighting(server.extras, n_clients_total, server.round, rounds_total)
        self.prefixes = strategy.group_prefixes
        self.groups: dict[str, WeightedSum] = {}

    @property
    def count(self) -> int:
        return self.states.count

    def add(self, update: ClientUpdate, client_id: str = "") -> None:
        """Add one accepted update (``client_id``: who sent it; needed by per-client weights)."""
        w = self.weights.weigh(client_id, update.extras, update.n_samples)
        if self.prefixes:
            if not update.group:
                raise ValueError("an update without a client group under a hierarchical strategy")
            own = {k: v for k, v in update.state.items() if is_grouped(k, self.prefixes)}
            shared = {k: v for k, v in update.state.items() if k not in own}
            self.groups.setdefault(update.group, WeightedSum()).add(own, w)
            self.states.add(shared, w)
        else:
            self.states.add(update.state, w)
        for p in self.parts:
            p.add(update.extras, update.n_samples)

    def result(self) -> ServerState:
        new_global = self.states.result()
        if self.prefixes:
            for g in sorted(self.groups):
                new_global.update({group_key(g, k): v for k, v in self.groups[g].result().items()})
            for k, v in self.server.global_state.items():  # groups absent this round keep their module
                if k.startswith(GROUP_MARK) and k not in new_global:
                    new_global[k] = v
        extras = dict(self.server.extras)
        for p in self.parts:
            new_global, extras = p.finish(self.server.global_state, new_global, extras, self.states.count)
        extras = self.weights.finish(extras, self.states.count)
        clipped = getattr(self.states, "clipped", None)  # None: the rule never clips (plain mean, DP's own clip)
        if clipped is not None:  # a running count over the run: in a job's server_cost and the checkpoint's extras
            prev = self.server.extras.get(CLIPPED_KEY)
            extras[CLIPPED_KEY] = torch.tensor((int(prev) if prev is not None else 0) + clipped)
        return ServerState(new_global, self.server.round + 1, extras)


def server_update(
    server: ServerState,
    updates: Sequence[tuple[str, ClientUpdate]],
    strategy: Strategy,
    n_clients_total: int,
    rounds_total: int = 0,
) -> ServerState:
    """Aggregate one round's updates in client-id order (bit-reproducible; weights = trial counts unless the
    strategy reweights; ``rounds_total``: see :class:`RoundAggregator`)."""
    if not updates:
        raise ValueError("no updates to aggregate")
    agg = RoundAggregator(server, strategy, n_clients_total, rounds_total)
    for cid, u in sorted(updates, key=lambda t: t[0]):
        agg.add(u, cid)
    return agg.result()
