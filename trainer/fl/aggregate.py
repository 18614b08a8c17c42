"""Pure aggregation rules over state dicts (no strategy, no transport): the rule interface and the streaming
weighted mean."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor


class StateAggregator:
    """How the server combines the clients' state dicts (default: :class:`neurofed.trainer.fl.aggregate.WeightedSum`).

    ``add`` each accepted state once with its weight (trial count), then ``result``. A rule that needs
    every update at once (median, Krum, adaptive clipping) buffers them: memory O(clients x model).
    """

    count: int = 0
    clipped: int | None = None  # updates this round scaled down by the rule's norm clip; None = the rule never clips

    def add(self, state: Mapping[str, Tensor], weight: float) -> None:
        raise NotImplementedError

    def result(self) -> dict[str, Tensor]:
        raise NotImplementedError


class WeightedSum(StateAggregator):
    """Streaming weighted average of state dicts: memory O(model), not O(clients x model).

    Floating tensors are accumulated in float64 and cast back to their dtype; integer tensors
    (BN's ``num_batches_tracked``) take the maximum.
    """

    def __init__(self) -> None:
        self._sum: dict[str, Tensor] = {}
        self._dtype: dict[str, torch.dtype] = {}
        self.total_weight = 0.0
        self.count = 0

    def add(self, state: Mapping[str, Tensor], weight: float) -> None:
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
