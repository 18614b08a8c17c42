"""Vectorised local training: all of a round's clients train together as one batched computation.

Every client's parameters, buffers and SGD momentum are stacked along a leading client axis and one step of (up to
:data:`CHUNK`) clients is one call of the model under :func:`torch.func.vmap` + :func:`torch.func.functional_call`
(PyTorch turns the per-client convolutions into grouped ones). For EEGNet the first block runs in a cheaper,
equivalent order (:func:`_eegnet_features`). docs/benchmarks/simulate.md has the measured cost against the
sequential path (:func:`neurofed.trainer.fl.client.client_update` per client).

Same numbers as the sequential path, to float tolerance (tests/trainer/test_vectorised.py):

* each client's mini-batches come from its own ``numpy.random.default_rng(seed)`` exactly as
  :func:`neurofed.trainer.fl.local.batches` draws them, and its dropout masks from its own
  ``torch.Generator().manual_seed(seed)`` (the sequential path seeds the global generator with the same seed:
  the same stream), drawn per forward pass in the sequential order (FGSM's pass, the loss pass, the perturbed
  pass; MOON's global and previous model after the loss pass) with each batch's true size;
* ragged batches (a client's last batch is smaller, clients hold different numbers of trials and steps): each
  step's clients are grouped by batch size, one call per size (nothing padded, BN statistics over a client's own
  batch), and a client whose steps are done is masked out of the update;
* SGD (momentum, weight decay) is the same element-wise arithmetic as ``torch.optim.SGD``; SAM's norm, AWP's
  layer norms, FGSM's input gradient, FedProx's anchor, MOON's representations and SCAFFOLD's correction are
  per client.

What it does not know (another component's hook, a model with other layers, per-group models, GA's local loss,
FedBM's head, FedFA's feature hooks) it leaves to the sequential path: :func:`unsupported` names the reason and the
runner logs it once.
"""

from __future__ import annotations

import copy
import logging
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn.modules.batchnorm import _BatchNorm

from neurofed.trainer.fl.algorithms.fedbs import _SamHook
from neurofed.trainer.fl.algorithms.fedprox import _ProxHook
from neurofed.trainer.fl.algorithms.moon import _MoonHook
from neurofed.trainer.fl.algorithms.safe import _AwpHook, _FatHook
from neurofed.trainer.fl.algorithms.scaffold import _ScaffoldHook
from neurofed.trainer.fl.api import Component, LocalHook, Strategy
from neurofed.trainer.fl.client import ClientState, ClientUpdate, begin_client_round, end_client_round
from neurofed.trainer.fl.local import LocalConfig, batches

logger = logging.getLogger("neurofed.trainer")

ENGINES = ("sequential", "vectorised")

#: layer types whose forward is a pure function of (parameters, buffers, input): safe under functional_call + vmap
#: (a model's own block may also declare ``PURE_FORWARD = True``: its forward only calls its children and combines
#: their outputs, e.g. EEG-ITNet's branches and residual TCN blocks)
_PLAIN_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Conv1d, nn.Conv2d, nn.Linear, nn.ELU, nn.ReLU, nn.AvgPool2d, nn.ZeroPad2d, nn.Sequential,
    nn.Flatten, nn.Identity, nn.BatchNorm1d, nn.BatchNorm2d, nn.Dropout, nn.ModuleList,
)
#: model classes whose own forward is plain (layers called in order, no state) and that are tested equal.
#: DeepConvNet is not: with SAM over 12 steps the engines drifted 8e-3 apart (1 step, or without SAM: 6e-7); its
#: max-pooling is the suspect (a tie broken differently routes a gradient elsewhere), not investigated further
_MODELS = ("EEGNet", "CroppedEEGNet", "ShallowConvNet", "EEGITNet")
#: hook types this engine reproduces
_HOOKS: tuple[type[LocalHook], ...] = (_SamHook, _FatHook, _AwpHook, _ProxHook, _ScaffoldHook, _MoonHook)

_warned: set[str] = set()
#: most clients in one vmapped call (a step of more clients runs as several calls): keeps the working set in cache
#: (18 clients of EEGNet, fedbs, one round: 2.97 s CPU in one call, 2.62 s in chunks of 6, 3.23 s in chunks of 3)
CHUNK = 6


def warn_once(reason: str) -> None:
    """Log, once per process and reason, that the sequential path runs instead."""
    if reason not in _warned:
        _warned.add(reason)
        logger.warning("vectorised engine: %s; those rounds run on the sequential engine", reason)


def unsupported(model: nn.Module, strategy: Strategy) -> str | None:
    """Why the vectorised engine cannot train ``model`` under ``strategy`` (None: it can)."""
    if strategy.centralised:
        return "centralised training (CT) is one client"
    if strategy.group_prefixes:
        return "per-group (hierarchical) models"
    if type(model).__name__ not in _MODELS:
        return f"model {type(model).__name__} is not known to it"
    for name, m in model.named_modules():
        if name and type(m) not in _PLAIN_LAYERS and not getattr(type(m), "PURE_FORWARD", False):
            return f"model layer {name} ({type(m).__name__}) is not known to it"
        if m._forward_hooks or m._forward_pre_hooks:
            return f"model layer {name or 'root'} carries forward hooks"
    for c in strategy.components:
        if type(c).prepare_model is not Component.prepare_model:
            return f"component {type(c).__name__} reshapes the client model"
    return None


def unsupported_hooks(hooks: Sequence[LocalHook]) -> str | None:
    """Why these local hooks cannot be vectorised (None: they can)."""
    for h in hooks:
        if type(h) not in _HOOKS:
            return f"local hook {type(h).__qualname__} ({type(h).__module__}) is not known to it"
        if h.needs_local_loss:
            return f"local hook {type(h).__qualname__} needs the local loss"
    return None


# ---------------------------------------------------------------------------------------------- the batched model
@dataclass
class _Ctx:
    """What the patched BatchNorm/Dropout layers read inside one vmapped forward (per client under vmap)."""

    noises: list[Tensor] = field(default_factory=list)
    stats: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    record: bool = False
    z: Tensor | None = None


def _bn_forward(self: _BatchNorm, x: Tensor) -> Tensor:
    """Train-mode BatchNorm on batch statistics (PyTorch's own kernel); the statistics are recorded for the running
    estimates when asked (standard BN), which are then updated outside the vmapped call."""
    ctx: _Ctx = self._vctx  # type: ignore[assignment]
    if ctx.record and self.track_running_stats:
        dims = [0, *range(2, x.dim())]
        with torch.no_grad():
            ctx.stats.append((x.mean(dims), x.var(dims, unbiased=True)))
    return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)


def _dropout_forward(self: nn.Dropout, x: Tensor) -> Tensor:
    if self.p == 0:
        return x
    ctx: _Ctx = self._vctx  # type: ignore[assignment]
    return x * ctx.noises.pop(0)


def _eegnet_features(self: nn.Module, x: Tensor) -> Tensor:
    """EEGNet's features with its first block (temporal conv -> batch-specific BN -> depthwise spatial conv) in the
    cheaper order: all three are linear in the input, so the spatial filters go first (21 channels -> 16 maps) and the
    temporal filters run on 16 maps instead of 8 filters x 21 channels (~4x fewer multiply-adds, no
    (batch, 8, 21, time) activation). The BN's batch statistics over (batch, channels, time) of the temporal output
    come exactly from the input's windowed sums and lagged products. Same function as the module's, to float
    rounding; used by the vectorised engine only."""
    ctx: _Ctx = self._vctx  # type: ignore[assignment]
    pad, conv = self.temporal[0], self.temporal[1]
    bn, spatial = self.bnorm_temporal, self.conv_spatial
    wt = conv.weight  # (F1, 1, 1, k)
    f1, k = wt.shape[0], wt.shape[-1]
    left, right = pad.padding[0], pad.padding[1]
    b, c, t = x.shape
    xp = F.pad(x, (left, right)).reshape(b * c, t + k - 1)
    p_len = t + k - 1
    n = b * c * t
    w = wt.reshape(f1, k)
    ones = torch.ones((1, 1, t), dtype=x.dtype)
    # mean_f = sum_j w_fj * (sum over b, c and the window t+j of the padded input) / n
    win = F.conv1d(xp.sum(0).reshape(1, 1, p_len), ones).reshape(k)
    mean = (w @ win) / n
    # sum of u_f^2 over (b, c, t): the full linear correlation's energy by Parseval (FFT of length >= T + k - 1),
    # minus the outputs the 'same' padding drops at both ends (computed directly on the edge samples)
    nfft = 1 << (t + k - 2).bit_length()
    xs = x.reshape(b * c, t)
    spec = torch.fft.rfft(xs, n=nfft)
    power = (spec.real * spec.real + spec.imag * spec.imag).sum(0)  # (nfft // 2 + 1,)
    wspec = torch.fft.rfft(w, n=nfft)
    wpow = wspec.real * wspec.real + wspec.imag * wspec.imag  # (F1, nfft // 2 + 1)
    both = torch.ones(nfft // 2 + 1, dtype=x.dtype)
    both[1: (nfft + 1) // 2] = 2.0  # the half spectrum counts the mirrored bins twice (not DC, not Nyquist)
    full = (wpow * (power * both)).sum(1) / nfft
    wk = w.reshape(f1, 1, k)
    lo = F.conv1d(F.pad(xs[:, : k - 1], (k - 1, 0)).reshape(b * c, 1, 2 * (k - 1)), wk)[:, :, : k - 1 - left]
    hi = F.conv1d(F.pad(xs[:, t - (k - 1):], (0, k - 1)).reshape(b * c, 1, 2 * (k - 1)), wk)[:, :, k - 1 - left:]
    sq = full - (lo * lo).sum((0, 2)) - (hi * hi).sum((0, 2))
    var = sq / n - mean * mean
    if ctx.record and bn.track_running_stats:
        ctx.stats.append((mean.detach(), (var * (n / (n - 1))).detach()))
    scale = bn.weight / torch.sqrt(var + bn.eps)  # (F1,)
    d = spatial.weight.shape[0] // f1
    ws = spatial.weight.reshape(f1 * d, c)  # (F1*D, C)
    z = torch.einsum("oc,bcp->bop", ws, xp.reshape(b, c, p_len))  # spatial maps of the padded input
    wrep = w.repeat_interleave(d, 0).reshape(f1 * d, 1, k)
    y = F.conv1d(z, wrep, groups=f1 * d)  # (B, F1*D, T): the temporal filters on the maps
    srep, mrep, brep = scale.repeat_interleave(d), mean.repeat_interleave(d), bn.bias.repeat_interleave(d)
    wsum = ws.sum(1)
    y = srep.reshape(1, -1, 1) * (y - (mrep * wsum).reshape(1, -1, 1)) + (brep * wsum).reshape(1, -1, 1)
    x = y.unsqueeze(2)  # (B, F1*D, 1, T), as conv_spatial's output
    x = self.pool_1(self.bnorm_1(x))
    x = self.pool_2(self.bnorm_2(self.conv_separable(x)))
    return x.flatten(1)


def _fusable(model: nn.Module) -> bool:
    """EEGNet with a plain first block (the fused order above applies)."""
    if type(model).__name__ != "EEGNet":
        return False
    conv, bn, sp = model.temporal[1], model.bnorm_temporal, model.conv_spatial
    return (conv.in_channels == 1 and conv.bias is None and conv.kernel_size[0] == 1 and conv.stride == (1, 1)
            and conv.dilation == (1, 1) and isinstance(model.temporal[0], nn.ZeroPad2d) and bn.affine
            and sp.bias is None and sp.groups == conv.out_channels and sp.kernel_size[1] == 1)


class BatchedModel:
    """A model's architecture as a function of stacked per-client parameters (one vmapped call for all clients).

    Parameters
    ----------
    model : nn.Module
        Any instance of the architecture (copied; the copy's Dropout layers use pre-drawn noise instead of the
        global generator, its BatchNorm layers record their batch statistics for the running estimates).
    sample_shape : tuple
        One trial's shape (channels, times).
    fused : bool
        EEGNet's first block in the cheaper order (:func:`_eegnet_features`).
    """

    def __init__(self, model: nn.Module, sample_shape: tuple[int, ...], fused: bool = True) -> None:
        self.shadow = copy.deepcopy(model).train()
        self.ctx = _Ctx()
        self.bns = {n: m for n, m in self.shadow.named_modules() if isinstance(m, _BatchNorm)}
        for m in self.shadow.modules():
            if isinstance(m, _BatchNorm):
                m._vctx = self.ctx
                m.forward = types.MethodType(_bn_forward, m)
            elif isinstance(m, nn.Dropout):
                m._vctx = self.ctx
                m.forward = types.MethodType(_dropout_forward, m)
        self.fused = fused and _fusable(self.shadow)
        if self.fused:
            self.shadow.features = types.MethodType(_eegnet_features, self.shadow)
            self.shadow._vctx = self.ctx
        if hasattr(self.shadow, "classifier"):
            self.shadow.classifier.register_forward_pre_hook(self._grab_z)
        # the dropout layers in call order and the per-trial shape of their inputs (the noise each pass draws)
        self.dropouts: list[tuple[float, tuple[int, ...]]] = []
        probe = copy.deepcopy(model).eval()
        handles = [m.register_forward_pre_hook(self._probe_hook) for m in probe.modules() if isinstance(m, nn.Dropout)]
        with torch.no_grad():
            probe(torch.zeros((2, *sample_shape)))
        for h in handles:
            h.remove()

    def _probe_hook(self, m: nn.Module, args: tuple) -> None:
        if m.p > 0:
            self.dropouts.append((float(m.p), tuple(args[0].shape[1:])))

    def _grab_z(self, m: nn.Module, args: tuple) -> None:
        self.ctx.z = args[0]

    def draw(self, gen: torch.Generator, n: int) -> list[Tensor]:
        """One forward pass's dropout noise for one client's batch of ``n`` trials, drawn as F.dropout draws it."""
        out = []
        for p, shape in self.dropouts:
            noise = torch.empty((n, *shape)).bernoulli_(1 - p, generator=gen)
            out.append(noise.div_(1 - p))
        return out

    def noise(self, gens: Sequence[torch.Generator], n: int, draw: Sequence[bool] | None = None) -> list[Tensor]:
        """One forward pass's noise for a group of clients, (clients, n, ...) per dropout layer; a client with
        ``draw`` False gets ones (no draw: the sequential path runs no such pass for it)."""
        per = [self.draw(g, n) if draw is None or draw[i] else [torch.ones((n, *sh)) for _, sh in self.dropouts]
               for i, g in enumerate(gens)]
        return [torch.stack([p[i] for p in per]) for i in range(len(self.dropouts))]

    def __call__(self, params: Mapping[str, Tensor], x: Tensor, noises: list[Tensor],
                 record: bool = False, features: bool = False) -> tuple[Tensor, Tensor | None, tuple]:
        """Logits (K, B, classes), features (K, B, D) if asked, and BN batch statistics (mean, unbiased var per
        tracking BN layer) if ``record``."""

        def one(p, xk, nk):
            self.ctx.noises, self.ctx.stats, self.ctx.record = list(nk), [], record
            out = functional_call(self.shadow, p, (xk,))
            z = self.ctx.z if features else out  # (vmap returns tensors only; dropped below)
            stats = tuple(t for pair in self.ctx.stats for t in pair)
            self.ctx.z = None
            return out, z, stats

        out, z, stats = vmap(one)(dict(params), x, noises)
        return out, (z if features else None), stats


def mean_ce(logits: Tensor, y: Tensor) -> Tensor:
    """Per-client mean cross-entropy: logits (K, B, classes), y (K, B) class indices or (K, B, classes)
    class-probability targets (distillation, :mod:`neurofed.trainer.fl.distill`) -> (K,)."""
    k, b = y.shape[:2]
    flat = y.reshape(k * b, -1) if y.dim() == 3 else y.reshape(-1)
    return F.cross_entropy(logits.reshape(k * b, -1), flat, reduction="none").reshape(k, b).mean(1)


def _view(v: Tensor, like: Tensor) -> Tensor:
    return v.reshape([-1] + [1] * (like.dim() - 1))


# ---------------------------------------------------------------------------------------------- one round
@dataclass
class ClientJob:
    """One selected client's round input (what :func:`neurofed.trainer.fl.client.client_update` takes)."""

    down: Mapping[str, Tensor]
    state: ClientState
    X: np.ndarray
    y: np.ndarray
    seed: int
    group: str = ""


def vectorised_updates(
    model: nn.Module, jobs: Sequence[ClientJob], strategy: Strategy, cfg: LocalConfig,
    server_extras: Mapping[str, Tensor] | None = None, batched: BatchedModel | None = None,
) -> list[tuple[ClientUpdate, ClientState]] | None:
    """Every client's round at once: the same updates and kept states as ``client_update`` per client.

    Returns None (nothing trained, nothing changed but ``model``'s weights) when a hook is not known to this
    engine; the caller then runs the sequential path (:func:`unsupported_hooks` says why).
    """
    extras = server_extras or {}
    starts, hook_lists, states = [], [], []
    for job in jobs:  # exactly the sequential preamble: the merged state, the hooks (they read the loaded model)
        start, hooks = begin_client_round(model, job.down, job.state, strategy, extras, cfg)
        if (why := unsupported_hooks([h for _, h in hooks])) is not None:
            for _, h in hooks:
                h.close()
            warn_once(why)
            return None
        starts.append(start)
        hook_lists.append(hooks)
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    bm = batched or BatchedModel(model, tuple(jobs[0].X.shape[1:]))
    finals, metrics = _train(bm, model, jobs, states, [[h for _, h in hl] for hl in hook_lists], cfg)
    out = []
    for job, start, hooks, state, met in zip(jobs, starts, hook_lists, finals, metrics):
        out.append(end_client_round(model, state, job.state, strategy, hooks, start, met, len(job.X), job.group))
    return out


class _Components:
    """The round's local components as stacked per-client tensors (every client has the same hook types)."""

    def __init__(self, hooks: list[list[LocalHook]], names: list[str], state_keys: list[str]) -> None:
        kinds = [type(h) for h in hooks[0]]
        if any([type(h) for h in hl] != kinds for hl in hooks):
            raise ValueError("clients of one round have different local hooks")

        def each(cls):
            return [next(h for h in hl if isinstance(h, cls)) for hl in hooks]

        first = hooks[0]
        self.fat = next((h.eps for h in first if isinstance(h, _FatHook)), None)
        self.perturb = [h for h in first if isinstance(h, _SamHook | _AwpHook)]  # in composition order
        self.prox_mu = self.anchors = None
        if any(isinstance(h, _ProxHook) for h in first):
            ph = each(_ProxHook)
            self.prox_mu = ph[0].mu
            self.anchors = {n: torch.stack([h.anchor[i] for h in ph]) for i, n in enumerate(names)}
        self.corrections = None
        if any(isinstance(h, _ScaffoldHook) for h in first):
            sh = each(_ScaffoldHook)
            self.corrections = {n: torch.stack([h.correction[i] for h in sh]) for i, n in enumerate(names)}
        self.moon = None
        if any(isinstance(h, _MoonHook) for h in first):
            mh = each(_MoonHook)
            self.moon = (mh[0].mu, mh[0].tau)
            self.has_prev = [h.prev is not None for h in mh]
            self.glob = {k: torch.stack([h.glob.state_dict()[k] for h in mh]) for k in state_keys}
            self.prev = {k: torch.stack([(h.prev or h.glob).state_dict()[k] for h in mh]) for k in state_keys}


def _train(bm: BatchedModel, model: nn.Module, jobs: Sequence[ClientJob], states: list[dict[str, Tensor]],
           hooks: list[list[LocalHook]], cfg: LocalConfig) -> tuple[list[dict[str, Tensor]], list[dict[str, float]]]:
    K, B = len(jobs), cfg.batch_size
    chunk = max(1, CHUNK)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    state_keys = list(states[0])
    stacked = {k: torch.stack([s[k] for s in states]) for k in state_keys}
    P = {n: stacked[n].clone() for n in names}
    fixed = {k: v for k, v in stacked.items() if k not in P}
    bufs: dict[str, Tensor] | None = None
    comp = _Components(hooks, names, state_keys)
    n_train_passes = 1 + (comp.fat is not None) + bool(comp.perturb)

    # each client's batches and dropout generator, drawn as the sequential path draws them
    steps: list[list[np.ndarray]] = []
    gens: list[torch.Generator] = []
    aug = cfg.augmentation()
    arngs: list[np.random.Generator] = []
    for job in jobs:
        rng = np.random.default_rng(job.seed)
        steps.append([b for _ in range(cfg.local_epochs) for b in batches(len(job.X), B, rng)])
        gens.append(torch.Generator().manual_seed(job.seed))
        arngs.append(aug.rng(job.seed))
    Xs = [torch.as_tensor(j.X) for j in jobs]
    ys = [torch.as_tensor(j.y) if j.y.ndim == 2 else torch.as_tensor(j.y).long() for j in jobs]  # 2-D: soft targets
    totals = [0.0] * K
    S = max((len(sk) for sk in steps), default=0)
    for s in range(S):
        # the clients with a batch this step, grouped by batch size (one vmapped call per size: no padding)
        by_size: dict[int, list[int]] = {}
        for k, sk in enumerate(steps):
            if s < len(sk):
                by_size.setdefault(len(sk[s]), []).append(k)
        grads: dict[str, Tensor] = {n: torch.zeros_like(P[n]) for n in names}
        stats_all: list[Tensor] | None = None
        act = torch.zeros(K, dtype=torch.bool)
        chunks = [(size, ks[i: i + chunk]) for size, ks in sorted(by_size.items()) for i in range(0, len(ks), chunk)]
        for size, ks in chunks:
            sel = torch.tensor(ks)
            whole = len(ks) == K
            mix = None
            if aug.on:  # each client's batch from its own augmentation stream, as the sequential path draws it
                parts = [aug(Xs[k][steps[k][s]], ys[k][steps[k][s]], arngs[k]) for k in ks]
                xb = torch.stack([p[0] for p in parts])
                yb = torch.stack([p[1] for p in parts])
                if aug.mixup > 0:
                    mix = (torch.stack([p[2] for p in parts]), torch.tensor([p[3] for p in parts]))
            else:
                xb = torch.stack([Xs[k][steps[k][s]] for k in ks])
                yb = torch.stack([ys[k][steps[k][s]] for k in ks])
            g, loss, stats = _group_step(bm, comp, names, P, fixed, sel, whole, xb, yb, [gens[k] for k in ks], mix)
            for n in names:
                grads[n][sel] = g[n]
            if stats:
                if stats_all is None:
                    stats_all = [torch.zeros((K, *t.shape[1:]), dtype=t.dtype) for t in stats]
                for full, t in zip(stats_all, stats):
                    full[sel] = t
            act[sel] = True
            for i, k in enumerate(ks):
                totals[k] += float(loss[i])
        # SGD, as torch.optim.SGD's single-tensor step, for the clients with a batch this step
        with torch.no_grad():
            newbufs = {}
            for nm in names:
                g = grads[nm]
                if cfg.weight_decay != 0:
                    g = g.add(P[nm], alpha=cfg.weight_decay)
                if cfg.momentum != 0:
                    if bufs is None:
                        buf = torch.clone(g).detach()
                    else:
                        buf = torch.where(_view(act, g), bufs[nm].mul(cfg.momentum).add_(g), bufs[nm])
                    newbufs[nm] = buf
                    g = buf
                P[nm] = torch.where(_view(act, g), P[nm].add(g, alpha=-cfg.lr), P[nm])
            if cfg.momentum != 0:
                bufs = newbufs
            i = 0
            for name, m in bm.bns.items():
                if not m.track_running_stats:
                    continue
                pre = f"{name}." if name else ""
                mean, var = stats_all[2 * i], stats_all[2 * i + 1]
                i += 1
                mom = m.momentum
                rm, rv = fixed[pre + "running_mean"], fixed[pre + "running_var"]
                fixed[pre + "running_mean"] = torch.where(_view(act, rm), mom * mean + (1 - mom) * rm, rm)
                fixed[pre + "running_var"] = torch.where(_view(act, rv), mom * var + (1 - mom) * rv, rv)
                nbt = fixed[pre + "num_batches_tracked"]
                fixed[pre + "num_batches_tracked"] = nbt + n_train_passes * act.to(nbt.dtype)
    for hl in hooks:
        for h in hl:
            h.close()
    if gens:  # the global generator ends where the sequential path leaves it: after the last client's draws
        torch.set_rng_state(gens[-1].get_state())
    out_states, metrics = [], []
    for k in range(K):
        st = {}
        for key in state_keys:
            src = P[key] if key in P else fixed[key]
            st[key] = src[k].detach().clone().to(states[k][key].dtype)
        out_states.append(st)
        metrics.append({"loss": totals[k] / max(len(steps[k]), 1), "steps": float(len(steps[k]))})
    return out_states, metrics


def _group_step(bm: BatchedModel, comp: _Components, names: list[str], P: dict[str, Tensor],
                fixed: dict[str, Tensor], sel: Tensor, whole: bool, xb: Tensor, yb: Tensor,
                gens: list[torch.Generator], mix: tuple[Tensor, Tensor] | None = None,
                ) -> tuple[dict[str, Tensor], list[float], tuple]:
    """One step of the clients ``sel`` (all with batches of one size): the gradient SGD uses, the loss, BN stats.
    ``mix``: the mixup partners' labels (K, B) and each client's lambda (K,) (:mod:`neurofed.trainer.fl.augment`)."""

    def pick(t: Tensor) -> Tensor:
        return t if whole else t[sel]

    W = {n: pick(P[n]).detach() for n in names}
    fx = {k: pick(v) for k, v in fixed.items()}
    n = xb.shape[1]
    has_prev = [comp.has_prev[int(k)] for k in sel] if comp.moon else None

    def loss_at(params: Mapping[str, Tensor], x: Tensor, record: bool) -> tuple[Tensor, tuple]:
        noise = bm.noise(gens, n)
        logits, z, stats = bm({**params, **fx}, x, noise, record, comp.moon is not None)
        loss = mean_ce(logits, yb)
        if mix is not None:
            lam = mix[1].to(loss.dtype)
            loss = lam * loss + (1 - lam) * mean_ce(logits, mix[0])
        if comp.prox_mu is not None:
            term = sum(((params[nm] - pick(comp.anchors[nm])) ** 2).flatten(1).sum(1) for nm in names)
            loss = loss + 0.5 * comp.prox_mu * term
        if comp.moon is not None:
            mu, tau = comp.moon
            with torch.no_grad():
                _, zg, _ = bm({k: pick(v) for k, v in comp.glob.items()}, x, bm.noise(gens, n, has_prev), False, True)
                _, zp, _ = bm({k: pick(v) for k, v in comp.prev.items()}, x, bm.noise(gens, n, has_prev), False, True)
            sims = torch.stack([F.cosine_similarity(z, zg, dim=2), F.cosine_similarity(z, zp, dim=2)], 2)
            ce = mean_ce(sims / tau, torch.zeros_like(yb))
            loss = loss + torch.where(torch.tensor(has_prev), mu * ce, torch.zeros_like(ce))
        return loss, stats

    if comp.fat is not None:  # FGSM on the current weights (BN statistics untouched)
        xr = xb.detach().requires_grad_(True)
        logits, _, _ = bm({**W, **fx}, xr, bm.noise(gens, n))
        (g,) = torch.autograd.grad(mean_ce(logits, yb).sum(), xr)
        xb = (xb + comp.fat * xb.std(dim=-1, keepdim=True) * g.sign()).detach()
    Pg = {k: v.requires_grad_(True) for k, v in W.items()}
    loss, stats = loss_at(Pg, xb, True)
    grads = dict(zip(names, torch.autograd.grad(loss.sum(), [Pg[nm] for nm in names])))
    if comp.perturb:
        delta: dict[str, Tensor] = {}
        for h in comp.perturb:
            if isinstance(h, _SamHook):
                norms = torch.stack([grads[nm].flatten(1).norm(2, dim=1) for nm in names], 1).norm(2, dim=1)
                scale = h.rho / (norms + 1e-12)
                part = {nm: grads[nm] * _view(scale, grads[nm]) for nm in names}
            else:  # AWP: layer-wise, weight tensors only (dim > 1 per client)
                part = {}
                for nm in names:
                    g = grads[nm]
                    if g.dim() <= 2:
                        continue
                    wn = W[nm].detach().flatten(1).norm(dim=1)
                    gn = g.flatten(1).norm(dim=1)
                    part[nm] = _view(h.gamma * wn, g) * g / _view(gn + 1e-12, g)
            for nm, d in part.items():
                delta[nm] = d if nm not in delta else delta[nm] + d
        Pp = {nm: (W[nm].detach() + delta[nm] if nm in delta else W[nm].detach()).requires_grad_(True) for nm in names}
        loss2, _ = loss_at(Pp, xb, False)
        grads = dict(zip(names, torch.autograd.grad(loss2.sum(), [Pp[nm] for nm in names])))
    if comp.corrections is not None:
        grads = {nm: grads[nm] + pick(comp.corrections[nm]) for nm in names}
    return grads, [float(v) for v in loss.detach()], stats


__all__ = ["ENGINES", "BatchedModel", "ClientJob", "unsupported", "unsupported_hooks",
           "vectorised_updates", "warn_once"]
