"""Server-side weight averaging: the released model is an exponential moving average of the global models over
the rounds (issue 57, "longer federations": a cheap way to take more of a run's late rounds into one model).

After each round the server keeps ``a <- decay * a + (1 - decay) * w`` for every floating entry ``w`` of the new
global state (integer counters copy the latest value); the first aggregated round initialises ``a``. Training is
unchanged: the clients keep receiving the plain global model, so a run with and without averaging trains the same
weights, and only the *released* model differs (the one evaluated on held-out subjects, saved, exported and
published as the final model; :meth:`neurofed.trainer.fl.api.Strategy.released_state`). Averaging weights along a
trajectory is stochastic weight averaging (Izmailov et al., UAI 2018); in federated learning it was used server-side
by Caldarola et al. (ECCV 2022, FedSWA), who average the global models of the last rounds. An exponential average
needs no knowledge of the run's length (a coordinator can stop or resume at any round): with decay 0.9 a model is
about the mean of the last ten rounds, and a model 30 rounds old weighs 0.9^30 = 4 % of a fresh one.

With batch-specific BN (FedBS, SAFE) no running statistics exist, so the average needs no recomputation of BN
statistics (standard BN's running statistics are averaged like the weights, an approximation). The average lives on
the server (``swa.*`` extras: checkpointed, never sent down).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from neurofed.trainer.fl.api import Component, Param, ServerRound


class _AverageRound(ServerRound):
    def __init__(self, decay: float) -> None:
        self.decay = decay

    def finish(self, old_global, new_global, extras, n_updates):
        for k, new in new_global.items():
            key = f"{WeightAverage.KEY}.{k}"
            prev = extras.get(key)
            if prev is None or not torch.is_floating_point(new):
                extras[key] = new.detach().clone()
            else:
                extras[key] = (self.decay * prev.double() + (1.0 - self.decay) * new.double()).to(new.dtype)
        return new_global, extras


class WeightAverage(Component):
    """The released model is the server's moving average of the global models (``swa_decay`` > 0)."""

    PARAMS = (Param("swa_decay", float, 0.0, "server-side weight averaging: the released (evaluated, saved, exported) "
                    "model is the exponential moving average of the global models over rounds with this decay, in "
                    "[0, 1); training is unchanged (0 = off)"),)
    KEY = "swa"

    def __init__(self, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"swa_decay must be in [0, 1), got {decay}")
        self.decay = decay

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> WeightAverage | None:
        d = settings["swa_decay"]
        return cls(d) if d > 0 else None

    def server_round(self, server_extras: Mapping[str, Tensor], n_clients_total: int) -> ServerRound:
        return _AverageRound(self.decay)

    def released_state(self, global_state: Mapping[str, Tensor],
                       server_extras: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
        p = f"{self.KEY}."
        avg = {k[len(p):]: v for k, v in server_extras.items() if k.startswith(p)}
        if not avg:  # no round aggregated yet: the initial model
            return None
        missing = sorted(set(global_state) - set(avg))
        if missing:
            raise ValueError(f"the weight average lacks {len(missing)} entries of the global model "
                             f"(e.g. {missing[0]!r}): the server state is not from one run")
        return {k: avg[k] for k in global_state}
