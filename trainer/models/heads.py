"""Classifier heads other than a model's own linear layer.

:class:`ConceptHead` is FedBM's (trainer/fl/algorithms/fedbm.py): a trainable projection followed by a frozen
classifier built from a language model's class-concept distributions. It lives here, beside the models, so a
checkpoint or an export that carries one can be rebuilt without the training algorithm
(:func:`install_concept_head_for`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: State-dict keys that mark a model whose ``classifier`` is a :class:`ConceptHead`.
CONCEPT_KEYS = ("classifier.mean", "classifier.var", "classifier.temperature", "classifier.projection.weight")


class ConceptHead(nn.Module):
    """Projection layer + frozen concept classifier (replaces a model's ``classifier``).

    Parameters
    ----------
    in_features : int
        Size of the EEG feature vector.
    mean, var : Tensor (C, D)
        Concept means and diagonal variances.
    temperature : float
    """

    def __init__(self, in_features: int, mean: Tensor, var: Tensor, temperature: float) -> None:
        super().__init__()
        self.projection = nn.Linear(in_features, mean.shape[1])
        self.register_buffer("mean", mean.detach().clone().float())
        self.register_buffer("var", var.detach().clone().float())
        self.register_buffer("temperature", torch.tensor(float(temperature)))

    @property
    def n_classes(self) -> int:
        return int(self.mean.shape[0])

    def embed(self, z: Tensor) -> Tensor:
        """Unit-norm projected features ``f``."""
        return F.normalize(self.projection(z), dim=1, eps=1e-8)

    def logits_of(self, f: Tensor) -> Tensor:
        """``z_j = T mu_j.f + T^2/2 sum_d s2_jd f_d^2``."""
        t = self.temperature
        return t * f @ self.mean.T + 0.5 * t * t * (f * f) @ self.var.T

    def penalty(self, f: Tensor, y: Tensor) -> Tensor:
        """The label-dependent part of the surrogate, ``T^2/2 sum_d s2_yd f_d^2`` (mean over the batch)."""
        t = self.temperature
        return (0.5 * t * t * (f * f * self.var[y]).sum(1)).mean()

    def forward(self, z: Tensor) -> Tensor:
        return self.logits_of(self.embed(z))


def install_concept_head_for(model: nn.Module, state: Mapping[str, Tensor]) -> bool:
    """Give ``model`` a :class:`ConceptHead` shaped like the one in ``state`` (a saved FedBM model).

    Returns whether it did: False when ``state`` has a plain linear classifier. The values come from
    ``state`` when it is loaded afterwards (``load_state_dict``); here only the shapes are taken.
    """
    if not all(k in state for k in CONCEPT_KEYS):
        return False
    mean, var = state["classifier.mean"], state["classifier.var"]
    in_features = int(state["classifier.projection.weight"].shape[1])
    model.classifier = ConceptHead(in_features, torch.zeros_like(mean), torch.ones_like(var),
                                   float(state["classifier.temperature"]))
    return True
