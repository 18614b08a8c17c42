"""Server side: seeded client selection, downlink, streaming weighted aggregation, server state."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from trainer.fl.client import ClientUpdate
from trainer.fl.strategies import Strategy
from trainer.models.bn import bn_state_keys


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


def downlink(global_state: dict[str, Tensor], strategy: Strategy, model: nn.Module) -> dict[str, Tensor]:
    """What the server sends to clients: everything, minus BN entries under the local-BN rule."""
    if strategy.local_bn and strategy.bn_sync == "local":
        drop = bn_state_keys(model)
        return {k: v for k, v in global_state.items() if k not in drop}
    return dict(global_state)


class WeightedSum:
    """Streaming weighted average of state dicts: memory O(model), not O(clients x model).

    Floating tensors are accumulated in float64 and cast back to their dtype; integer tensors
    (BN's ``num_batches_tracked``) take the maximum.
    """

    def __init__(self) -> None:
        self._sum: dict[str, Tensor] = {}
        self._dtype: dict[str, torch.dtype] = {}
        self.total_weight = 0.0
        self.count = 0

    def add(self, state: dict[str, Tensor], weight: float) -> None:
        if weight <= 0:
            raise ValueError(f"aggregation weight must be > 0, got {weight}")
        if self._sum and state.keys() != self._sum.keys():
            raise ValueError("state dicts to aggregate have different keys")
        for k, v in state.items():
            if torch.is_floating_point(v):
                acc = v.detach().to(torch.float64) * weight
                self._sum[k] = self._sum[k] + acc if k in self._sum else acc
            else:
                self._sum[k] = torch.maximum(self._sum[k], v) if k in self._sum else v.clone()
            self._dtype[k] = v.dtype
        self.total_weight += weight
        self.count += 1

    def result(self) -> dict[str, Tensor]:
        if not self.count:
            raise ValueError("nothing to aggregate")
        return {
            k: (v / self.total_weight).to(self._dtype[k]) if torch.is_floating_point(v) else v.clone()
            for k, v in self._sum.items()
        }


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


def server_extras_for_clients(server: ServerState) -> dict[str, Tensor]:
    """Extras the clients need this round (SCAFFOLD's ``c``)."""
    return dict(server.extras)


def server_update(
    server: ServerState,
    updates: Sequence[tuple[str, ClientUpdate]],
    strategy: Strategy,
    n_clients_total: int,
) -> ServerState:
    """Aggregate one round's updates (sorted by client id; weights = trial counts).

    Every entry is aggregated, BN included; what is *sent* is decided by :func:`downlink`.
    SCAFFOLD: ``c <- c + |S|/N * mean_i(dc_i)``.
    """
    if not updates:
        raise ValueError("no updates to aggregate")
    ordered = sorted(updates, key=lambda t: t[0])
    acc = WeightedSum()
    for _, u in ordered:
        acc.add(u.state, float(u.n_samples))
    new_global = acc.result()
    extras = dict(server.extras)
    if strategy.scaffold:
        dc = WeightedSum()
        for _, u in ordered:
            dc.add({k[len("scaffold_dc."):]: v for k, v in u.extras.items() if k.startswith("scaffold_dc.")}, 1.0)
        mean_dc = dc.result()
        frac = len(ordered) / max(n_clients_total, 1)
        for n, d in mean_dc.items():
            key = f"scaffold_c.{n}"
            extras[key] = extras.get(key, torch.zeros_like(d)) + frac * d
    return ServerState(new_global, server.round + 1, extras)
