"""Data augmentation inside a client's local training (issue 57: one lever towards a better single model).

A spec string names the transforms and their strengths, comma-separated ``NAME:VALUE`` (``--augment`` of
``neurofed simulate``; empty: off, the default). ``mi`` is the recipe measured in studies/levers: the issue's four
transforms at the strengths EEG augmentation studies use (Rommel et al., J. Neural Eng. 2022; braindecode's
``ChannelsDropout``, ``Mixup``; Schirrmeister et al. 2017's crops as a time shift)::

    mi = shift:0.05,scale:0.1,dropout:0.1,mixup:0.2

Transforms, applied to each mini-batch (trials, channels, times) in this order, every trial drawn afresh:

``shift:F``
    each trial moved in time by a whole number of samples drawn uniformly in [-F*T, F*T] (T: samples per trial),
    the vacated samples set to 0 (the aligned, band-passed signal's mean); 0.05 at 4 s = up to +-0.2 s.
``scale:A``
    each trial multiplied by a factor drawn uniformly in [1-A, 1+A].
``noise:S``
    Gaussian noise of S x each channel's standard deviation in that trial added.
``dropout:P``
    each channel of each trial set to 0 with probability P (no rescaling, as braindecode's ChannelsDropout).
``mixup:ALPHA``
    one lambda ~ Beta(ALPHA, ALPHA) per batch, folded to max(lambda, 1-lambda) so the trial keeps its own label
    as the dominant one; each trial mixed with a partner from a random permutation of the batch; the loss is the
    paired loss lambda*CE(y) + (1-lambda)*CE(y_partner) (= cross-entropy on the soft labels).

Determinism: every draw comes from ``numpy.random.default_rng([seed, AUG_STREAM])`` with the client's round seed:
a stream of its own, so the mini-batches (drawn from ``default_rng(seed)``) and the dropout masks (torch's
generator) are exactly those of a run without augmentation, and both engines (sequential, vectorised) draw the same
augmentations. Augmentation happens only in local training: evaluation, export and the deployed graph are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

#: the augmentation's own random stream beside the round seed (``default_rng([seed, AUG_STREAM])``)
AUG_STREAM = 5757
#: named recipes
RECIPES = {"mi": "shift:0.05,scale:0.1,dropout:0.1,mixup:0.2"}


@dataclass(frozen=True)
class Augment:
    """A parsed ``--augment`` spec (all 0: off). See the module docstring for each transform."""

    shift: float = 0.0
    scale: float = 0.0
    noise: float = 0.0
    dropout: float = 0.0
    mixup: float = 0.0

    @classmethod
    def parse(cls, spec: str | None) -> Augment:
        """``"mi"`` or ``"shift:0.05,mixup:0.2"`` -> Augment; ``""``/None -> off.

        Raises
        ------
        ValueError
            An unknown transform or a value out of range, in one line.
        """
        spec = (spec or "").strip()
        spec = RECIPES.get(spec, spec)
        names = [f.name for f in fields(cls)]
        vals: dict[str, float] = {}
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            name, _, value = part.partition(":")
            if name not in names or not value:
                raise ValueError(f"augment {part!r}: use NAME:VALUE with NAME one of {', '.join(names)} "
                                 f"(or a recipe: {', '.join(RECIPES)})")
            try:
                v = float(value)
            except ValueError:
                raise ValueError(f"augment {part!r}: {value!r} is not a number") from None
            top = 1.0 if name in ("shift", "scale", "dropout") else float("inf")
            if not 0.0 <= v < top or (name in ("shift", "dropout") and v >= 0.5):
                raise ValueError(f"augment {part!r}: {name} must be in [0, {0.5 if name in ('shift', 'dropout') else top})")
            vals[name] = v
        return cls(**vals)

    @property
    def on(self) -> bool:
        return any(getattr(self, f.name) > 0 for f in fields(self))

    def rng(self, seed: int) -> np.random.Generator:
        """The augmentation stream of a client's round seed."""
        return np.random.default_rng([int(seed), AUG_STREAM])

    def __call__(self, x: Tensor, y: Tensor, rng: np.random.Generator) -> tuple[Tensor, Tensor, Tensor | None, float]:
        """One batch augmented: (x', y, y_partner or None, lambda). ``x`` (B, C, T) is not modified in place."""
        b, c, t = x.shape
        out = x.clone()
        if self.shift > 0:
            m = int(round(self.shift * t))
            if m > 0:
                shifts = rng.integers(-m, m + 1, size=b)
                moved = torch.zeros_like(out)
                for i, s in enumerate(shifts):
                    s = int(s)
                    if s > 0:
                        moved[i, :, s:] = out[i, :, : t - s]
                    elif s < 0:
                        moved[i, :, : t + s] = out[i, :, -s:]
                    else:
                        moved[i] = out[i]
                out = moved
        if self.scale > 0:
            f = rng.uniform(1 - self.scale, 1 + self.scale, size=b)
            out = out * torch.as_tensor(f, dtype=out.dtype).reshape(b, 1, 1)
        if self.noise > 0:
            sd = out.std(dim=-1, keepdim=True)
            out = out + self.noise * sd * torch.as_tensor(rng.standard_normal((b, c, t)), dtype=out.dtype)
        if self.dropout > 0:
            keep = rng.random((b, c)) >= self.dropout
            out = out * torch.as_tensor(keep, dtype=out.dtype).reshape(b, c, 1)
        if self.mixup > 0:
            lam = float(rng.beta(self.mixup, self.mixup))
            lam = max(lam, 1.0 - lam)
            perm = torch.as_tensor(rng.permutation(b))
            out = lam * out + (1 - lam) * out[perm]
            return out, y, y[perm], lam
        return out, y, None, 1.0


def mixed_ce(logits: Tensor, y: Tensor, y2: Tensor | None, lam: float) -> Tensor:
    """Cross-entropy of a batch, the mixup pair's loss when ``y2`` is given (mean over the batch)."""
    if y2 is None:
        return F.cross_entropy(logits, y)
    return lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, y2)


__all__ = ["AUG_STREAM", "RECIPES", "Augment", "mixed_ce"]
