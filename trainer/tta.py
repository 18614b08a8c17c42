"""Label-free test-time adaptation (TTA) of a trained decoder on one session's stream of windows (issue 57).

A session is decoded **online and causally**: its windows in their recorded order, one at a time. Window ``t``'s
prediction depends on windows ``1..t`` only, and window ``t`` enters any parameter update (entropy minimisation)
only *after* its prediction has been made. Nothing here reads a label: the functions take the windows alone.

What decodes window ``t`` (:class:`TTAConfig`):

* ``bn="context"`` (no adaptation; the deployed standalone graph's decoder): batch-specific BN over window ``t``
  and the last ``context - 1`` windows (``export/standalone.py``); a standard-BN model uses its running statistics.
* ``bn="adaptive"``: every BN layer normalises with the session's **running moments** (``E[x]`` and ``E[x^2]`` per
  channel over the windows so far, window ``t`` included): a cumulative mean until ``1 / momentum`` windows have
  been seen, an exponential moving average (weight ``momentum`` per window) after. A batch-specific-BN model has no
  source statistics (the first window starts them); a standard-BN model starts from its running statistics,
  weighted as ``prior_windows`` windows (adaptive BN, Li et al. 2016; Wimpff et al. 2023).
* ``entropy=True`` (on top of ``adaptive``): Tent (Wang et al., ICLR 2021): after window ``t`` is decoded,
  ``steps`` SGD steps on the BN affine parameters (weight and bias only) minimising the mean prediction entropy over
  the last ``buffer`` windows (``t`` included), normalised with the running moments (not back-propagated through),
  optionally minus ``diversity`` x the entropy of their mean prediction (information maximisation, T-TIME).

Safeguards (EATA / SAR style), all counted in :class:`StreamResult`:

* windows whose current prediction entropy is above ``max_entropy x ln C`` are left out of the loss; a step with no
  window left is skipped;
* collapse reset: exponential moving averages (weight ``guard_momentum``) of the decoded class probabilities and
  of their entropy are kept; once ``guard_warmup`` windows have been decoded since the last reset, if any class's
  average falls below ``min_marginal / C`` or the average entropy below ``min_entropy x ln C``, the affine
  parameters and the optimiser go back to the source model's (the running moments stay: they are the session's
  statistics, not learned);
* ``steps`` is capped at :data:`MAX_STEPS` per window.

Online Euclidean alignment (``ea_online=True``, for windows given unaligned): window ``t`` and its context are
aligned with ``R_t^{-1/2}``, ``R_t`` the mean ``X X^T / T`` of windows ``1..t`` (the standalone graph's rule).
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from neurofed.trainer.data.preprocess import ea_inv_sqrt

#: most SGD steps allowed per window
MAX_STEPS = 10
BN_CHOICES = ("context", "adaptive")


@dataclass(frozen=True)
class TTAConfig:
    """How a session's stream is decoded and adapted (see the module docstring)."""

    bn: str = "adaptive"
    context: int = 8
    momentum: float = 0.05
    prior_windows: float = 8.0
    entropy: bool = False
    lr: float = 1e-3
    sgd_momentum: float = 0.9
    steps: int = 1
    buffer: int = 8
    max_entropy: float = 0.4
    diversity: float = 0.0
    guard_momentum: float = 0.1
    guard_warmup: int = 8
    min_marginal: float = 0.4
    min_entropy: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.bn not in BN_CHOICES:
            raise ValueError(f"bn must be one of {BN_CHOICES}, got {self.bn!r}")
        if self.entropy and self.bn != "adaptive":
            raise ValueError("entropy minimisation runs on the adaptive-BN decoder (bn='adaptive')")
        if not 0 <= self.steps <= MAX_STEPS:
            raise ValueError(f"steps must be in [0, {MAX_STEPS}], got {self.steps}")
        if self.context < 1 or self.buffer < 1:
            raise ValueError("context and buffer must be at least 1 window")
        if not 0 < self.momentum <= 1 or not 0 < self.guard_momentum <= 1:
            raise ValueError("momentum and guard_momentum must be in (0, 1]")
        if self.lr < 0 or self.prior_windows < 0 or self.max_entropy <= 0:
            raise ValueError("lr and prior_windows must be >= 0, max_entropy > 0")
        if not 0 <= self.min_marginal < 1 or not 0 <= self.min_entropy < 1:
            raise ValueError("min_marginal and min_entropy are fractions in [0, 1)")


@dataclass
class StreamResult:
    """One session decoded: ``probs`` (windows, classes) in stream order, and what adaptation did."""

    probs: np.ndarray
    updates: int = 0
    skipped: int = 0
    resets: list[int] = field(default_factory=list)

    @property
    def pred(self) -> np.ndarray:
        return self.probs.argmax(1)


class StreamBN(nn.Module):
    """A BatchNorm2d that normalises with running moments of the stream (see :class:`TTAConfig`, ``adaptive``).

    ``update=True``: the input's per-channel moments enter the running moments first (cumulative weight
    ``n / count`` until it drops below ``momentum``), then the input is normalised with them;
    ``update=False``: normalised with the moments as they are. Only ``weight`` and ``bias`` are parameters.
    """

    def __init__(self, bn: _BatchNorm, momentum: float, prior_windows: float) -> None:
        super().__init__()
        self.eps = float(bn.eps)
        self.momentum = float(momentum)
        self.weight = nn.Parameter(bn.weight.detach().clone())
        self.bias = nn.Parameter(bn.bias.detach().clone())
        c = self.weight.numel()
        if bn.track_running_stats and bn.running_mean is not None:
            mean = bn.running_mean.detach().double().clone()
            sq = bn.running_var.detach().double() + mean * mean
            self.count = float(prior_windows)
        else:
            mean, sq = torch.zeros(c, dtype=torch.float64), torch.zeros(c, dtype=torch.float64)
            self.count = 0.0
        self.register_buffer("mean", mean)
        self.register_buffer("sq", sq)
        self.update = True

    def forward(self, x: Tensor) -> Tensor:
        if self.update:
            xd = x.detach().double()
            n = x.shape[0]
            self.count += n
            w = max(self.momentum, n / self.count)
            self.mean = (1 - w) * self.mean + w * xd.mean(dim=(0, 2, 3))
            self.sq = (1 - w) * self.sq + w * (xd * xd).mean(dim=(0, 2, 3))
        if self.count <= 0:
            raise RuntimeError("StreamBN has no statistics yet: decode a window first")
        var = torch.clamp(self.sq - self.mean * self.mean, min=0.0)
        scale = (self.weight.double() / torch.sqrt(var + self.eps)).float()
        shift = self.bias - self.mean.float() * scale
        return x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)


def stream_model(model: nn.Module, cfg: TTAConfig) -> tuple[nn.Module, list[StreamBN]]:
    """A copy of ``model`` (eval mode, every parameter frozen) with each BatchNorm replaced by a :class:`StreamBN`
    whose affine parameters are the only trainable ones. ``model`` itself is not touched."""
    net = copy.deepcopy(model).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    swapped: list[StreamBN] = []
    for name, mod in list(net.named_modules()):
        if isinstance(mod, _BatchNorm):
            parent_name, _, attr = name.rpartition(".")
            parent = net.get_submodule(parent_name) if parent_name else net
            sbn = StreamBN(mod, cfg.momentum, cfg.prior_windows)
            setattr(parent, attr, sbn)
            swapped.append(sbn)
    if not swapped:
        raise ValueError("adaptive BN needs a model with BatchNorm layers")
    return net, swapped


def _entropy(p: Tensor) -> Tensor:
    return -(p * torch.log(p.clamp_min(1e-12))).sum(-1)


class CollapseGuard:
    """Moving averages of the decoded class probabilities and their entropy; :meth:`observe` says when to reset.

    Parameters
    ----------
    n_classes : int
    momentum : float
        Weight of a new window in the averages.
    warmup : int
        Windows observed since the last reset before a reset can be called.
    min_marginal : float
        Reset when a class's average probability is below ``min_marginal / n_classes``.
    min_entropy : float
        Reset when the average entropy is below ``min_entropy x ln(n_classes)``.
    """

    def __init__(self, n_classes: int, momentum: float, warmup: int, min_marginal: float, min_entropy: float) -> None:
        self.c, self.m, self.warmup = n_classes, momentum, warmup
        self.marginal_bound = min_marginal / n_classes
        self.entropy_bound = min_entropy * math.log(n_classes)
        self.reset()

    def reset(self) -> None:
        self.marginal = np.full(self.c, 1.0 / self.c)
        self.entropy = math.log(self.c)
        self.seen = 0

    def observe(self, probs: np.ndarray) -> bool:
        """Add one decoded window's probabilities; True if the model has collapsed (the caller resets)."""
        p = np.asarray(probs, dtype=np.float64)
        self.marginal = (1 - self.m) * self.marginal + self.m * p
        self.entropy = (1 - self.m) * self.entropy + self.m * float(-(p * np.log(np.clip(p, 1e-12, None))).sum())
        self.seen += 1
        if self.seen < self.warmup:
            return False
        return bool(self.marginal.min() < self.marginal_bound or self.entropy < self.entropy_bound)


class _Aligner:
    """Online Euclidean alignment: running sum of ``X X^T / T``; ``matrix()`` is ``R_t^{-1/2}``."""

    def __init__(self, n_ch: int) -> None:
        self.cov = np.zeros((n_ch, n_ch))
        self.n = 0

    def add(self, x: np.ndarray) -> None:
        x64 = np.asarray(x, dtype=np.float64)
        self.cov += x64 @ x64.T / x64.shape[1]
        self.n += 1

    def matrix(self) -> np.ndarray:
        return ea_inv_sqrt(self.cov / self.n)


def decode_stream(model: nn.Module, X: np.ndarray, cfg: TTAConfig | None = None, ea_online: bool = False) -> StreamResult:
    """Decode one session's windows ``X`` (windows, channels, times), in order, with ``cfg``'s adaptation.

    Parameters
    ----------
    model : nn.Module
        The trained network; it is copied, never modified.
    X : ndarray
        The session's preprocessed windows in recorded order (aligned already, or raw when ``ea_online``).
    cfg : TTAConfig, optional
        Default ``TTAConfig(bn="context")``: no adaptation (the deployed decoder).
    ea_online : bool
        Align online (running reference of the windows so far, the current one included).

    Returns
    -------
    StreamResult
    """
    cfg = cfg or TTAConfig(bn="context")
    X = np.asarray(X, dtype=np.float32)
    if X.ndim != 3 or len(X) == 0:
        raise ValueError(f"decode_stream needs (windows, channels, times) with at least one window, got {X.shape}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        if cfg.bn == "context":
            return _decode_context(model, X, cfg, ea_online)
        return _decode_adaptive(model, X, cfg, ea_online)


def _align(xs: np.ndarray, a: np.ndarray | None) -> Tensor:
    if a is None:
        return torch.as_tensor(np.ascontiguousarray(xs, dtype=np.float32))
    return torch.as_tensor(np.einsum("cd,ndt->nct", a, xs.astype(np.float64)).astype(np.float32))


def _decode_context(model: nn.Module, X: np.ndarray, cfg: TTAConfig, ea_online: bool) -> StreamResult:
    net = copy.deepcopy(model).eval()
    batch_specific = any(isinstance(m, _BatchNorm) and not m.track_running_stats for m in net.modules())
    k = cfg.context if batch_specific else 1
    aligner = _Aligner(X.shape[1]) if ea_online else None
    out = []
    with torch.no_grad():
        for t in range(len(X)):
            a = None
            if aligner is not None:
                aligner.add(X[t])
                a = aligner.matrix()
            batch = _align(X[max(0, t - k + 1) : t + 1], a)
            out.append(torch.softmax(net(batch)[-1], dim=-1).numpy())
    return StreamResult(np.stack(out))


def _decode_adaptive(model: nn.Module, X: np.ndarray, cfg: TTAConfig, ea_online: bool) -> StreamResult:
    net, bns = stream_model(model, cfg)
    params = [p for b in bns for p in (b.weight, b.bias)]
    source = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.sgd_momentum) if cfg.entropy else None
    aligner = _Aligner(X.shape[1]) if ea_online else None
    buf: deque[np.ndarray] = deque(maxlen=cfg.buffer)
    res = StreamResult(np.zeros((0, 0)))
    out = []
    guard: CollapseGuard | None = None
    for t in range(len(X)):
        a = None
        if aligner is not None:
            aligner.add(X[t])
            a = aligner.matrix()
        # 1. decode window t: its moments enter the running moments, no parameter has seen it yet
        for b in bns:
            b.update = True
        with torch.no_grad():
            p = torch.softmax(net(_align(X[t : t + 1], a))[0], dim=-1).numpy()
        out.append(p)
        buf.append(X[t])
        if not cfg.entropy:
            continue
        # 2. safeguard: collapsed predictions -> back to the source affine parameters
        if guard is None:
            guard = CollapseGuard(len(p), cfg.guard_momentum, cfg.guard_warmup, cfg.min_marginal, cfg.min_entropy)
        if guard.observe(p):
            with torch.no_grad():
                for q, s in zip(params, source):
                    q.copy_(s)
            opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.sgd_momentum)
            guard.reset()
            res.resets.append(t)
            continue
        # 3. adapt on the windows so far (t included), after t's prediction
        for b in bns:
            b.update = False
        xb = _align(np.stack(buf), a)
        for _ in range(cfg.steps):
            probs = torch.softmax(net(xb), dim=-1)
            ent = _entropy(probs)
            keep = ent < cfg.max_entropy * math.log(probs.shape[1])
            if not bool(keep.any()):
                res.skipped += 1
                break
            loss = ent[keep].mean()
            if cfg.diversity:
                loss = loss - cfg.diversity * _entropy(probs[keep].mean(0))
            opt.zero_grad()
            loss.backward()
            opt.step()
            res.updates += 1
    res.probs = np.stack(out)
    return res
