"""Data augmentation inside a client's local training (issue 57: one lever towards a better single model).

A spec string names the transforms and their strengths, comma-separated ``NAME:VALUE`` (``--augment`` of
``neurofed simulate``; empty: off, the default). ``mi`` is the recipe measured in studies/levers: the issue's four
transforms at the strengths EEG augmentation studies use (Rommel et al., J. Neural Eng. 2022; braindecode's
``ChannelsDropout``, ``Mixup``; Schirrmeister et al. 2017's crops as a time shift)::

    mi = shift:0.05,scale:0.1,dropout:0.1,mixup:0.2

Transforms, applied to each mini-batch (trials, channels, times) in this order, every trial drawn afresh:

``mirror:P``
    channel reflection (Wang et al., "Channel reflection: knowledge-driven data augmentation for EEG-based
    brain-computer interfaces", Neural Networks 2024): with probability P a trial's left- and right-hemisphere
    channels trade places (10-10 names: odd numbers left, even right, ``z`` the midline; C3 <-> C4, FC5 <-> FC6)
    and its label turns into the mirrored class (``left_fist`` <-> ``right_fist``; a class naming neither side
    keeps its label). Needs the trials' channel names and class names (:meth:`Augment.bind`); every channel must
    have its partner in the montage. A whitened (EA) trial stays whitened: the reflection is a permutation.

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

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

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

    mirror: float = 0.0
    shift: float = 0.0
    scale: float = 0.0
    noise: float = 0.0
    dropout: float = 0.0
    mixup: float = 0.0
    # set by bind() only (``mirror``): the channel and class index each one trades places with
    channel_perm: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)
    class_perm: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

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
        names = [f.name for f in fields(cls) if f.init]
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
            top = 1.0 if name in ("mirror", "shift", "scale", "dropout") else float("inf")
            if not 0.0 <= v < top or (name in ("shift", "dropout") and v >= 0.5):
                raise ValueError(f"augment {part!r}: {name} must be in [0, {0.5 if name in ('shift', 'dropout') else top})")
            vals[name] = v
        return cls(**vals)

    def bind(self, channels: Sequence[str], classes: Sequence[str]) -> Augment:
        """This augmentation for trials with these channel and class names (needed by ``mirror`` only).

        Raises
        ------
        ValueError
            ``mirror`` on a montage where a channel's mirror partner is missing, in one line.
        """
        if self.mirror <= 0:
            return self
        out = replace(self)
        object.__setattr__(out, "channel_perm", mirror_channels(channels))
        object.__setattr__(out, "class_perm", mirror_classes(classes))
        return out

    @property
    def on(self) -> bool:
        return any(getattr(self, f.name) > 0 for f in fields(self) if f.init)

    def rng(self, seed: int) -> np.random.Generator:
        """The augmentation stream of a client's round seed."""
        return np.random.default_rng([int(seed), AUG_STREAM])

    def __call__(self, x: Tensor, y: Tensor, rng: np.random.Generator) -> tuple[Tensor, Tensor, Tensor | None, float]:
        """One batch augmented: (x', y, y_partner or None, lambda). ``x`` (B, C, T) is not modified in place."""
        b, c, t = x.shape
        out = x.clone()
        if self.mirror > 0:
            if len(self.channel_perm) != c:
                raise ValueError(f"augment mirror needs the trials' {c} channel names: call Augment.bind first")
            flip = torch.as_tensor(rng.random(b) < self.mirror)
            if bool(flip.any()):
                out[flip] = out[flip][:, list(self.channel_perm)]
                y = y.clone()
                if y.ndim == 2:  # soft targets (distillation): the class columns trade places
                    y[flip] = y[flip][:, list(self.class_perm)]
                else:
                    y[flip] = torch.as_tensor(self.class_perm, dtype=y.dtype)[y[flip]]
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


_SIDE = re.compile(r"^([a-z]+?)(\d+|z)$")


def mirror_channels(channels: Sequence[str]) -> tuple[int, ...]:
    """The index of each channel's mirror image across the midline (10-10 names; trailing dots ignored).

    Odd numbers lie over the left hemisphere, even over the right: n <-> n + 1 for odd n; ``z`` (midline) maps to
    itself.

    Raises
    ------
    ValueError
        A name that is not a 10-10 position, or a channel whose partner is not in ``channels``.
    """
    names = [c.strip(".").lower() for c in channels]
    index = {n: i for i, n in enumerate(names)}
    perm = []
    for raw, n in zip(channels, names):
        m = _SIDE.match(n)
        if not m:
            raise ValueError(f"augment mirror: channel {raw!r} is not a 10-10 position (letters + number or z)")
        head, pos = m.groups()
        partner = n if pos == "z" else f"{head}{int(pos) + 1 if int(pos) % 2 else int(pos) - 1}"
        if partner not in index:
            raise ValueError(f"augment mirror: channel {raw!r} has no mirror partner ({partner}) in the montage")
        perm.append(index[partner])
    return tuple(perm)


def mirror_classes(classes: Sequence[str]) -> tuple[int, ...]:
    """The index of each class's mirror image: ``left`` <-> ``right`` in its name; a class naming neither keeps its
    index.

    Raises
    ------
    ValueError
        A mirrored class name that is not among ``classes``.
    """
    names = [c.lower() for c in classes]
    perm = []
    for c in names:
        m = re.sub(r"left|right", lambda g: "right" if g.group(0) == "left" else "left", c)
        if m not in names:
            raise ValueError(f"augment mirror: class {c!r} has no mirror class ({m}) among {list(classes)}")
        perm.append(names.index(m))
    return tuple(perm)


def mixed_ce(logits: Tensor, y: Tensor, y2: Tensor | None, lam: float) -> Tensor:
    """Cross-entropy of a batch, the mixup pair's loss when ``y2`` is given (mean over the batch)."""
    if y2 is None:
        return F.cross_entropy(logits, y)
    return lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, y2)


__all__ = ["AUG_STREAM", "RECIPES", "Augment", "mirror_channels", "mirror_classes", "mixed_ce"]
