"""Local training: one SGD loop whose steps the strategy's components shape (see :mod:`neurofed.trainer.fl.api`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property

import numpy as np
import torch
from torch import Tensor, nn

from neurofed.trainer.fl.api import LocalHook, RoundInputs, Strategy
from neurofed.trainer.fl.augment import Augment, mixed_ce
from neurofed.trainer.perturb import frozen_bn_stats, perturbed


@dataclass(frozen=True)
class LocalConfig:
    """Client optimiser and schedule. The defaults ARE the published protocol (the one definition that
    ``neurofed simulate``, the demo, the coordinator and hence every edge client use; see
    :mod:`neurofed.trainer.presets`): SGD lr 0.05, momentum 0.9, wd 1e-4, client batch 8, 2 local epochs.

    The papers use lr 0.005 and batch 32 (``--preset paper``); with 45 trials a client then takes ~3
    SGD steps per round and training stays at chance on this data (studies/table30/README.md).

    Parameters
    ----------
    lr, momentum, weight_decay : float
    batch_size : int
        Client mini-batch size.
    local_epochs : int
        Passes over the client's trials per round.
    augment : str
        Data augmentation of each local mini-batch (:mod:`neurofed.trainer.fl.augment`; ``""``: off, the default,
        and then left out of :meth:`to_dict` so every earlier configuration reads the same).
    channels, classes : tuple of str
        The trials' channel and class names, needed only by the ``mirror`` augmentation (which trades left- and
        right-hemisphere channels and the left and right classes); empty otherwise and then left out of
        :meth:`to_dict`. The simulation fills them in from the data.
    """

    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-4
    batch_size: int = 8
    local_epochs: int = 2
    augment: str = ""
    channels: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.batch_size < 2 or self.local_epochs < 1:
            raise ValueError(f"invalid local config {self}: need lr > 0, batch_size >= 2, local_epochs >= 1")
        object.__setattr__(self, "channels", tuple(self.channels))
        object.__setattr__(self, "classes", tuple(self.classes))
        self._augment  # noqa: B018 - parsed (and bound when the names are known) here: a bad spec fails at once

    @cached_property
    def _augment(self) -> Augment:
        """The parsed ``augment`` spec, bound to ``channels`` and ``classes`` when they are known (once per
        configuration; not a dataclass field, so neither compared nor serialised)."""
        aug = Augment.parse(self.augment)
        return aug.bind(self.channels, self.classes) if self.channels and self.classes else aug

    def augmentation(self) -> Augment:
        """The parsed ``augment`` spec, bound to ``channels`` and ``classes`` when it mirrors.

        Raises
        ------
        ValueError
            ``mirror`` without the trials' channel and class names, in one line (a bad spec or an unmirrorable
            montage fails when the configuration is made).
        """
        if self._augment.mirror > 0 and not self._augment.channel_perm:
            raise ValueError("augment mirror needs the trials' channel and class names (LocalConfig.channels, "
                             ".classes)")
        return self._augment

    def bound(self, channels: Sequence[str], classes: Sequence[str]) -> LocalConfig:
        """This configuration for trials with these channel and class names: filled in only when the augmentation
        mirrors (the one transform that needs them), else ``self`` unchanged.

        Raises
        ------
        ValueError
            A montage or class list the mirror cannot reflect, in one line.
        """
        if self._augment.mirror <= 0:
            return self
        return replace(self, channels=tuple(channels), classes=tuple(classes))

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("augment", "channels", "classes"):
            if not d[k]:
                del d[k]
            elif k != "augment":
                d[k] = list(d[k])
        return d


def batches(n: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled mini-batch indices; a trailing batch of one trial is dropped (BN needs >= 2)."""
    perm = rng.permutation(n)
    out = [perm[i : i + batch_size] for i in range(0, n, batch_size)]
    return [b for b in out if len(b) >= 2]


def train_local(
    model: nn.Module,
    X: np.ndarray,
    y: np.ndarray,
    strategy: Strategy,
    cfg: LocalConfig,
    seed: int,
    hooks: Sequence[LocalHook] | None = None,
) -> dict[str, float]:
    """Train ``model`` in place on (X, y) for ``cfg.local_epochs`` epochs.

    Each step: the batch augmented (``cfg.augment``, its own seeded stream; off by default), the hooks' adversarial inputs (FAT), the loss (cross-entropy + every hook's loss term:
    FedProx, MOON), the first-pass gradient; if any hook perturbs weights (SAM, AWP), the sum of their
    perturbations is applied, the gradient taken there and the exact weights restored; the hooks'
    gradient corrections (SCAFFOLD); then one SGD step.

    Parameters
    ----------
    hooks : sequence of LocalHook, optional
        This round's hooks (:meth:`Strategy.local_hooks`); by default built from ``strategy`` with no
        client-kept state and the model itself as the round's global state (centralised training).

    Returns
    -------
    dict
        ``loss`` (mean over steps) and ``steps``.
    """
    local_fit = getattr(model, "local_fit", None)
    if local_fit is not None:  # a model fitted from summed statistics (neurofed.trainer.models.classical): no SGD
        return local_fit(X, y, strategy.settings)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if hooks is None:
        inputs = RoundInputs(dict(model.state_dict()), {}, cfg.lr, cfg.momentum)
        hooks = [h for _, h in strategy.local_hooks(model, {}, inputs)]
    features = any(h.needs_features for h in hooks)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    aug = cfg.augmentation()
    arng = aug.rng(seed) if aug.on else None
    y2: Tensor | None = None
    lam = 1.0

    def loss_on(xb: Tensor, yb: Tensor) -> Tensor:
        if features:
            z = model.features(xb)
            loss = mixed_ce(model.classifier(z), yb, y2, lam)
        else:
            z = None
            loss = mixed_ce(model(xb), yb, y2, lam)
        for h in hooks:
            term = h.loss_term(xb, z)
            if term is not None:
                loss = loss + term
        return loss

    try:
        total, steps = 0.0, 0
        for _ in range(cfg.local_epochs):
            for idx in batches(len(X), cfg.batch_size, rng):
                xb, yb = Xt[idx], yt[idx]
                if arng is not None:  # the mixup partner and weight are read by loss_on
                    xb, yb, y2, lam = aug(xb, yb, arng)
                for h in hooks:
                    xb = h.adversarial(model, xb, yb)
                opt.zero_grad(set_to_none=True)
                loss = loss_on(xb, yb)
                loss.backward()
                parts = [d for h in hooks if (d := h.weight_delta(params)) is not None]
                if parts:
                    deltas: list[Tensor | None] = [None] * len(params)
                    for part in parts:
                        deltas = [d if q is None else (q if d is None else d + q) for d, q in zip(deltas, part)]
                    with perturbed(params, deltas), frozen_bn_stats(model):
                        opt.zero_grad(set_to_none=True)
                        loss_on(xb, yb).backward()
                for h in hooks:
                    h.correct(params)
                opt.step()
                total += float(loss.detach())
                steps += 1
    finally:  # e.g. FedFA's forward hooks come off the model, also in centralised training
        for h in hooks:
            h.close()
    return {"loss": total / max(steps, 1), "steps": float(steps)}
