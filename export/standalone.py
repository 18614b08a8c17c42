"""Standalone decoder: ONE ONNX graph, ``probs, next_state, guard = graph(window, state)``.

An app feeds a raw window at its device's own rate and unit (channels in the model's order) and
an explicit state; everything NeuroFed does between the amplifier and the class probabilities
happens inside the graph:

* **unit** -> microvolts (one constant factor, folded into ``P`` below);
* **input guard** (non-finite, flat, saturated channels; ``neurofed.edge.guard``'s rules, with the kinds
  and thresholds of ``neurofed.trainer.data.guard``, the one definition both use) -> the ``guard`` output,
  and a rejected window leaves the state untouched; evaluated on the raw float32 window with
  thresholds converted exactly to the device's unit (:meth:`StandaloneDecoder._guard`);
* **band-pass + resampling** as one exact matrix ``P`` (``y = x @ P``): ``sosfiltfilt`` on a
  fixed-length window (odd extension and steady-state initial conditions included) followed by
  ``resample_poly`` is a linear map of the window, so ``P`` is the pipeline applied to the
  identity (columns = responses to unit impulses). A convolution would not be exact: the
  filtfilt edge handling and the IIR tail make the map shift-variant near the window's ends;
* **online Euclidean alignment** from the state's running covariance sum, its inverse square
  root by a scaled coupled Newton-Schulz iteration (MatMul/Add/Mul only, float64, :func:`ns_schedule`);
* **batch-specific BN** with the context of the last ``B - 1`` accepted windows carried in the
  state, written as masked ReduceMean/Sub/Mul/Sqrt/Div (no BatchNormalization node: tract
  refuses computed statistics feeding one);
* EEGNet / FLEEG EEGNet with **standard BN**: EA and both BNs folded into the spatial weights, the
  temporal filter on the 16 mixed rows (:class:`EEGNetStandardFused`);
* a **model hash** in the state: a state from another model yields NaN probabilities and is not
  advanced (the hosts refuse it earlier with a clear error).
"""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from neurofed.export.decoder import (  # the run-time decoder (onnxruntime + numpy) reads what this builds
    HASH_WORDS,
    INPUTS,
    OUTPUTS,
    StandaloneInfo,
)
from neurofed.export.metadata import build_meta, embed_meta
from neurofed.export.onnx_export import profile_output, quiet_exporter
from neurofed.trainer.atomic import atomic_write_bytes
from neurofed.trainer.checkpoint import device_of, load_checkpoint, load_profile_models
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS, TASKS, subject_files
from neurofed.trainer.data.guard import GUARD_KINDS, GuardConfig
from neurofed.trainer.data.io import epochs_from_raw, read_raw
from neurofed.trainer.data.preprocess import n_times_for, pick_channels, preprocess_epochs
from neurofed.trainer.errors import DataError, NeuroFedError
from neurofed.trainer.models.classical import graph_form
from neurofed.trainer.models.eegnet import CroppedEEGNet, EEGNet
from neurofed.trainer.models.fleeg import FleegEEGNet
from neurofed.trainer.models.matfun import (  # noqa: F401  (the graph's matrix functions; public here too)
    NS_ALPHAS,
    NS_FLOOR,
    NS_ITERS,
    logm_iss,
    newton_schulz_inv_sqrt,
    ns_schedule,
)

logger = logging.getLogger("neurofed.export")

OPSET = 18
#: Device units the graph accepts, as factors to microvolts.
UNITS: dict[str, float] = {"V": 1e6, "mV": 1e3, "uV": 1.0, "nV": 1e-3}


def hash_words(model_hash: str) -> list[int]:
    """The first 96 bits of the hex model hash as four 24-bit integers."""
    return [int(model_hash[6 * i : 6 * i + 6], 16) for i in range(HASH_WORDS)]


def raw_threshold(limit_uv: float, scale: float) -> float:
    """The smallest float32 ``t >= 0`` with ``float64(t) * scale >= limit_uv`` (float64 product): for a float32
    sample ``w``, ``|w| >= t`` exactly when ``|float64(w) * scale| >= limit_uv``."""
    t = np.float32(limit_uv / scale)
    while t > 0 and float(np.nextafter(t, np.float32(0))) * scale >= limit_uv:
        t = np.nextafter(t, np.float32(0))
    while float(t) * scale < limit_uv:
        t = np.nextafter(t, np.float32(np.inf))
    return float(t)


def preprocess_matrix(cfg: PreprocessConfig, rate: float) -> np.ndarray:
    """``P`` (window_samples, n_times) with ``preprocess(x) == x @ P`` for any window ``x``.

    Built by running training's own preprocessing (``neurofed.trainer.data.preprocess.preprocess_epochs``:
    ``sosfiltfilt`` then ``resample_poly``) on the identity: row ``i`` is the response to a unit
    impulse at sample ``i``. Exact because both steps are linear in the window.
    """
    n_in = n_times_for(rate, cfg)
    eye = np.eye(n_in)[:, None, :]
    y, _, _ = preprocess_epochs(eye, rate, ["x"], replace(cfg, channels=None))
    return np.ascontiguousarray(y[:, 0, :])


class PlainBatchNorm(nn.Module):
    """BatchNorm2d written with plain ops; batch-specific statistics over the rows where ``mask`` is 1."""

    def __init__(self, bn: _BatchNorm) -> None:
        super().__init__()
        self.eps = float(bn.eps)
        self.standard = bool(bn.track_running_stats)
        self.weight = nn.Parameter(bn.weight.detach().clone(), requires_grad=False)
        self.bias = nn.Parameter(bn.bias.detach().clone(), requires_grad=False)
        if self.standard:
            self.register_buffer("mean", bn.running_mean.detach().clone())
            self.register_buffer("var", bn.running_var.detach().clone())
        self.mask: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.view(1, -1, 1, 1)
        b = self.bias.view(1, -1, 1, 1)
        if self.standard:
            mean, var = self.mean.view(1, -1, 1, 1), self.var.view(1, -1, 1, 1)
            return (x - mean) / torch.sqrt(var + self.eps) * w + b
        # masked E[x] and E[x^2] by ReduceMean over (batch, H, W), then one multiply-add: close to
        # onnxruntime's own BatchNormalization path (a per-row ReduceSum over (H, W) was much slower)
        m = self.mask.view(-1, 1, 1, 1)
        frac = m.mean()
        xm = x * m
        mean = xm.mean(dim=(0, 2, 3), keepdim=True) / frac
        var = (xm * x).mean(dim=(0, 2, 3), keepdim=True) / frac - mean * mean
        scale = w / torch.sqrt(var + self.eps)
        return x * scale + (b - mean * scale)


def _plain_bn(model: nn.Module) -> tuple[nn.Module, list[PlainBatchNorm]]:
    net = copy.deepcopy(model).eval()
    swapped: list[PlainBatchNorm] = []
    for name, mod in list(net.named_modules()):
        if isinstance(mod, _BatchNorm):
            parent = net.get_submodule(name.rpartition(".")[0]) if "." in name else net
            plain = PlainBatchNorm(mod)
            setattr(parent, name.rpartition(".")[2], plain)
            swapped.append(plain)
    return net, swapped


class MaxExpELU(nn.Module):
    """``ELU(x) = max(x, exp(min(x, 0)) - 1)`` (alpha 1; exact since ``e^x >= 1 + x``).

    onnxruntime's Elu kernel is scalar; Min/Exp/Sub/Max are vectorised (several times faster here).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.maximum(x, torch.exp(torch.clamp(x, max=0.0)) - 1.0)


def _fast_elu(seq: nn.Sequential) -> nn.Sequential:
    """``seq`` with every alpha-1 ELU replaced by :class:`MaxExpELU`."""
    return nn.Sequential(*(MaxExpELU() if isinstance(m, nn.ELU) and m.alpha == 1.0 else m for m in seq))


class EEGNetContext(nn.Module):
    """EEGNet over (context + new window) with the context's temporal-convolution work cached.

    Batch-specific BN makes every layer depend on the whole batch (the new window and the last
    ``k`` accepted windows), and online EA changes the alignment ``A`` with every window, so no
    layer's *output* for a context window can be kept. What can be kept is exact:

    * The temporal convolution ``t_f`` (filter ``f``, along time, per channel) commutes with the
      channel mix: ``t_f(A x) = A t_f(x)``. For every window the state keeps its per-filter row
      sums ``r_f = t_f(x) 1`` (F1 x C) and Gram matrices ``G_f = t_f(x) t_f(x)^T`` (F1 x C x C),
      computed once when the window arrives. The first BN's batch statistics over the aligned
      batch then follow for any ``A``: ``sum A t_f(x) = 1^T A r_f`` and
      ``sum (A t_f(x))^2 = tr(A G_f A^T)``.
    * With the first BN's scale ``s_f`` and shift ``b_f``, the depthwise spatial convolution
      (weights ``w_o``, output ``o`` reading filter ``f(o)``) of the BN output is
      ``s_f t_f(w_o^T A x) + b_f sum(w_o)``: ``A`` and ``s_f`` fold into the spatial weights and
      the temporal filter runs on the F1*D spatially mixed rows instead of the C channel rows
      (F1*D = 16 rows instead of F1*C = 168 per window for 21 channels).

    What is still recomputed for every window of the batch: the mixed rows ``(s_f w_o^T A) x``,
    their temporal filtering, and everything after the spatial convolution (the second and third
    BN's statistics depend on the ELU of the current batch). The new window's full temporal
    convolution is done once, for its ``r_f`` and ``G_f``.
    """

    def __init__(self, net: nn.Module, n_ch: int, n_t: int) -> None:
        super().__init__()
        pad, conv = net.temporal[0], net.temporal[1]
        self.left, self.right = int(pad.padding[0]), int(pad.padding[1])
        wt = conv.weight.detach()[:, 0, 0, :]  # (F1, K)
        ws = net.conv_spatial.weight.detach()[:, 0, :, 0]  # (F1 * D, C)
        self.f1, self.fd = wt.shape[0], ws.shape[0]
        self.d = self.fd // self.f1
        self.n_ch, self.n_t = n_ch, n_t
        self.register_buffer("wt", wt[:, None, :].contiguous())  # (F1, 1, K)
        self.register_buffer("wt_rep", wt.repeat_interleave(self.d, 0)[:, None, :].contiguous())  # (F1*D, 1, K)
        self.register_buffer("ws", ws.to(torch.float64))
        self.register_buffer("ws_sum", ws.to(torch.float64).sum(1))
        bn = net.bnorm_temporal
        self.eps = bn.eps
        self.register_buffer("bn_w", bn.weight.detach().to(torch.float64))
        self.register_buffer("bn_b", bn.bias.detach().to(torch.float64))
        self.tail = nn.Sequential(
            net.bnorm_1, _fast_elu(net.pool_1), net.conv_separable, net.bnorm_2, _fast_elu(net.pool_2)
        )
        self.classifier = net.classifier
        self.head = type(net).head  # EEGNet's linear classifier, or CroppedEEGNet's crops (a static function)

    def temporal_moments(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-filter row sums (F1, C) and Gram matrices (F1, C, C) of ``t_f(y)``, float64."""
        yp = F.pad(y.to(torch.float32).view(1, 1, self.n_ch, self.n_t), (self.left, self.right))
        # the Grams in float64: whitening by A amplifies their rounding (float32 Grams miss the
        # first BN's variance by more than the 1e-6 relative that tests/export checks)
        g = F.conv2d(yp, self.wt.unsqueeze(2))[0].to(torch.float64)  # (F1, C, T)
        return g.sum(-1), g @ g.transpose(1, 2)

    def temporal_bn_stats(
        self, sums: torch.Tensor, grams: torch.Tensor, mask: torch.Tensor, a: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch mean and (biased) variance per filter of ``t_f(A x)`` over the rows where ``mask`` is 1,
        from the rows' cached moments (``sums`` (N, F1, C), ``grams`` (N, F1, C, C)), float64."""
        m = mask.to(torch.float64)
        denom = m.sum() * (self.n_ch * self.n_t)
        r = (sums * m.view(-1, 1, 1)).sum(0)  # (F1, C)
        gsum = (grams * m.view(-1, 1, 1, 1)).sum(0)  # (F1, C, C)
        if a is None:
            mean = r.sum(-1) / denom
            sq = (gsum * torch.eye(self.n_ch, dtype=torch.float64)).sum((-2, -1)) / denom
        else:
            mean = (r @ a.sum(0)) / denom  # 1^T A r_f
            sq = (torch.matmul(a, gsum) * a).sum((-2, -1)) / denom  # tr(A G_f A^T)
        return mean, sq - mean * mean

    def forward(
        self, batch: torch.Tensor, sums: torch.Tensor, grams: torch.Tensor, mask: torch.Tensor,
        a: torch.Tensor | None,
    ) -> torch.Tensor:
        """Logits of every row of ``batch`` (N, C, T) (unaligned, float64) given each row's moments.

        ``sums`` (N, F1, C) and ``grams`` (N, F1, C, C) are :meth:`temporal_moments` of the rows;
        ``mask`` (N,) marks the rows that count in the BN statistics; ``a`` is the EA matrix (or None).
        """
        mean, var = self.temporal_bn_stats(sums, grams, mask, a)
        mix = self.ws if a is None else self.ws @ a
        scale = self.bn_w / torch.sqrt(var + self.eps)  # (F1,)
        shift = self.bn_b - mean * scale
        scale_o = scale.view(-1, 1).expand(self.f1, self.d).reshape(-1)  # filter f(o) of each output o
        shift_o = shift.view(-1, 1).expand(self.f1, self.d).reshape(-1)
        u = (mix * scale_o.view(-1, 1)).to(torch.float32)  # (F1*D, C): s_f w_o^T A
        v = torch.matmul(u, batch.to(torch.float32))  # (N, F1*D, T)
        # a 2-D depthwise Conv (N, F1*D, 1, T): onnxruntime runs it with its blocked (NCHWc) kernel
        z = F.conv2d(F.pad(v.unsqueeze(2), (self.left, self.right)), self.wt_rep.unsqueeze(2), groups=self.fd)
        z = z + (shift_o * self.ws_sum).to(torch.float32).view(1, -1, 1, 1)
        return self.head(self.classifier, self.tail(z))


def _eegnet_parts(net: nn.Module) -> tuple[nn.Module, ...] | None:
    """``(temporal, bn_t, conv_spatial, bn_s, body, classifier)`` of an EEGNet or FLEEG EEGNet (after
    :func:`_plain_bn`), ``body`` the layers from the first ELU to the flattened features; None for other models."""

    if type(net) is EEGNet:
        body = nn.Sequential(_fast_elu(net.pool_1), net.conv_separable, net.bnorm_2, _fast_elu(net.pool_2),
                             nn.Flatten(1))
        return net.temporal, net.bnorm_temporal, net.conv_spatial, net.bnorm_1, body, net.classifier
    if type(net) is FleegEEGNet:
        temporal, bn_t, spatial, bn_s = net.local
        pool_1, sep, bn_2, pool_2, flat = net.body
        body = nn.Sequential(_fast_elu(pool_1), sep, bn_2, _fast_elu(pool_2), flat)
        return temporal, bn_t, spatial, bn_s, body, net.classifier
    return None


class EEGNetStandardFused(nn.Module):
    """EEGNet (or FLEEG EEGNet) with standard BN on one window, the alignment and both BNs folded into the
    spatial weights: exact up to float rounding.

    With fixed BN statistics the first block is linear up to the first ELU: temporal convolution ``t_f``
    (per channel, along time), the first BN (scale ``s_f``, shift ``b_f``), the depthwise spatial
    convolution (weights ``w_o`` of filter ``f(o)``) and the second BN (``s'_o``, ``b'_o``). As ``t_f``
    commutes with the channel mix, output ``o`` is
    ``s'_o s_f t_f((w_o^T A) x) + s'_o b_f sum(w_o) + b'_o``: the temporal filter runs on the F1*D = 16 mixed
    rows ``u_o = s'_o s_f w_o^T A x`` instead of F1 x C rows (512 at 64 channels), and ``A x`` is never formed.
    """

    def __init__(self, parts: tuple[nn.Module, ...], n_ch: int, n_t: int) -> None:
        super().__init__()
        temporal, bn_t, spatial, bn_s, self.body, self.classifier = parts
        pad, conv = temporal[0], temporal[1]
        self.left, self.right = int(pad.padding[0]), int(pad.padding[1])
        wt = conv.weight.detach()[:, 0, 0, :]  # (F1, K)
        ws = spatial.weight.detach()[:, 0, :, 0].to(torch.float64)  # (F1 * D, C)
        f1, fd = wt.shape[0], ws.shape[0]
        d = fd // f1
        self.fd, self.n_ch, self.n_t = fd, n_ch, n_t

        def affine(bn: PlainBatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
            sc = bn.weight.detach().double() / torch.sqrt(bn.var.double() + bn.eps)
            return sc, bn.bias.detach().double() - bn.mean.double() * sc

        s_t, b_t = affine(bn_t)
        s_s, b_s = affine(bn_s)
        s_t, b_t = s_t.repeat_interleave(d), b_t.repeat_interleave(d)  # filter f(o) of each output o
        self.register_buffer("mix", ws * (s_s * s_t).view(-1, 1))  # (F1*D, C) float64
        self.register_buffer("shift", (s_s * b_t * ws.sum(1) + b_s).to(torch.float32).view(1, -1, 1, 1))
        self.register_buffer("wt_rep", wt.repeat_interleave(d, 0)[:, None, None, :].contiguous())  # (F1*D,1,1,K)

    def forward(self, y: torch.Tensor, a: torch.Tensor | None) -> torch.Tensor:
        """Logits (1, classes) of one preprocessed unaligned window ``y`` (C, T) (float32) with EA matrix ``a``."""
        mix = self.mix if a is None else self.mix @ a
        v = torch.matmul(mix.to(torch.float32), y)  # (F1*D, T)
        z = F.conv2d(F.pad(v.view(1, self.fd, 1, self.n_t), (self.left, self.right)), self.wt_rep, groups=self.fd)
        return self.classifier(self.body(z + self.shift))


class StandaloneDecoder(nn.Module):
    """``(window, state) -> (probs, next_state, guard)``; see the module docstring.

    Parameters
    ----------
    model : nn.Module
        The trained network (eval mode).
    ckpt_meta : neurofed.trainer.checkpoint.ModelMeta
    model_hash : str
        Hex SHA-256 of the weights (``neurofed.export.metadata.model_hash``).
    rate : float
        The device's sampling rate in Hz.
    unit : str
        The device's unit (a key of :data:`UNITS`, or any label when ``unit_to_uv`` is given).
    guard : neurofed.trainer.data.guard.GuardConfig, optional
        The input guard's thresholds (default: ``GuardConfig()``, the same definition as ``neurofed.edge.guard``'s).
    context_cache : bool
        For EEGNet with batch-specific BN, keep each context window's temporal-convolution moments
        in the state (:class:`EEGNetContext`); False runs the whole batch through the network
        (the reference the cache is tested against).
    unit_to_uv : float, optional
        Factor from the device's values to microvolts (default ``UNITS[unit]``); a device profile's
        ``1 / scale`` (e.g. ADS1299 counts at its gain, :func:`profile_device`).
    fuse : bool
        For EEGNet / FLEEG EEGNet with standard BN, fold EA and both BNs into the spatial weights
        (:class:`EEGNetStandardFused`); False runs the network as is (the reference the fusion is tested against).
    """

    def __init__(
        self,
        model: nn.Module,
        ckpt_meta: Any,
        model_hash: str,
        rate: float,
        unit: str = "uV",
        guard: GuardConfig | None = None,
        context_cache: bool = True,
        unit_to_uv: float | None = None,
        fuse: bool = True,
    ) -> None:
        super().__init__()
        if unit_to_uv is None and unit not in UNITS:
            raise NeuroFedError(f"unit {unit!r}: use one of {sorted(UNITS)}")
        if unit_to_uv is not None and not (np.isfinite(unit_to_uv) and unit_to_uv > 0):
            raise NeuroFedError(f"unit_to_uv must be a positive number, got {unit_to_uv}")
        cfg = PreprocessConfig.from_dict({**ckpt_meta.preprocess, "channels": list(ckpt_meta.ch_names)})
        try:
            p = preprocess_matrix(cfg, rate)
        except DataError as exc:
            raise NeuroFedError(f"device rate {rate} Hz cannot feed this model: {exc}") from None
        if p.shape[1] != ckpt_meta.n_times:
            raise NeuroFedError(
                f"a {p.shape[0]}-sample window at {rate} Hz preprocesses to {p.shape[1]} samples, "
                f"but the model expects {ckpt_meta.n_times}"
            )
        self.net, self._bns = _plain_bn(graph_form(model))
        self.batch_specific = any(not b.standard for b in self._bns)
        self.ea = bool(cfg.ea)
        self.n_ch, self.n_in, self.n_t = ckpt_meta.n_channels, p.shape[0], ckpt_meta.n_times
        self.n_classes = int(ckpt_meta.n_classes)
        self.k = max(int(ckpt_meta.test_batch_size) - 1, 0) if self.batch_specific else 0
        self.scale = float(UNITS[unit] if unit_to_uv is None else unit_to_uv)
        self.g = guard if guard is not None else GuardConfig()
        # the unit factor folded into P: the graph applies it to the raw float32 window in one GEMM
        self.register_buffer("p", torch.from_numpy(p * self.scale).to(torch.float32))
        self.sat_raw = raw_threshold(self.g.saturation_uv, self.scale)
        self.register_buffer("hash", torch.tensor(hash_words(model_hash), dtype=torch.float64))
        # EEGNet with batch-specific BN: the context's temporal-convolution work lives in the state
        # (exactly EEGNet or its cropped head: another subclass could change the forward pass the cache rewrites)
        self.cache = (
            EEGNetContext(self.net, self.n_ch, self.n_t)
            if context_cache and self.k and type(model) in (EEGNet, CroppedEEGNet)
            and not self.net.bnorm_temporal.standard
            else None
        )
        parts = _eegnet_parts(self.net) if fuse and not self.batch_specific else None
        self.fused = EEGNetStandardFused(parts, self.n_ch, self.n_t) if parts is not None else None
        self.layout = self._layout()
        self.state_size = sum(int(np.prod(e["shape"])) for e in self.layout)

    def _layout(self) -> list[dict[str, Any]]:
        parts: list[tuple[str, list[int], str]] = [
            ("model_hash", [HASH_WORDS], "first 96 bits of the model hash as 24-bit integers"),
            ("ea_count", [1], "accepted windows seen (EA running mean denominator)"),
            ("n_context", [1], "valid BN context windows (the last n_context of the context slots)"),
        ]
        if self.ea:
            parts.append(("ea_cov_sum", [self.n_ch, self.n_ch], "sum of X X^T / T of accepted preprocessed windows"))
        if self.k:
            parts.append(
                ("context", [self.k, self.n_ch, self.n_t], "last accepted preprocessed (unaligned) windows, oldest first")
            )
        if self.cache is not None:
            f1, c = self.cache.f1, self.n_ch
            parts += [
                ("context_temporal_sums", [self.k, f1, c],
                 "per context window: time sums of each temporal filter's output, per channel"),
                ("context_temporal_grams", [self.k, f1, c, c],
                 "per context window: Gram matrix over time of each temporal filter's output"),
            ]
        out, off = [], 0
        for name, shape, what in parts:
            out.append({"name": name, "offset": off, "shape": shape, "meaning": what})
            off += int(np.prod(shape))
        return out

    def initial_state(self) -> np.ndarray:
        """Zeros with the model hash in the first :data:`HASH_WORDS` entries."""
        s = np.zeros(self.state_size, np.float64)
        s[:HASH_WORDS] = self.hash.numpy()
        return s

    def _guard(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-channel flags (non-finite, flat, saturated), the zeroed raw window and an accept flag.

        ``w`` is the raw float32 window in device units. The rules are ``neurofed.trainer.data.guard``'s on the
        window in microvolts ``x = float64(w) * scale``; all but the flat test run on ``w`` itself, in
        float32, with the same verdicts: ``float64(w) * scale`` is finite exactly where ``w`` is, and
        is strictly increasing in ``w`` (a float32 times a positive float64 constant, rounded to float64:
        distinct float32 values stay distinct), so the channel extremes and the samples equal to them are
        the same; ``|x| >= saturation_uv`` is ``|w| >= sat_raw`` (:func:`raw_threshold`, exact). The flat
        test (standard deviation) is computed in float64, on ``w`` and then scaled.
        """
        g = self.g
        nf = w - w  # 0 where finite, NaN for NaN and +-inf
        elem_ok = nf == 0
        finite = nf.sum(dim=1) == 0  # NaN sums to NaN
        xf = torch.where(elem_ok, w, torch.zeros_like(w))
        hi = xf.amax(dim=1, keepdim=True)
        lo = xf.amin(dim=1, keepdim=True)
        xd = xf.to(torch.float64)
        dev = xd - xd.mean(dim=1, keepdim=True)
        std = torch.sqrt((dev * dev).mean(dim=1)) * self.scale
        flat = (std < g.flat_std_uv) & finite
        over = torch.maximum(hi, -lo)[:, 0] >= self.sat_raw
        # counted in float32: onnxruntime's int64 ReduceSum is several times slower
        at_max = (xf == hi).to(torch.float32).sum(dim=1)
        at_min = (xf == lo).to(torch.float32).sum(dim=1)
        clipped = (torch.maximum(at_max, at_min) > g.clip_fraction * self.n_in) & ~flat & finite
        sat = (over | clipped) & finite
        flags = torch.stack([~finite, flat, sat])
        return flags.to(torch.float32), xf, ~flags.any()

    def forward(self, window: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flags, xf, ok = self._guard(window.to(torch.float32))
        hash_ok = (state[:HASH_WORDS] == self.hash).all()
        # unit + band-pass + resampling: one float32 GEMM (MLAS), then float64 for EA like the Python path
        y32 = xf @ self.p
        y = y32.to(torch.float64)
        count = state[HASH_WORDS : HASH_WORDS + 1] + 1.0
        n_ctx = state[HASH_WORDS + 1 : HASH_WORDS + 2]
        off = HASH_WORDS + 2
        parts = [self.hash, count]
        if self.k:
            parts.append(torch.minimum(n_ctx + 1.0, torch.full_like(n_ctx, float(self.k))))
        else:
            parts.append(n_ctx)
        if self.ea:
            c2 = self.n_ch * self.n_ch
            cov = state[off : off + c2].view(self.n_ch, self.n_ch) + (y @ y.T) / self.n_t
            off += c2
            parts.append(cov.reshape(-1))
        if self.k:
            n = self.k * self.n_ch * self.n_t
            ctx = state[off : off + n].view(self.k, self.n_ch, self.n_t)
            off += n
            batch = torch.cat([ctx, y.unsqueeze(0)])
            parts.append(batch[1:].reshape(-1))
            slot = torch.arange(self.k + 1, dtype=torch.float64)
            mask = (slot >= self.k - n_ctx).to(torch.float32)
        else:
            batch = y.unsqueeze(0)
            mask = torch.ones(1)
        a = newton_schulz_inv_sqrt(cov / count) if self.ea else None
        for bn in self._bns:
            bn.mask = mask
        if self.cache is not None:
            f1, c = self.cache.f1, self.n_ch
            n_s = self.k * f1 * c
            sums = state[off : off + n_s].view(self.k, f1, c)
            grams = state[off + n_s :].view(self.k, f1, c, c)
            r_new, g_new = self.cache.temporal_moments(y)
            sums = torch.cat([sums, r_new.unsqueeze(0)])
            grams = torch.cat([grams, g_new.unsqueeze(0)])
            parts += [sums[1:].reshape(-1), grams[1:].reshape(-1)]
            logits = self.cache(batch, sums, grams, mask, a)[-1]
        elif self.fused is not None:
            logits = self.fused(y32, a)[-1]
        else:
            if a is not None:
                batch = torch.matmul(a, batch)
            logits = self.net(batch.to(torch.float32))[-1]
        probs = torch.softmax(logits, dim=0)
        accept = ok & hash_ok
        nan = torch.full_like(probs, float("nan"))
        next_state = torch.where(accept, torch.cat(parts), state)
        return torch.where(accept, probs, nan), next_state, flags


def to_standalone_onnx(dec: StandaloneDecoder) -> onnx.ModelProto:
    """Export with the dynamo exporter at opset 18 (static shapes: one window, one state)."""
    window = torch.randn(dec.n_ch, dec.n_in, generator=torch.Generator().manual_seed(0)) * 20.0
    state = torch.from_numpy(dec.initial_state())

    with quiet_exporter():
        try:
            prog = torch.onnx.export(
                dec.eval(),
                (window.float(), state),
                dynamo=True,
                opset_version=OPSET,
                input_names=list(INPUTS),
                output_names=list(OUTPUTS),
                verbose=False,
            )
        except Exception as exc:
            raise NeuroFedError(f"standalone ONNX export failed: {exc}") from None
    proto = prog.model_proto
    bad = sorted({n.op_type for n in proto.graph.node} & {"BatchNormalization", "If", "Loop"})
    if bad:
        raise NeuroFedError(f"standalone graph contains {bad}; it must be plain ops only")
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as exc:
        raise NeuroFedError(f"onnx.checker rejected the standalone graph: {exc}") from None
    return proto


def standalone_info(dec: StandaloneDecoder, rate: float, unit: str, step_s: float) -> StandaloneInfo:
    """The ``standalone`` section of the metadata."""
    return StandaloneInfo(
        inputs={
            "window": {"shape": [dec.n_ch, dec.n_in], "dtype": "float32",
                       "meaning": f"raw samples in {unit} at {rate} Hz, channels in ch_names order"},
            "state": {"shape": [dec.state_size], "dtype": "float64", "meaning": "the previous next_state"},
        },
        outputs={
            "probs": {"shape": [dec.n_classes],
                      "dtype": "float32", "meaning": "class probabilities (NaN if rejected)"},
            "next_state": {"shape": [dec.state_size], "dtype": "float64",
                           "meaning": "state for the next window (unchanged if rejected)"},
            "guard": {"shape": [len(GUARD_KINDS), dec.n_ch], "dtype": "float32",
                      "meaning": "1 where a channel is non-finite / flat / saturated; any 1 rejects the window"},
        },
        rate=rate,
        unit=unit,
        unit_to_uv=dec.scale,
        window_samples=dec.n_in,
        step_s=step_s,
        context_windows=dec.k,
        state_size=dec.state_size,
        state_layout=dec.layout,
        state_init={"zeros": dec.state_size, "set": {"model_hash": hash_words_of(dec)}},
        hash_words=hash_words_of(dec),
        guard={"flat_std_uv": dec.g.flat_std_uv, "saturation_uv": dec.g.saturation_uv,
               "clip_fraction": dec.g.clip_fraction},
        guard_kinds=list(GUARD_KINDS),
        ea_calibration=(
            "EA uses the running mean covariance of all accepted windows from the first one on; "
            f"BN statistics use up to {dec.k} previous windows: the first {dec.k} windows of a session "
            "are decoded with fewer, and EA is settled after about 10 windows"
            if dec.ea else "no EA"
        ),
        preprocess_matrix="sosfiltfilt + resample_poly as one exact (window_samples x n_times) matrix",
        ea_inverse_sqrt=(f"scaled coupled Newton-Schulz, {NS_ITERS} iterations, float64, Frobenius-scaled, "
                         f"eigenvalue floor {NS_FLOOR:g}"),
    )


def hash_words_of(dec: StandaloneDecoder) -> list[int]:
    return [int(v) for v in dec.hash.tolist()]


def profile_device(meta: Any) -> tuple[float, str, float] | None:
    """``(rate, unit, unit_to_uv)`` of the device profile a checkpoint's model is for, or None.

    The profile (:func:`neurofed.trainer.checkpoint.device_of`) knows what its headset streams: the graph then takes
    that rate and unit (counts at the profile's gain included) and no ``--rate``/``--unit`` is needed.
    """

    dev = device_of(meta)
    return None if dev is None else (dev.sfreq, dev.unit, 1.0 / dev.scale)


def device_settings(meta: Any, rate: float | None, unit: str | None) -> tuple[float, str, float | None]:
    """The device a standalone graph is for: the model's device profile, else ``rate``/``unit`` (160 Hz, uV).

    Raises
    ------
    NeuroFedError
        ``rate``/``unit`` given that contradict the model's device profile.
    """
    dev = profile_device(meta)
    if dev is None:
        return (160.0 if rate is None else float(rate)), (unit or "uV"), None
    if (rate is not None and abs(float(rate) - dev[0]) > 1e-9) or (unit is not None and unit != dev[1]):
        raise NeuroFedError(f"the model is for device profile {meta.extra.get('profile')} ({dev[1]} at {dev[0]:g} Hz); "
                            f"--rate/--unit {rate}/{unit} contradict it (leave them out)")
    return dev


def write_standalone(model: nn.Module, cmeta: Any, out: str | os.PathLike, rate: float | None = None,
                     unit: str | None = None, step_s: float = 0.5) -> tuple[Any, StandaloneDecoder]:
    """One model -> standalone ONNX with metadata (device: :func:`device_settings`); returns (meta, decoder)."""

    rate, unit, to_uv = device_settings(cmeta, rate, unit)
    meta = build_meta(cmeta, model.state_dict())
    dec = StandaloneDecoder(model, cmeta, meta.model_hash, rate, unit, unit_to_uv=to_uv)
    proto = to_standalone_onnx(dec)
    info = standalone_info(dec, rate, unit, step_s)
    meta = meta.model_copy(update={"standalone": info.to_dict(), "input_name": "window", "output_name": "probs",
                                   "input_rate_hz": float(rate), "min_batch": None})
    embed_meta(proto, meta)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, proto.SerializeToString())
    return meta, dec


def export_standalone(
    ckpt: str | os.PathLike,
    out: str | os.PathLike,
    rate: float | None = None,
    unit: str | None = None,
    step_s: float = 0.5,
) -> tuple[Any, StandaloneDecoder]:
    """``neurofed export --standalone``: checkpoint -> standalone ONNX with metadata; returns (meta, decoder).

    ``rate``/``unit`` default to the model's device profile, else 160 Hz and microvolts.
    """

    if not Path(ckpt).is_file():
        raise NeuroFedError(f"{ckpt}: checkpoint file not found")
    model, cmeta = load_checkpoint(ckpt)
    return write_standalone(model, cmeta, out, rate, unit, step_s)


def export_standalone_profiles(
    ckpt: str | os.PathLike, out: str | os.PathLike, step_s: float = 0.5,
) -> dict[str, tuple[Path, Any, StandaloneDecoder]]:
    """A hierarchical (``fleeg``) checkpoint -> one standalone graph per device profile, each at its profile's
    rate and unit, written to :func:`neurofed.export.onnx_export.profile_output` (``model.onnx`` -> ``model.<profile>.onnx``)."""

    if not Path(ckpt).is_file():
        raise NeuroFedError(f"{ckpt}: checkpoint file not found")
    done = {}
    for p, (model, cmeta) in sorted(load_profile_models(ckpt).items()):
        path = profile_output(out, p)
        meta, dec = write_standalone(model, cmeta, path, step_s=step_s)
        done[p] = (path, meta, dec)
    return done


def recording_windows(
    path: str | os.PathLike, ch_names: list[str], label_map: dict[str, str], tmin: float, tmax: float
) -> tuple[np.ndarray, list[str], float]:
    """Raw cue-locked windows of one recording in time order, channels in ``ch_names`` order.

    Returns ``(windows (n, channels, samples) in microvolts, labels, sampling rate)``; this is what
    a device streams, before any preprocessing.
    """

    raw = read_raw(path)
    x, labels = epochs_from_raw(raw, label_map, tmin, tmax, source=str(path))
    return pick_channels(x, list(raw.ch_names), ch_names), labels, float(raw.info["sfreq"])


def eegmmidb_session_windows(
    subject: int, ch_names: list[str], classes: list[str], tmin: float, tmax: float, data_dir: Any = None
) -> list[tuple[str, np.ndarray, np.ndarray, float]]:
    """Every imagery run (session) of an EEGMMIDB subject whose classes are ``classes``:
    ``[(run file name, windows, class indices, rate), ...]`` in run order."""

    task = next((t for t, (_, cls) in TASKS.items() if list(cls) == list(classes)), None)
    if task is None:
        raise NeuroFedError(f"no EEGMMIDB task has the classes {classes}")
    out = []
    for f in subject_files(data_dir, subject, TASKS[task][0]):
        run = int(f.stem[-2:])
        w, labels, rate = recording_windows(f, ch_names, dict(RUN_EVENT_LABELS[run]), tmin, tmax)
        out.append((f.name, w, np.array([classes.index(c) for c in labels]), rate))
    return out
