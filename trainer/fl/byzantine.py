"""Simulated Byzantine clients for robustness experiments (in process; never used by a real client).

``Byzantine.parse("0.2:scale:10")``: a seeded 20 % of the clients attack every round they are selected:

* ``scale:K``    upload ``w_g + K (w - w_g)`` (a boosted honest update; K default 10);
* ``signflip:K`` upload ``w_g - K (w - w_g)`` (K default 1);
* ``labelflip``  train on flipped labels (``(y + 1) mod C``), upload honestly (data poisoning);
* ``huge:K``     upload every weight times K (default 1000: the "1000x update").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from neurofed.trainer.fl.client import ClientUpdate

ATTACKS = {"scale": 10.0, "signflip": 1.0, "labelflip": 0.0, "huge": 1000.0}


@dataclass(frozen=True)
class Byzantine:
    fraction: float
    attack: str
    factor: float
    seed: int = 0

    @classmethod
    def parse(cls, spec: str, seed: int = 0) -> Byzantine:
        """``FRACTION:ATTACK[:FACTOR]``, e.g. ``0.2:signflip`` or ``0.1:scale:10``."""
        parts = spec.split(":")
        try:
            frac, attack = float(parts[0]), parts[1]
            factor = float(parts[2]) if len(parts) > 2 else ATTACKS[attack]
        except (IndexError, ValueError, KeyError):
            raise ValueError(f"--byzantine {spec!r}: use FRACTION:ATTACK[:FACTOR] with ATTACK in "
                             f"{', '.join(ATTACKS)}, e.g. 0.2:scale:10") from None
        if not 0 <= frac < 1:
            raise ValueError(f"--byzantine {spec!r}: the fraction must be in [0, 1)")
        return cls(frac, attack, factor, seed)

    def attackers(self, client_ids: Sequence[str]) -> list[str]:
        """``round(fraction x N)`` client ids, drawn once with the run's seed."""
        ids = sorted(client_ids)
        n = int(round(self.fraction * len(ids)))
        rng = np.random.default_rng([self.seed, 0xB7])
        return sorted(ids[i] for i in rng.choice(len(ids), size=n, replace=False))

    def labels(self, y: np.ndarray, n_classes: int) -> np.ndarray:
        return (y + 1) % n_classes if self.attack == "labelflip" else y

    def poison(self, upd: ClientUpdate, global_state: Mapping[str, Tensor]) -> ClientUpdate:
        if self.attack == "labelflip":
            return upd
        out = {}
        for k, w in upd.state.items():
            if not torch.is_floating_point(w):
                out[k] = w
            elif self.attack == "huge":
                out[k] = w * self.factor
            else:
                g = global_state.get(k, w)
                sign = 1.0 if self.attack == "scale" else -1.0
                out[k] = g + sign * self.factor * (w - g)
        return ClientUpdate(out, upd.n_samples, upd.extras, upd.metrics)
