"""Client-level differential privacy: DP-FedAvg with the Gaussian mechanism at the server.

McMahan, Ramage, Talwar, Zhang, "Learning differentially private recurrent language models", ICLR 2018.
Each client's whole update ``delta_i = w_i - w_global`` (every floating entry it uploads: weights,
biases, BN affine parameters and, with standard BN, running statistics) is clipped to L2 norm
``C = dp_clip``; the server sums the clipped updates unweighted (trial counts would leak through the
weights), adds ``N(0, (z C)^2)`` per coordinate (``z = dp_noise``) and divides by the number of
updates of the round (fixed by the selection rule, public). The privacy loss over the rounds is
computed by Google's ``dp-accounting`` (RDP accountant, Poisson-subsampled Gaussian with sampling
rate = fraction of clients per round: an approximation for NeuroFed's fixed-size sampling without
replacement, the usual one in DP-FL practice).

Why client-level and not DP-SGD: per-sample DP-SGD (Opacus and the like) needs per-sample
gradients, which batch-specific BN does not have (a trial's output depends on its batch mates), and
its guarantee protects one trial, not one person; client-level DP protects a whole user's data
whatever the local training does (SAM, FAT, AWP, batch-specific BN all compose).
The noise is added by the server (central DP: the coordinator is trusted with single updates); with
secure aggregation the same sum would be computed blind.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from neurofed.trainer.fl.api import Algorithm, Component, Param, StateAggregator


def dp_epsilon(noise: float, sample_rate: float, rounds: int, delta: float) -> float:
    """(epsilon, delta)-DP of ``rounds`` Poisson-subsampled Gaussian steps (dp-accounting's RDP accountant)."""
    import logging

    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    logging.getLogger("absl").setLevel(logging.ERROR)  # it warns for every order it excludes
    if noise <= 0:
        return math.inf
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(noise)), rounds))
    return float(acc.get_epsilon(delta))


def dp_epsilon_of(noises: list[float], delta: float) -> float:
    """(epsilon, delta)-DP of Gaussian releases of the given noise multipliers (sampling rate 1), composed by
    dp-accounting's RDP accountant."""
    import logging

    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    logging.getLogger("absl").setLevel(logging.ERROR)
    if any(z <= 0 for z in noises):
        return math.inf
    acc = rdp_privacy_accountant.RdpAccountant()
    for z in noises:
        acc.compose(dp_accounting.GaussianDpEvent(z))
    return float(acc.get_epsilon(delta))


def noise_for_epsilon(epsilon: float, sample_rate: float, rounds: int, delta: float) -> float:
    """Smallest noise multiplier z (to 1e-3) whose :func:`dp_epsilon` is <= ``epsilon`` (bisection)."""
    lo, hi = 0.05, 1.0
    while dp_epsilon(hi, sample_rate, rounds, delta) > epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise ValueError(f"epsilon {epsilon} is not reachable with q={sample_rate}, {rounds} rounds")
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if dp_epsilon(mid, sample_rate, rounds, delta) > epsilon else (lo, mid)
    return hi


class DPStates(StateAggregator):
    """Streaming clipped sum (O(model)); Gaussian noise and the mean at :meth:`result`."""

    def __init__(self, clip: float, noise: float, seed: int, round_idx: int, old: Mapping[str, Tensor]) -> None:
        self.clip, self.noise, self.old = clip, noise, old
        self.gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, round_idx]).generate_state(1)[0]))
        self.sum: dict[str, Tensor] = {}
        self.ints: dict[str, Tensor] = {}
        self.norms: list[float] = []
        self.keys: list[str] = []

    @property
    def count(self) -> int:  # type: ignore[override]
        return len(self.norms)

    def add(self, state: Mapping[str, Tensor], weight: float) -> None:
        self.keys = self.keys or list(state)
        delta = {k: v.double() - self.old[k].double() for k, v in state.items() if torch.is_floating_point(v)}
        norm = math.sqrt(sum(float((d ** 2).sum()) for d in delta.values()))
        scale = min(1.0, self.clip / norm) if norm > 0 else 1.0
        for k, d in delta.items():
            self.sum[k] = self.sum[k] + d * scale if k in self.sum else d * scale
        for k, v in state.items():
            if not torch.is_floating_point(v):
                self.ints[k] = torch.maximum(self.ints[k], v) if k in self.ints else v.clone()
        self.norms.append(norm)

    def result(self) -> dict[str, Tensor]:
        if not self.norms:
            raise ValueError("nothing to aggregate")
        out = dict(self.ints)
        sd = self.noise * self.clip
        for k in sorted(self.sum):
            noisy = self.sum[k] + sd * torch.randn(self.sum[k].shape, generator=self.gen, dtype=torch.float64)
            out[k] = (self.old[k].double() + noisy / len(self.norms)).to(self.old[k].dtype)
        return {k: out[k] for k in self.keys}


class ClientDP(Component):
    PARAMS = (
        Param("dp_clip", float, 0.0, "DP-FedAvg: L2 clip C of each client's whole update (0 = DP off)"),
        Param("dp_noise", float, 0.0, "DP-FedAvg: Gaussian noise multiplier z (std z*C on the sum)"),
        Param("dp_delta", float, 1e-5, "DP-FedAvg: delta reported with epsilon"),
        Param("dp_seed", int, 0, "DP-FedAvg: seed of the server's noise (with the round index)"),
    )

    def __init__(self, clip: float, noise: float, delta: float, seed: int) -> None:
        self.clip, self.noise, self.delta, self.seed = clip, noise, delta, seed

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> ClientDP | None:
        if settings["dp_clip"] <= 0:
            if settings["dp_noise"] > 0:
                raise ValueError("dp_noise needs dp_clip > 0 (the noise is calibrated to the clip)")
            return None
        return cls(settings["dp_clip"], settings["dp_noise"], settings["dp_delta"], settings["dp_seed"])

    def state_aggregator(self, old_global, round_idx, n_clients_total) -> StateAggregator:
        return DPStates(self.clip, self.noise, self.seed, round_idx, old_global)

    def report(self, n_clients_total: int, per_round: int, rounds: int) -> dict[str, Any]:
        q = per_round / max(n_clients_total, 1)
        return {"privacy": {"mechanism": "DP-FedAvg (client-level, Gaussian at the server)", "clip": self.clip,
                            "noise_multiplier": self.noise, "sample_rate": q, "rounds": rounds, "delta": self.delta,
                            "epsilon": dp_epsilon(self.noise, q, rounds, self.delta),
                            "accountant": "dp-accounting RDP, Poisson-subsampled Gaussian"}}


DPFEDAVG = Algorithm("dpfedavg", "FedAvg with client-level DP: clip C = 0.5, Gaussian noise z = 1.0 at the server",
                     (ClientDP,), {"dp_clip": 0.5, "dp_noise": 1.0}, reference="McMahan et al., ICLR 2018")


if __name__ == "__main__":  # python -m neurofed.trainer.fl.algorithms.dp EPSILON SAMPLE_RATE ROUNDS [DELTA]
    import sys

    eps, q, t = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    d = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-5
    z = noise_for_epsilon(eps, q, t, d)
    print(f"noise multiplier {z:.3f} gives epsilon {dp_epsilon(z, q, t, d):.3f} (delta {d:g}, q {q}, {t} rounds)")
