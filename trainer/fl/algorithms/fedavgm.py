"""FedAvgM: server momentum on the round's pseudo-gradient (Hsu, Qi, Brown 2019, "Measuring the effects of
non-identical data distribution for federated visual classification").

With ``d_t = w_t - mean_i(w_i)`` (the averaged update, as a gradient), the server keeps ``v`` and sets
``v <- beta v + d_t``, ``w_{t+1} = w_t - eta v``. ``beta = 0, eta = 1`` is FedAvg exactly. Applied to
every floating entry of the state (BN included, like the average it replaces); integer counters keep
the aggregated value. ``v`` lives on the server (``fedavgm_v.*``, checkpointed, never sent down).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from neurofed.trainer.fl.api import Algorithm, Component, Param, ServerRound


class _MomentumRound(ServerRound):
    def __init__(self, beta: float, eta: float) -> None:
        self.beta, self.eta = beta, eta

    def finish(self, old_global, new_global, extras, n_updates):
        out = dict(new_global)
        for k, new in new_global.items():
            if not torch.is_floating_point(new):
                continue
            key = f"{ServerMomentum.KEY}.{k}"
            d = old_global[k].double() - new.double()
            v = self.beta * extras[key].double() + d if key in extras else d
            out[k] = (old_global[k].double() - self.eta * v).to(new.dtype)
            extras[key] = v.to(new.dtype)
        return out, extras


class ServerMomentum(Component):
    PARAMS = (Param("server_momentum", float, 0.0, "FedAvgM server momentum beta (0 = off)"),
              Param("server_lr", float, 1.0, "FedAvgM server learning rate eta", minimum=1e-9))
    KEY = "fedavgm_v"

    def __init__(self, beta: float, eta: float) -> None:
        self.beta, self.eta = beta, eta

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> ServerMomentum | None:
        beta, eta = settings["server_momentum"], settings["server_lr"]
        return cls(beta, eta) if beta > 0 or eta != 1.0 else None

    def server_round(self, server_extras: Mapping[str, Tensor], n_clients_total: int) -> ServerRound:
        return _MomentumRound(self.beta, self.eta)


FEDAVGM = Algorithm("fedavgm", "FedAvg + server momentum on the averaged update (beta 0.9, eta 1)",
                    (ServerMomentum,), {"server_momentum": 0.9}, reference="Hsu, Qi, Brown, arXiv 1909.06335")
