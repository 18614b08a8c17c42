"""FedProx: a proximal term (mu/2)||w - w_global||^2 in every client's loss."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from neurofed.trainer.fl.api import Algorithm, LocalHook, Param, RoundInputs, ScalarComponent


class _ProxHook(LocalHook):
    def __init__(self, mu: float, params: list[nn.Parameter], anchor: list[Tensor]) -> None:
        self.mu, self.params, self.anchor = mu, params, anchor

    def loss_term(self, xb: Tensor, z: Tensor | None) -> Tensor:
        return 0.5 * self.mu * sum(((p - a) ** 2).sum() for p, a in zip(self.params, self.anchor))


class Prox(ScalarComponent):
    PARAMS = (Param("prox_mu", float, 0.0, "FedProx proximal weight mu (0 = off; the papers use 1.0)"),)

    def local_round(self, model: nn.Module, kept: Mapping[str, Tensor] | None, inputs: RoundInputs) -> LocalHook:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return _ProxHook(self.value, [p for _, p in named], [inputs.global_state[n].detach().clone() for n, _ in named])


FEDPROX = Algorithm("fedprox", "SGD + (mu/2)||w - w_global||^2, mu = 0.01", (Prox,), {"prox_mu": 0.01},
                    reference="Li et al., MLSys 2020")
