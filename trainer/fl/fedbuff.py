"""Buffered asynchronous aggregation (FedBuff, Nguyen et al., AISTATS 2022) over the strategy seam.

The server holds a model *version* ``v`` (:attr:`ServerState.round`). A client fetches the current model when it
comes online, trains on what its store holds then (:func:`neurofed.trainer.fl.client.client_update`, unchanged) and
returns its update tagged with the version it started from. The server buffers accepted updates and, when ``K``
have arrived, takes one step::

    new = current + server_lr * sum_i w_i * delta_i / sum_i w_i
    delta_i = state_i - global(v_base_i)        (trained entries: weights, biases)
    delta_i = state_i - current                 (value entries: BN statistics, and BN kept on the clients)
    w_i = n_i * s(tau_i),   tau_i = v_now - v_base_i,   s(tau) = 1 / sqrt(1 + tau)

*Value entries* are the ones a client does not train from the global model: BatchNorm running statistics (a
client's are estimates of its own data, not a step from the base) and, under a local-BN rule (FedBS, SAFE, FedBN),
every BN entry (the client started from its own BN, never from the global one). Their delta is taken against the
*current* global model and their step is ``min(server_lr, 1)``, so the new value is a convex combination of the
current one and the clients' (the clip only shrinks a delta): running variances stay positive whatever the staleness. Moving them by
stale deltas (the rule before 2026-12-01) drove variances below zero at staleness 2-4 and collapsed the model to
one class (docs/async.md). At zero staleness the two rules are the same bits. :func:`async_value_keys` names them.

``n_i`` is the number of trials the client trained on (it says so in the update), ``s`` FedBuff's polynomial
staleness rule with exponent 1/2. An update with ``tau > max_staleness`` is rejected with the code ``stale`` (and
one whose base is newer than the server's with ``future``). The adaptive norm clip, on by default for every
strategy (``clip_mult`` 1.5, :mod:`neurofed.trainer.fl.algorithms.robust`), acts on each buffer's deltas as it acts
on a synchronous round's (each scaled to at most ``clip_mult`` x the buffer's median norm); integer entries (BN's ``num_batches_tracked``) take the
maximum over the buffer, as in the synchronous mean. With ``K`` = every client, no staleness and ``server_lr`` 1
the step is exactly the synchronous trial-weighted mean (``current + mean(state_i - current) = mean(state_i)``).

Which strategies: those whose server side is the plain weighted mean and whose client side needs nothing from the
server but the model (FedAvg, FedBN, FedProx, FedBS, SAFE, FAL, MOON, FedFA ...; local BN stays on the client as
today). Refused, in one line (:func:`check_async`): components with a server rule over a synchronous cohort
(SCAFFOLD's control variates, FedAvgM's momentum, FedBM's server state), their own aggregation rule (median,
trimmed mean, Krum, DP-FedAvg's clip and noise calibrated per round), per-client reweighting (GA), per-group modules (hierarchical
strategies), centralised training and secure aggregation (its masks cancel only over one round's cohort).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.fl.aggregate import WeightedSum
from neurofed.trainer.fl.algorithms.fedbs import SAM
from neurofed.trainer.fl.algorithms.robust import Robust
from neurofed.trainer.fl.api import Component, Strategy
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.init import client_seed
from neurofed.trainer.fl.server import ServerState

logger = logging.getLogger("neurofed.trainer")

__all__ = ["ACCEPTED", "FUTURE", "STALE", "AsyncRefused", "BufferedServer", "Verdict", "async_clip_mult",
           "async_caveat", "async_seed", "async_value_keys", "check_async", "staleness_weight", "window_bounds"]

ACCEPTED = "accepted"
STALE = "stale"  # staleness beyond the bound
FUTURE = "future"  # a base version the server has not made yet


class AsyncRefused(NeuroFedError, ValueError):
    """A strategy (or option) whose server maths needs a synchronous cohort."""


def staleness_weight(tau: int) -> float:
    """FedBuff's polynomial staleness rule ``s(tau) = 1 / sqrt(1 + tau)`` (``tau`` >= 0 versions)."""
    if tau < 0:
        raise ValueError(f"staleness must be >= 0, got {tau}")
    return 1.0 / math.sqrt(1.0 + tau)


def async_seed(seed: int, version: int, client_id: str, repeat: int = 0) -> int:
    """Seed of one client's local training from global ``version`` (its ``repeat``-th training from that version,
    0 first): the same in the simulation (:mod:`neurofed.trainer.experiments.asyncsim`) and on an edge client of an
    asynchronous MQTT federation."""
    return client_seed(seed + 1_000_003 * repeat, version, client_id)


def window_bounds(seen: int, window: int) -> tuple[int, int]:
    """``(lo, hi)``: the trials a client trains on when its store holds ``seen`` (the newest ``window``; all when 0).
    The same rule on an edge client (``edge-client join --window``)."""
    return (max(0, seen - window) if window else 0), seen


#: the Component hooks whose rule assumes one synchronous cohort per round, and why (for the refusal line)
_SYNC_HOOKS = (
    ("server_round", "a server rule over each round's cohort"),
    ("downlink_extras", "server state sent down each round"),
    ("state_aggregator", "its own aggregation rule"),
    ("reweighting", "per-client weights moved each round"),
    ("grouped_keys", "per-group modules"),
)


def async_clip_mult(strategy: Strategy) -> float:
    """The adaptive norm clip's ``k`` the strategy asks for (``clip_mult``, on by default; 0 = off). Asynchronously
    it acts on each buffer: every delta is scaled to at most ``k x`` the buffer's median delta norm."""
    for c in strategy.components:
        if isinstance(c, Robust) and c.rule == "mean":
            return float(c.clip_mult)
    return 0.0


#: state-dict key endings of BatchNorm's running statistics
BN_STAT_SUFFIXES = ("running_mean", "running_var")


def async_value_keys(state: Mapping[str, Tensor], downlinked: Mapping[str, Tensor]) -> frozenset[str]:
    """The floating entries the buffered rule averages as values (their delta against the current model, not the
    stale base): BN running statistics, and every entry the downlink leaves out (BN kept on the clients).

    Parameters
    ----------
    state : dict
        The global state (every key).
    downlinked : dict
        What a client receives of it (:func:`neurofed.trainer.fl.server.downlink`).
    """
    return frozenset(k for k, v in state.items()
                     if torch.is_floating_point(v) and (k.endswith(BN_STAT_SUFFIXES) or k not in downlinked))


def check_async(strategy: Strategy, secure_aggregation: bool = False) -> None:
    """Raise :class:`AsyncRefused` (one line) when ``strategy`` cannot be aggregated asynchronously.

    Parameters
    ----------
    strategy : Strategy
    secure_aggregation : bool
        Whether secure aggregation was asked for (refused: pairwise masks cancel only within one round).
    """
    if secure_aggregation:
        raise AsyncRefused("secure aggregation cannot run asynchronously: its pairwise masks cancel only over one "
                           "synchronous round's cohort (use --mode sync)")
    if strategy.centralised:
        raise AsyncRefused(f"{strategy.name} is centralised training, not federated: nothing to aggregate "
                           "asynchronously")
    why = []
    for c in strategy.components:
        if isinstance(c, Robust) and c.rule == "mean":
            continue  # the adaptive norm clip alone: applied to each buffer (async_clip_mult)
        for hook, reason in _SYNC_HOOKS:
            if getattr(type(c), hook) is not getattr(Component, hook):
                why.append(f"{type(c).__name__} ({reason})")
                break
        else:
            if c.needs_every_client:
                why.append(f"{type(c).__name__} (needs every client in every round)")
    if why:
        raise AsyncRefused(f"strategy {strategy.name} cannot run asynchronously: {', '.join(why)} assumes synchronous "
                           "rounds; use FedAvg/FedBN/FedProx/FedBS/SAFE-style local training or --mode sync")
    if (note := async_caveat(strategy)) is not None:
        logger.warning(note)


def async_caveat(strategy: Strategy) -> str | None:
    """A measured accuracy cost of running ``strategy`` asynchronously (one line), or None. SAM's: buffered
    aggregation of SAM-trained updates lost 5.5 points against synchronous FedBS on the 46-subject protocol; FedBS
    without SAM lost 0.8 against synchronous FedBS without SAM (studies/async)."""
    if any(isinstance(c, SAM) for c in strategy.components):
        return (f"strategy {strategy.name} uses SAM, which loses accuracy under buffered asynchronous aggregation "
                "(FedBS: -5.5 points against synchronous on the 46-subject protocol; without SAM -0.8 against "
                "synchronous without SAM; studies/async): consider --sam-rho 0 with --mode async")
    return None


@dataclass(frozen=True)
class Verdict:
    """The server's answer to one submitted update.

    Attributes
    ----------
    code : str
        ``accepted``, ``stale`` or ``future``.
    staleness : int
        ``v_now - v_base`` at arrival.
    weight : float
        ``n * s(staleness)`` (0 when rejected).
    aggregated : bool
        This update filled the buffer and a new version was made.
    """

    code: str
    staleness: int
    weight: float = 0.0
    aggregated: bool = False


@dataclass
class BufferedServer:
    """The FedBuff server: the current version, the last ``max_staleness + 1`` global states, the buffer.

    Parameters
    ----------
    server : ServerState
        The starting state (its ``round`` is the version).
    buffer_k : int
        Accepted updates per aggregation (K).
    max_staleness : int
        Largest accepted ``v_now - v_base``.
    server_lr : float
        The server's step on the weighted mean delta (1 = FedAvg's mean at zero staleness).
    clip_mult : float
        The adaptive norm clip (:func:`async_clip_mult`): each buffered delta scaled to at most ``clip_mult`` x
        the buffer's median delta norm before the mean (0 = off); :attr:`clipped` counts the scaled ones.
    value_keys : frozenset of str
        Entries averaged as values (:func:`async_value_keys`: their delta is taken against the current model).
    """

    server: ServerState
    buffer_k: int
    max_staleness: int
    server_lr: float = 1.0
    clip_mult: float = 0.0
    value_keys: frozenset[str] = frozenset()
    history: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    buffer: list[tuple[str, ClientUpdate, int, float]] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=lambda: {STALE: 0, FUTURE: 0})
    accepted: int = 0
    clipped: int = 0

    def __post_init__(self) -> None:
        if self.buffer_k < 1:
            raise ValueError(f"buffer K must be >= 1, got {self.buffer_k}")
        if self.max_staleness < 0:
            raise ValueError(f"max staleness must be >= 0, got {self.max_staleness}")
        if not self.server_lr > 0:
            raise ValueError(f"server learning rate must be > 0, got {self.server_lr}")
        self.history.setdefault(self.version, self.server.global_state)

    @property
    def version(self) -> int:
        return self.server.round

    def fetch(self) -> tuple[int, dict[str, Tensor]]:
        """What a client coming online gets: the current version and global state."""
        return self.version, self.server.global_state

    def check(self, base_version: int) -> Verdict | None:
        """The rejection an update trained from ``base_version`` gets now (counted), or None if it would be
        accepted: lets a caller refuse a stale update before validating its body (the MQTT coordinator)."""
        tau = self.version - base_version
        if tau < 0:
            self.rejected[FUTURE] += 1
            return Verdict(FUTURE, tau)
        if tau > self.max_staleness:
            self.rejected[STALE] += 1
            return Verdict(STALE, tau)
        return None

    def submit(self, client_id: str, update: ClientUpdate, base_version: int) -> Verdict:
        """Buffer one update trained from ``base_version``; aggregate when the buffer holds K."""
        if (refused := self.check(base_version)) is not None:
            return refused
        tau = self.version - base_version
        if update.n_samples < 1:
            raise ValueError(f"update of {client_id} says it used {update.n_samples} trials")
        w = update.n_samples * staleness_weight(tau)
        self.buffer.append((client_id, update, base_version, w))
        self.accepted += 1
        if len(self.buffer) < self.buffer_k:
            return Verdict(ACCEPTED, tau, w)
        self.aggregate()
        return Verdict(ACCEPTED, tau, w, aggregated=True)

    def aggregate(self) -> ServerState:
        """One step on the buffered updates (in arrival order); the buffer empties, the version goes up by one."""
        if not self.buffer:
            raise ValueError("no buffered update to aggregate")
        cur = self.server.global_state
        deltas = [_delta(u.state, self.history[base], cur, self.value_keys) for _, u, base, _ in self.buffer]
        if self.clip_mult > 0 and len(deltas) >= 2:  # as the synchronous rule (robust.py), on this buffer's deltas
            norms = [math.sqrt(sum(float((v**2).sum()) for v in d.values() if torch.is_floating_point(v)))
                     for d in deltas]
            bound = self.clip_mult * float(np.median(norms))
            for i, n in enumerate(norms):
                if n > bound > 0:
                    deltas[i] = {k: v * (bound / n) if torch.is_floating_point(v) else v for k, v in deltas[i].items()}
                    self.clipped += 1
        acc = WeightedSum()
        for d, (_, _, _, w) in zip(deltas, self.buffer):
            acc.add(d, w)
        mean = acc.result()  # weighted mean delta (floating) / max (integer entries)
        new = {}
        for k, v in cur.items():
            if torch.is_floating_point(v):
                lr = min(self.server_lr, 1.0) if k in self.value_keys else self.server_lr  # values: a convex step
                new[k] = (v.to(torch.float64) + lr * mean[k].to(torch.float64)).to(v.dtype)
            else:
                new[k] = mean[k].clone()
        self.server = ServerState(new, self.server.round + 1, dict(self.server.extras))
        self.buffer = []
        self.history[self.version] = new
        for old in [v for v in self.history if v < self.version - self.max_staleness]:
            del self.history[old]
        return self.server


def _delta(state: Mapping[str, Tensor], base: Mapping[str, Tensor], current: Mapping[str, Tensor],
           value_keys: frozenset[str]) -> dict[str, Tensor]:
    """``state - base`` on trained floating entries, ``state - current`` on value entries (float64), the state
    itself on integer ones."""
    if state.keys() != base.keys():
        raise ValueError(f"update keys differ from the global model's: {sorted(set(state) ^ set(base))[:4]}")
    return {k: (v.to(torch.float64) - (current if k in value_keys else base)[k].to(torch.float64))
            if torch.is_floating_point(v) else v for k, v in state.items()}
