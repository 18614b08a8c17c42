"""One model made of several: the mean of the members' softmax outputs (issue 21, "what closes the gap").

``neurofed ensemble`` measured that averaging the softmax of several federated models (seeds, strategies) beats each
of them on held-out subjects; :class:`SoftmaxEnsemble` is that rule as one ``nn.Module``, so an ensemble is saved as
one checkpoint (:func:`neurofed.trainer.checkpoint.combine_checkpoints`), exported as one ONNX graph and decoded live like any
model. Its output is the log of the mean probability, ``log(mean_i softmax(z_i))``: consumers that apply a softmax
to the output get exactly the mean probabilities, and the arg-max is the ensemble's decision.

Each member keeps its own BatchNorm semantics (a batch-specific member normalises over the test batch, a running-BN
member uses its statistics), so members trained with different strategies can be combined.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

#: ``ModelMeta.model`` of an ensemble; its members' descriptions are ``extra["members"]``
ENSEMBLE = "ensemble"


class SoftmaxEnsemble(nn.Module):
    """``forward(x) = log(mean_i softmax(member_i(x)))`` over the members (a numerically stable log-sum-exp).

    Parameters
    ----------
    members : sequence of nn.Module
        Models with the same input shape and classes (in the same order); at least one.
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logp = torch.stack([torch.log_softmax(m(x), dim=1) for m in self.members])
        return torch.logsumexp(logp, dim=0) - math.log(len(self.members))


__all__ = ["ENSEMBLE", "SoftmaxEnsemble"]
