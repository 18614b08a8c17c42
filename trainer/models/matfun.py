"""Matrix functions written with matmuls only (no eigendecomposition, which ONNX lacks), shared by the model
that needs them in its graph (:class:`neurofed.trainer.models.classical.TangentLDA`) and the standalone graph's
online Euclidean alignment (:mod:`neurofed.export.standalone`)."""

from __future__ import annotations

import functools
import math

import torch

#: Newton-Schulz design floor: ``R`` is scaled by its Frobenius norm (eigenvalues into (0, 1], the largest
#: at >= 1/sqrt(C) of the norm, 0.77 on real 64-channel sessions) and the iteration's per-step scalars
#: (:func:`ns_schedule`) are chosen so that every eigenvalue in [NS_FLOOR, 1] converges to double precision:
#: condition numbers up to 1e9 / sqrt(C) guaranteed (1.2e8 at 64 channels, 2.2e8 at 21), ~7.7e8 at the
#: real sessions' norm ratio. Real EEGMMIDB sessions reach 4.5e5 (64 channels) and 5.8e4 (21).
NS_FLOOR = 1e-9


def _ns_step(p: float) -> float:
    """The scalar map of one coupled Newton-Schulz step on an eigenvalue ``p`` of ``Z Y``: ``p (3 - p)^2 / 4``."""
    return p * (3.0 - p) ** 2 / 4.0


def ns_schedule(floor: float = NS_FLOOR, tol: float = 1e-15) -> tuple[float, ...]:
    """Per-step scalars ``alpha_k`` of the scaled coupled Newton-Schulz iteration for eigenvalues in ``[floor, 1]``.

    One step maps an eigenvalue ``p`` of ``Z Y`` to ``f(alpha p)``, ``f(p) = p (3 - p)^2 / 4`` (increasing on
    (0, 1), decreasing on (1, 3), ``f(1) = 1``). While the worst-case interval is ``[l, 1]``, the ``alpha`` with
    ``f(alpha l) = f(alpha)`` maximises the new lower end (the image of ``[alpha l, alpha]`` is then
    ``[f(alpha l), 1]``): the small eigenvalues grow ~6.7x per early step instead of 2.25x. Near 1 the plain
    step (``alpha = 1``, quadratic convergence) finishes. The scalars are exact constants of the graph: any
    ``alpha`` in (0, 3) keeps ``Y = R Z`` (all iterates are polynomials in ``R``) and the fixed point
    ``Z = R^{-1/2}``, so rounding in the schedule changes only the speed, not the limit.
    """
    if not 0 < floor < 1:
        raise ValueError(f"Newton-Schulz floor must be in (0, 1), got {floor}")
    alphas: list[float] = []
    low = floor
    while 1.0 - low > tol:
        if len(alphas) >= 100:
            raise RuntimeError("Newton-Schulz schedule did not converge")
        if 1.0 - low < 1e-3:
            a = 1.0
        else:  # bisection for f(a low) = f(a) on (1, 3): the difference increases with a
            lo, hi = 1.0, 3.0
            for _ in range(200):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if _ns_step(mid * low) < _ns_step(mid) else (lo, mid)
            a = lo
        low = min(_ns_step(a * low), _ns_step(a))
        alphas.append(a)
    return tuple(alphas)


#: The graph's Newton-Schulz scalars and iteration count (16 for ``NS_FLOOR`` 1e-9).
NS_ALPHAS: tuple[float, ...] = ns_schedule()
NS_ITERS = len(NS_ALPHAS)


def newton_schulz_inv_sqrt(
    a: torch.Tensor, alphas: tuple[float, ...] | int = NS_ALPHAS, scaling: str = "frobenius"
) -> torch.Tensor:
    """``A^{-1/2}`` of an SPD matrix by the scaled coupled Newton-Schulz iteration (matmuls only).

    ``A`` is divided by its Frobenius norm (``scaling="trace"``: by its trace, the graph's earlier and looser
    bound); then ``T = sqrt(alpha) (3 I - alpha Z Y) / 2``, ``Y <- Y T``, ``Z <- T Z`` for each ``alpha`` of
    :func:`ns_schedule` (an int ``n``: ``n`` plain steps, ``alpha = 1``); ``Y -> A^{1/2}``, ``Z -> A^{-1/2}``.
    """
    n = a.shape[-1]
    eye = torch.eye(n, dtype=a.dtype)
    if scaling == "frobenius":
        c = torch.sqrt((a * a).sum() if a.dim() == 2 else (a * a).sum((-2, -1), keepdim=True))  # batched: per matrix
    elif scaling == "trace":
        c = (a * eye).sum()  # torch.diagonal exports to a ConstantOfShape tract mistypes
    else:
        raise ValueError(f"scaling {scaling!r}: 'frobenius' or 'trace'")
    steps = (1.0,) * alphas if isinstance(alphas, int) else tuple(alphas)
    y = a / c
    z = None  # the identity: the first step needs no product with it
    for i, al in enumerate(steps):
        r = al ** 0.5
        if z is None:
            t = (1.5 * r) * eye - (0.5 * al * r) * y
            z = t
        else:
            # not addmm: its Gemm node has float32 alpha/beta attributes, and tract mistypes them on float64
            t = (1.5 * r) * eye - (0.5 * al * r) * (z @ y)
            z = t @ z
        if i < len(steps) - 1:  # the last Y is not needed
            y = y @ t
    z = eye if z is None else z
    return z / torch.sqrt(c)


#: Inverse scaling and squaring for the matrix logarithm (:func:`logm_iss`): square roots taken, series terms.
LOGM_SQRTS = 8
LOGM_TERMS = 14


@functools.lru_cache(maxsize=8)
def logm_schedules(n: int, sqrts: int = LOGM_SQRTS) -> tuple[tuple[float, ...], ...]:
    """Newton-Schulz scalars of each of :func:`logm_iss`'s square roots: the design condition number of the first
    (``1 / (NS_FLOOR sqrt(n))``, the graph's EA bound) is square-rooted by each root, so later roots need fewer steps."""
    cond = 1.0 / (NS_FLOOR * math.sqrt(n))
    return tuple(ns_schedule(min(0.5, 1.0 / (cond ** (0.5 ** j) * math.sqrt(n)))) for j in range(sqrts))


def logm_iss(a: torch.Tensor, sqrts: int = LOGM_SQRTS, terms: int = LOGM_TERMS) -> torch.Tensor:
    """``logm(A)`` of SPD matrices (..., n, n) with matmuls only (no eigendecomposition: not an ONNX op).

    Inverse scaling and squaring: ``A = c B`` with ``c = tr(A) / n``; ``sqrts`` square roots
    ``B^(1/2) = B (B^(-1/2))`` by :func:`newton_schulz_inv_sqrt` (per matrix, :func:`logm_schedules`) bring every eigenvalue of
    ``B^(1/2^k)`` near 1 (``[1e-4, n]`` -> within 4 % of 1 for k = 8); then ``log(I + E)`` by its Taylor series
    (``terms`` terms, Horner) and ``logm(A) = 2^k log(B^(1/2^k)) + log(c) I``. The tangent-space model's
    whitened covariances are near the identity; the error vs scipy/pyriemann is measured in
    tests/export/test_classical_onnx.py.
    """
    n = a.shape[-1]
    eye = torch.eye(n, dtype=a.dtype)
    c = (a * eye).sum((-2, -1), keepdim=True) / n
    b = a / c
    for alphas in logm_schedules(n, sqrts):
        b = b @ newton_schulz_inv_sqrt(b, alphas)
        b = (b + b.transpose(-1, -2)) / 2
    e = b - eye
    acc = eye * (((-1.0) ** (terms + 1)) / terms)
    for j in range(terms - 1, 0, -1):
        acc = eye * (((-1.0) ** (j + 1)) / j) + e @ acc
    return (2.0 ** sqrts) * (e @ acc) + torch.log(c) * eye
