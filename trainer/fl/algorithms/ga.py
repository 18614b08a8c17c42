"""GA: generalisation adjustment of the aggregation weights (Zhang et al., "Federated Domain Generalization with
Generalization Adjustment", CVPR 2023; FedDG-GA).

Each client measures, on its own trials and in eval mode, the loss of the model it received (the global model,
before local training) and of the model it trained; its **generalisation gap** is ``G_i = loss_global -
loss_local`` and travels up as ``ga.gap`` (one scalar). The server keeps one weight per client (``ga_w.<client
id>``, never sent down; the first time a client is seen its weight is ``1/N``, N = clients in the federation),
aggregates the round with these weights instead of trial counts, then moves every participant's weight by

    a_i <- a_i + (d_t / N) * G_i / max_j |G_j|,   d_t = ga_step * (1 - t / T)

(t = 0-based round, T = rounds of the run: the step decays linearly to ``ga_step / T`` in the last round),
clips each weight to [0, 1] and renormalises all weights to sum 1. A client whose global model generalises
worse to it than its own model (a large gap) thus counts more in the next round. If every gap is 0 the
weights stay.

GA needs every client in every round (``Strategy.check_participation`` refuses a fraction < 1). If a client
still misses a round (an MQTT straggler), the round's mean uses the participants' stored weights (their
relative sizes are kept), absentees keep their weight unchanged and the renormalisation runs over everyone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from neurofed.trainer.fl.api import (
    Algorithm,
    Component,
    LocalHook,
    Param,
    Reweighting,
    RoundInputs,
    TensorSpec,
)

GAP = "ga.gap"
WEIGHT = "ga_w"


def weight_key(client_id: str) -> str:
    """Where the server keeps a client's GA weight (``ga_w.<client id>``)."""
    return f"{WEIGHT}.{client_id}"


def step_size(step: float, round_idx: int, rounds_total: int) -> float:
    """``step * (1 - t / T)``: the linearly decaying GA step of round ``t`` (0-based) of ``T``."""
    return step * (1.0 - round_idx / rounds_total)


def adjust(weights: Mapping[str, float], gaps: Mapping[str, float], d: float, n_clients: int) -> dict[str, float]:
    """One GA update: ``a_i + (d / N) G_i / max|G|`` for every client with a gap, clip to [0, 1], renormalise all.

    Parameters
    ----------
    weights : dict
        Every known client's current weight.
    gaps : dict
        This round's generalisation gaps (participants only).
    d : float
        This round's step (:func:`step_size`).
    n_clients : int
        N, the number of clients in the federation (the step is split over them, as in the authors' code).
    """
    out = dict(weights)
    top = max((abs(g) for g in gaps.values()), default=0.0)
    if top > 0:
        for cid, g in gaps.items():
            out[cid] = min(max(out[cid] + d / n_clients * g / top, 0.0), 1.0)
    total = sum(out.values())
    if total <= 0:  # every weight clipped to 0: start again from equal weights
        return {cid: 1.0 / len(out) for cid in out}
    return {cid: w / total for cid, w in out.items()}


class _GapHook(LocalHook):
    needs_local_loss = True

    def finish(self, start, state, metrics):
        gap = float(metrics["loss_global"]) - float(metrics["loss_local"])
        return {GAP: torch.tensor([gap], dtype=torch.float32)}, None


class _GaWeights(Reweighting):
    def __init__(self, step: float, server_extras: Mapping[str, Tensor], n_total: int, round_idx: int,
                 rounds_total: int) -> None:
        if rounds_total <= 0:
            raise ValueError("GA's step decays over the run: the aggregation needs the run's total rounds")
        self.d = step_size(step, min(round_idx, rounds_total - 1), rounds_total)
        self.n_total = max(n_total, 1)
        prefix = WEIGHT + "."
        self.weights = {k[len(prefix):]: float(v) for k, v in server_extras.items() if k.startswith(prefix)}
        self.gaps: dict[str, float] = {}

    def weigh(self, client_id: str, extras: Mapping[str, Tensor], n_samples: int) -> float:
        if not client_id:
            raise ValueError("GA weighs each client by its id: the update has none")
        if client_id in self.gaps:
            raise ValueError(f"GA: a second update from {client_id} in one round")
        if GAP not in extras:
            raise ValueError(f"GA: the update of {client_id} carries no {GAP}")
        self.gaps[client_id] = float(extras[GAP].reshape(-1)[0])
        w = self.weights.setdefault(client_id, 1.0 / self.n_total)
        return w if w > 0 else 1e-12  # a client clipped to 0 still trains; its update just does not count

    def finish(self, extras: dict[str, Tensor], n_updates: int) -> dict[str, Tensor]:
        new = adjust(self.weights, self.gaps, self.d, self.n_total)
        out = {k: v for k, v in extras.items() if not k.startswith(WEIGHT + ".")}
        out.update({weight_key(cid): torch.tensor([w], dtype=torch.float64) for cid, w in sorted(new.items())})
        return out


class GeneralisationAdjustment(Component):
    """Clients upload their gap (``ga.gap``); the server keeps and adjusts ``ga_w.<client>``."""

    PARAMS = (Param("ga_step", float, 0.0, "GA: initial step of the aggregation-weight adjustment, decayed linearly "
                    "over the rounds and split over the N clients (0 = off; the authors' code uses 0.2)"),)
    KEY = "ga"
    needs_every_client = True

    def __init__(self, step: float) -> None:
        self.step = step

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> GeneralisationAdjustment | None:
        return cls(settings["ga_step"]) if settings["ga_step"] > 0 else None

    def local_round(self, model: nn.Module, kept: Mapping[str, Tensor] | None, inputs: RoundInputs) -> LocalHook:
        return _GapHook()

    def upload_specs(self, model: nn.Module) -> dict[str, TensorSpec]:
        return {GAP: TensorSpec((1,), torch.float32)}

    def reweighting(self, server_extras, n_clients_total, round_idx, rounds_total) -> Reweighting:
        return _GaWeights(self.step, server_extras, n_clients_total, round_idx, rounds_total)


GA = Algorithm("ga", "FedAvg with per-client weights moved each round by the normalised generalisation gap (global "
               "minus local loss on the client's trials), step 0.2 decaying linearly; needs every client",
               (GeneralisationAdjustment,), {"ga_step": 0.2}, reference="Zhang et al., CVPR 2023")
