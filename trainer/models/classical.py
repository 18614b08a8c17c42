"""The practitioner's pipelines as models that learn from sufficient statistics (issue 57).

``csp_lda`` (CSP + log-variance + LDA on Euclidean-aligned trials) and ``tangent_lda`` (OAS covariances, the
Riemannian tangent space at a log-Euclidean reference, LDA) are fitted from SUMS over trials: per-class
covariance sums and counts, then per-class feature sums, one Gram matrix and counts. A sum over clients is the
sum over the pooled trials, so a federation computes exactly what the centralised pipeline computes
(``neurofed classical``: MNE's ``CSP`` + scikit-learn's ``LinearDiscriminantAnalysis``; pyriemann's
``Covariances`` + ``TangentSpace``), in a fixed number of rounds (:attr:`StatisticsModel.PHASES`):

* a client fills the ``stat_*`` buffers of the current ``phase`` with its own sums divided by its trial count
  (:meth:`StatisticsModel.local_fit`; no SGD). The server's usual trial-weighted mean of the states
  (:class:`neurofed.trainer.fl.aggregate.WeightedSum`, or the unmasked sum of secure aggregation) times the
  round's trials is then the pooled sum;
* the server turns the pooled sums into the pipeline's parameters (:func:`solve_state`, called by
  :mod:`neurofed.trainer.fl.algorithms.classical`) and advances ``phase``.

The filters are computed by MNE's own ``CSP`` code from the federated class covariances (MNE's ``concat``
estimator is ``sum x x^T / (N - 1)`` over the class's samples, uncentred: checked to 1e-15 relative), the LDA is
scikit-learn's ``svd`` solver written on the statistics (``Sigma = S_w / n``, ``coef_k = Sigma^-1 mu_k``,
``intercept_k = -mu_k coef_k / 2 + log prior_k``; equal to it to 1e-14 on real features).

Client-level DP (:class:`DPSpec`): each client's statistics vector of a phase (its sums, and its counts times
``count_weight``) is clipped to L2 norm ``clip`` before it leaves the client, and the server adds Gaussian noise
``N(0, (noise clip)^2)`` to every coordinate of the pooled sum; the noisy matrices are symmetrised and the
within-class scatter floored to positive definite (post-processing). Two options shrink what is noised:
``count_weight`` 0 treats the class counts as public (the paradigm fixes how many cues of each class a session
has): they are neither in the clipped vector nor noised; ``ea_sum`` uses Euclidean alignment's identity (a
subject's class covariance sums add up to ``count x I``, so the centred sums of the two classes are each other's
negatives): only class 0's centred sum is clipped and noised, class 1's is its negative (:meth:`dp_mirror`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from neurofed.trainer.errors import ModelConfigError
from neurofed.trainer.models.matfun import logm_iss

#: prefix of the buffers that carry a client's statistics (zero in a fitted model)
STAT = "stat_"


@dataclass(frozen=True)
class DPSpec:
    """Client-level DP of the statistics: L2 ``clip`` per client in the first round (``clip_lda`` in the LDA round;
    0 = ``clip``), noise multiplier ``noise`` (std ``noise`` x that round's clip, so each round is a Gaussian
    mechanism of multiplier ``noise`` whatever its clip)."""

    clip: float = 0.0
    noise: float = 0.0
    count_weight: float = 1.0
    seed: int = 0
    clip_lda: float = 0.0
    #: noise multiplier of the LDA round (0 = ``noise``): a budget split between the two releases
    noise_lda: float = 0.0
    #: release only class 0's centred sum where the model has an exact mirror (:meth:`StatisticsModel.dp_mirror`)
    ea_sum: bool = False

    @property
    def on(self) -> bool:
        return self.clip > 0

    @property
    def public_counts(self) -> bool:
        """Counts weighted 0: public, neither clipped nor noised."""
        return self.count_weight == 0

    def clip_of(self, phase: int) -> float:
        return self.clip_lda if phase > 0 and self.clip_lda > 0 else self.clip

    def noise_of(self, phase: int) -> float:
        return self.noise_lda if phase > 0 and self.noise_lda > 0 else self.noise


def lda_from_statistics(sums: np.ndarray, gram: np.ndarray, counts: np.ndarray, shrinkage: float = 0.0,
                        floor: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """LDA ``(coef (K, d), intercept (K,))`` from per-class feature sums, the total Gram ``sum x x^T`` and counts.

    The softmax of ``x @ coef.T + intercept`` is scikit-learn's ``LinearDiscriminantAnalysis().predict_proba``
    (``svd`` solver, no shrinkage; for two classes its ``decision_function`` is the difference of the two rows);
    with ``shrinkage`` s > 0, ``LinearDiscriminantAnalysis(solver="lsqr", shrinkage=s)``'s (the within-class
    covariance ``S_w / n`` shrunk to ``(1 - s) S + s tr(S) / d I``).
    ``floor``: clip the within-class covariance's eigenvalues to 1e-6 of its largest (noisy DP statistics).
    """
    n = counts.sum()
    means = sums / counts[:, None]
    sw = gram - np.einsum("k,ki,kj->ij", counts, means, means)
    sigma = (sw + sw.T) / (2 * n)
    if shrinkage > 0:
        d = sigma.shape[0]
        sigma = (1 - shrinkage) * sigma + shrinkage * np.trace(sigma) / d * np.eye(d)
    if floor:
        w, v = np.linalg.eigh(sigma)
        sigma = (v * np.maximum(w, 1e-6 * max(w.max(), 1e-300))) @ v.T
    coef = np.linalg.solve(sigma, means.T).T
    intercept = -0.5 * np.einsum("kd,kd->k", means, coef) + np.log(counts / n)
    return coef, intercept


class StatisticsModel(nn.Module):
    """A model fitted from pooled sums in :attr:`PHASES` rounds (see the module docstring).

    Subclasses define :attr:`PHASE_STATS` (the ``stat_*`` buffers each phase fills), :meth:`phase_statistics`
    (a client's sums) and :meth:`solve_phase` (the server's fit from the pooled sums).
    """

    #: the statistics buffers each phase fills, and which of them are counts (scaled by DP's count weight)
    PHASE_STATS: ClassVar[tuple[tuple[str, ...], ...]] = ()
    COUNTS: ClassVar[tuple[str, ...]] = ()
    PHASES: ClassVar[int] = 0

    def _init_common(self, n_channels: int, n_classes: int, n_times: int) -> None:
        if n_classes < 2:
            raise ModelConfigError(f"{type(self).__name__} needs at least 2 classes, got {n_classes}")
        self.n_channels, self.n_classes, self.n_times = n_channels, n_classes, n_times
        self.register_buffer("phase", torch.zeros(1, dtype=torch.int64))
        self.register_buffer("input_times", torch.tensor([float(n_times)], dtype=torch.float64))

    def fitted(self) -> bool:
        return int(self.phase.item()) >= self.PHASES

    # ---------------------------------------------------------------- client
    def phase_statistics(self, phase: int, X: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def local_fit(self, X: np.ndarray, y: np.ndarray, settings: Mapping[str, Any]) -> dict[str, float]:
        """Fill this phase's ``stat_*`` buffers with the client's sums / its trial count (DP-clipped if on).

        Called by :func:`neurofed.trainer.fl.local.train_local` instead of SGD. Returns the round's metrics.
        """
        dp = dp_spec(settings)
        phase = int(self.phase.item())
        for name, buf in self.named_buffers():
            if name.startswith(STAT):
                buf.zero_()
        if phase >= self.PHASES or len(X) == 0:
            return {"loss": 0.0, "steps": 0.0}
        stats = self.phase_statistics(phase, np.asarray(X, np.float64), np.asarray(y))
        off: Mapping[str, np.ndarray] = {}
        if dp.on:  # the clipped vector: statistics minus their public reference, counts weighted (or public)
            off = self.public_offset(phase, stats)
            vec = {k: (v - off[k] if k in off else v) * (dp.count_weight if k in self.COUNTS else 1.0)
                   for k, v in stats.items() if not (dp.public_counts and k in self.COUNTS)}
            mirror = self.dp_mirror(phase) if dp.ea_sum else None
            if mirror is not None:
                vec[mirror] = vec[mirror][:1]
            norm = float(np.sqrt(sum(float(np.sum(v ** 2)) for v in vec.values())))
        else:
            norm = float(np.sqrt(sum(float(np.sum(v ** 2)) for v in stats.values())))
        scale = min(1.0, dp.clip_of(phase) / norm) if dp.on and norm > 0 else 1.0
        for k, v in stats.items():
            if dp.on and dp.public_counts:  # counts as they are; the sums' departure from the offset scaled
                v = v if k in self.COUNTS else (off[k] + scale * (v - off[k]) if k in off else v * scale)
            else:
                v = v * scale
            getattr(self, k).copy_(torch.from_numpy(np.asarray(v / len(X), np.float64)))
        return {"loss": 0.0, "steps": 0.0, "stat_norm": norm, "clipped": float(scale < 1.0)}

    def public_offset(self, phase: int, stats: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A public function of the counts subtracted from the statistics before DP clipping (and added back from the
        noisy counts at the server): what every client's statistics are near, so the clip bounds only what differs.
        None by default."""
        return {}

    def dp_mirror(self, phase: int) -> str | None:
        """The statistic of ``phase`` whose centred class-1 block is exactly minus its class-0 block (so DP
        releases class 0's only); None by default."""
        return None

    # ---------------------------------------------------------------- server
    def solve_phase(self, phase: int, pooled: dict[str, np.ndarray], old: Mapping[str, Tensor],
                    noisy: bool, shrinkage: float = 0.0) -> dict[str, Tensor]:
        raise NotImplementedError

    # ---------------------------------------------------------------- helpers
    def _labels(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, np.int64)
        if y.size and (y.min() < 0 or y.max() >= self.n_classes):
            raise ModelConfigError(f"labels must be in 0..{self.n_classes - 1}")
        return y


def dp_spec(settings: Mapping[str, Any]) -> DPSpec:
    """The DP settings of the statistics from a strategy's settings (``classical_dp_*``, ``dp_seed``)."""
    return DPSpec(float(settings.get("classical_dp_clip", 0.0)), float(settings.get("classical_dp_noise", 0.0)),
                  float(settings.get("classical_dp_count_weight", 1.0)), int(settings.get("dp_seed", 0)),
                  float(settings.get("classical_dp_clip_lda", 0.0)), 0.0,
                  bool(settings.get("classical_dp_ea_sum", False)))


def _t(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def _symmetric(a: np.ndarray) -> np.ndarray:
    return (a + np.swapaxes(a, -1, -2)) / 2


# ==================================================================================== CSP + LDA
def csp_filters(covs: np.ndarray, rank: int, n_components: int) -> np.ndarray:
    """MNE's CSP filters (``CSP(n_components, log=True, norm_trace=False)``, mutual-information order) of the class
    covariances ``covs`` (K, C, C): MNE's own decomposition with the covariances supplied instead of estimated."""
    import mne
    from mne.decoding import CSP
    from mne.utils import use_log_level

    k, c, _ = covs.shape
    info = mne.create_info(c, 1000.0, "mag")  # what MNE's CSP uses when given no info
    csp = CSP(n_components=n_components, log=True, norm_trace=False)
    csp.cov_callable = lambda X, y: (covs, covs.mean(0), info, {"mag": int(rank)}, {"sample_weights": np.full(k, c)})
    dummy = np.random.default_rng(0).standard_normal((2 * k, c, 4))  # only its shape and classes are read
    with use_log_level("warning"):
        csp.fit(dummy, np.repeat(np.arange(k), 2))
    return np.asarray(csp.filters_[:n_components], np.float64)


def data_rank(gram: np.ndarray) -> int:
    """MNE's rank estimate of the concatenated data from its Gram matrix ``sum x x^T``: singular values above
    ``s_max * n_channels * eps`` (the tolerance MNE logs for ``rank=None``)."""
    s = np.sqrt(np.clip(np.linalg.eigvalsh(_symmetric(gram)), 0, None))
    return int((s > s.max() * gram.shape[0] * np.finfo(np.float64).eps).sum())


class CSPLDA(StatisticsModel):
    """EA'd trials -> CSP filters -> log of the mean power per component -> LDA (two classes).

    Phase 0: per-class ``sum X X^T / T`` and trial counts -> MNE's class covariances -> CSP filters.
    Phase 1: per-class sums of the log-power features (minus a public centre from phase 0), their Gram, counts -> LDA.

    Parameters
    ----------
    n_channels, n_classes, n_times : int
    sfreq : float
        Recorded for metadata.
    bn_mode : str
        Ignored (no BatchNorm; accepted so every model builds alike).
    n_components : int
        CSP components (``neurofed classical``'s default, 6).
    """

    PHASE_STATS = (("stat_cov_gram", "stat_cov_count"), ("stat_lda_sum", "stat_lda_gram", "stat_lda_count"))
    COUNTS = ("stat_cov_count", "stat_lda_count")
    PHASES = 2

    def __init__(self, n_channels: int, n_classes: int, n_times: int, sfreq: float, bn_mode: str = "standard",
                 *, n_components: int = 6) -> None:
        super().__init__()
        if n_classes != 2:
            raise ModelConfigError(f"csp_lda is for two classes (MNE's CSP ordering), got {n_classes}")
        if not 1 <= n_components <= n_channels:
            raise ModelConfigError(f"csp_lda: n_components must be in 1..{n_channels}, got {n_components}")
        self._init_common(n_channels, n_classes, n_times)
        k = n_components
        self.register_buffer("filters", torch.eye(n_channels, dtype=torch.float64)[:k].clone())
        # the features' public centre (log of each filter's power under the mean class covariance of round 1): the
        # LDA round's statistics are of f - centre (shift-equivariant: the same classifier; small sums to clip)
        self.register_buffer("centre", torch.zeros(k, dtype=torch.float64))
        self.register_buffer("coef", torch.zeros(n_classes, k, dtype=torch.float64))
        self.register_buffer("intercept", torch.zeros(n_classes, dtype=torch.float64))
        self.register_buffer("stat_cov_gram", torch.zeros(n_classes, n_channels, n_channels, dtype=torch.float64))
        self.register_buffer("stat_cov_count", torch.zeros(n_classes, dtype=torch.float64))
        self.register_buffer("stat_lda_sum", torch.zeros(n_classes, k, dtype=torch.float64))
        self.register_buffer("stat_lda_gram", torch.zeros(k, k, dtype=torch.float64))
        self.register_buffer("stat_lda_count", torch.zeros(n_classes, dtype=torch.float64))

    def features(self, x: Tensor) -> Tensor:
        """Log mean power of each CSP component, float64 (N, k)."""
        z = torch.matmul(self.filters, x.to(torch.float64))
        return torch.log((z * z).mean(-1))

    def forward(self, x: Tensor) -> Tensor:
        """Class logits (float32); their softmax is the LDA's class probabilities."""
        return ((self.features(x) - self.centre) @ self.coef.T + self.intercept).to(torch.float32)

    def np_features(self, X: np.ndarray) -> np.ndarray:
        """MNE's ``CSP.transform`` (log mean power) with this model's filters, minus the public centre, float64."""
        w = self.filters.numpy()
        return np.log((np.einsum("kc,nct->nkt", w, X) ** 2).mean(axis=2)) - self.centre.numpy()

    def phase_statistics(self, phase: int, X: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        y = self._labels(y)
        onehot = np.eye(self.n_classes)[y]
        if phase == 0:
            grams = np.einsum("nct,ndt->ncd", X, X) / X.shape[2]
            return {"stat_cov_gram": np.einsum("nk,ncd->kcd", onehot, grams), "stat_cov_count": onehot.sum(0)}
        f = self.np_features(X)
        return {"stat_lda_sum": onehot.T @ f, "stat_lda_gram": f.T @ f, "stat_lda_count": onehot.sum(0)}

    def public_offset(self, phase: int, stats: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Round 1: ``count_c I`` for each class's ``sum X X^T / T``: Euclidean alignment makes a subject's mean trial
        covariance the identity, so only the classes' departures from it are clipped and noised."""
        if phase != 0:
            return {}
        eye = np.eye(self.n_channels)
        return {"stat_cov_gram": stats["stat_cov_count"][:, None, None] * eye}

    def dp_mirror(self, phase: int) -> str | None:
        """Round 1 of two classes: on Euclidean-aligned trials a subject's ``sum X X^T / T`` over all its trials is
        ``n I`` (its EA reference is that mean), so ``S_0 - n_0 I = -(S_1 - n_1 I)``."""
        return "stat_cov_gram" if phase == 0 and self.n_classes == 2 else None

    def solve_phase(self, phase: int, pooled: dict[str, np.ndarray], old: Mapping[str, Tensor],
                    noisy: bool, shrinkage: float = 0.0) -> dict[str, Tensor]:
        if phase == 0:
            t = self.n_times
            counts = np.maximum(pooled["stat_cov_count"], 1.0) * t  # samples per class
            grams = _symmetric(pooled["stat_cov_gram"]) * t  # sum x x^T over the class's samples
            covs = grams / (counts - 1)[:, None, None]  # MNE's concat covariance (empirical, uncentred, ddof 1)
            if noisy:  # DP: the noisy covariances floored to positive definite (post-processing)
                w, v = np.linalg.eigh(covs)
                covs = np.einsum("kij,kj,klj->kil", v, np.maximum(w, 1e-6 * w.max(-1, keepdims=True)), v)
            w = csp_filters(covs, data_rank(grams.sum(0)), self.filters.shape[0])
            centre = np.log(np.einsum("kc,cd,kd->k", w, covs.mean(0), w))
            return {"filters": _t(w), "centre": _t(centre)}
        coef, intercept = lda_from_statistics(pooled["stat_lda_sum"], _symmetric(pooled["stat_lda_gram"]),
                                              np.maximum(pooled["stat_lda_count"], 1.0), shrinkage, floor=noisy)
        return {"coef": _t(coef), "intercept": _t(intercept)}


# ==================================================================================== tangent space + LDA
def oas_covariances(x: Tensor) -> Tensor:
    """scikit-learn's ``oas`` (pyriemann ``Covariances("oas")``) of every trial of ``x`` (N, C, T), float64, plain
    ops: centred empirical covariance (ddof 0) shrunk towards ``mu I`` by the OAS coefficient."""
    x = x.to(torch.float64)
    n_t, c = x.shape[-1], x.shape[-2]
    xc = x - x.mean(-1, keepdim=True)
    emp = torch.matmul(xc, xc.transpose(-1, -2)) / n_t
    eye = torch.eye(c, dtype=torch.float64)
    alpha = (emp * emp).mean((-2, -1), keepdim=True)
    mu = (emp * eye).sum((-2, -1), keepdim=True) / c
    num = alpha + mu * mu
    den = (n_t + 1) * (alpha - mu * mu / c)
    shrink = torch.clamp(num / den, max=1.0)  # den > 0 for any window that is not a multiple of I
    return (1.0 - shrink) * emp + shrink * mu * eye


def upper_weights(c: int) -> tuple[Tensor, Tensor]:
    """Row/column indices of the upper triangle and pyriemann's ``upper`` weights (1 on, sqrt 2 off the diagonal)."""
    i, j = np.triu_indices(c)
    w = np.where(i == j, 1.0, np.sqrt(2.0))
    return torch.from_numpy(i * c + j), torch.from_numpy(w)


def logm_eigh(a: Tensor) -> Tensor:
    """Matrix logarithm of symmetric positive definite matrices by eigendecomposition (float64)."""
    w, v = torch.linalg.eigh(a)
    return (v * torch.log(w).unsqueeze(-2)) @ v.transpose(-1, -2)


class TangentLDA(StatisticsModel):
    """EA'd trials -> OAS covariances -> Riemannian tangent space at a log-Euclidean reference -> LDA.

    Phase 0: ``sum logm(C_i)`` and the trial count -> reference ``M = expm(mean logm(C_i))`` (pyriemann's
    ``mean_logeuclid``; one round, where the Riemannian mean would take one round per Karcher iteration).
    Phase 1: per-class sums of the tangent vectors ``upper(logm(M^-1/2 C M^-1/2))``, their Gram, counts -> LDA.
    The forward pass whitens with the stored ``M^-1/2`` and takes the logarithm by eigendecomposition
    (:func:`logm_eigh`); the standalone graph swaps in an eigendecomposition-free logarithm
    (:func:`graph_form`).
    """

    PHASE_STATS = (("stat_log_sum", "stat_log_count"), ("stat_lda_sum", "stat_lda_gram", "stat_lda_count"))
    COUNTS = ("stat_log_count", "stat_lda_count")
    PHASES = 2

    def __init__(self, n_channels: int, n_classes: int, n_times: int, sfreq: float,
                 bn_mode: str = "standard") -> None:
        super().__init__()
        self._init_common(n_channels, n_classes, n_times)
        d = n_channels * (n_channels + 1) // 2
        idx, w = upper_weights(n_channels)
        self.register_buffer("upper_idx", idx, persistent=False)
        self.register_buffer("upper_w", w, persistent=False)
        self.register_buffer("ref", torch.eye(n_channels, dtype=torch.float64))
        self.register_buffer("ref_isqrt", torch.eye(n_channels, dtype=torch.float64))
        self.register_buffer("coef", torch.zeros(n_classes, d, dtype=torch.float64))
        self.register_buffer("intercept", torch.zeros(n_classes, dtype=torch.float64))
        self.register_buffer("stat_log_sum", torch.zeros(n_channels, n_channels, dtype=torch.float64))
        self.register_buffer("stat_log_count", torch.zeros(1, dtype=torch.float64))
        self.register_buffer("stat_lda_sum", torch.zeros(n_classes, d, dtype=torch.float64))
        self.register_buffer("stat_lda_gram", torch.zeros(d, d, dtype=torch.float64))
        self.register_buffer("stat_lda_count", torch.zeros(n_classes, dtype=torch.float64))
        self.logm = logm_eigh

    def features(self, x: Tensor) -> Tensor:
        """Tangent vectors (N, C(C+1)/2), float64."""
        w = self.ref_isqrt @ oas_covariances(x) @ self.ref_isqrt
        lg = self.logm((w + w.transpose(-1, -2)) / 2)
        return lg.flatten(-2)[..., self.upper_idx] * self.upper_w

    def forward(self, x: Tensor) -> Tensor:
        return (self.features(x) @ self.coef.T + self.intercept).to(torch.float32)

    @staticmethod
    def np_covariances(X: np.ndarray) -> np.ndarray:
        from pyriemann.estimation import Covariances

        return Covariances(estimator="oas").fit_transform(X)

    def phase_statistics(self, phase: int, X: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        from pyriemann.geometry.base import logm
        from pyriemann.geometry.tangentspace import tangent_space

        y = self._labels(y)
        onehot = np.eye(self.n_classes)[y]
        covs = self.np_covariances(X)
        if phase == 0:
            return {"stat_log_sum": logm(covs).sum(0), "stat_log_count": np.array([float(len(X))])}
        v = tangent_space(covs, self.ref.numpy(), metric="riemann")
        return {"stat_lda_sum": onehot.T @ v, "stat_lda_gram": v.T @ v, "stat_lda_count": onehot.sum(0)}

    def solve_phase(self, phase: int, pooled: dict[str, np.ndarray], old: Mapping[str, Tensor],
                    noisy: bool, shrinkage: float = 0.0) -> dict[str, Tensor]:
        from pyriemann.geometry.base import expm, invsqrtm

        if phase == 0:
            ref = expm(_symmetric(pooled["stat_log_sum"]) / max(float(pooled["stat_log_count"][0]), 1.0))
            return {"ref": _t(ref), "ref_isqrt": _t(invsqrtm(ref))}
        coef, intercept = lda_from_statistics(pooled["stat_lda_sum"], _symmetric(pooled["stat_lda_gram"]),
                                              np.maximum(pooled["stat_lda_count"], 1.0), shrinkage, floor=noisy)
        return {"coef": _t(coef), "intercept": _t(intercept)}


def graph_form(model: nn.Module) -> nn.Module:
    """``model`` as an ONNX graph can express it: the tangent-space model with
    :func:`neurofed.trainer.models.matfun.logm_iss` instead of its eigendecomposition (a copy; others as they are)."""
    if isinstance(model, TangentLDA):
        model = copy.deepcopy(model)
        model.logm = logm_iss
    return model


#: the statistics models by name (also in :data:`neurofed.trainer.models.MODELS`)
STATISTICS_MODELS: dict[str, type[StatisticsModel]] = {"csp_lda": CSPLDA, "tangent_lda": TangentLDA}


def model_from_state(state: Mapping[str, Tensor]) -> StatisticsModel:
    """The statistics model a global state belongs to, rebuilt from its shapes and loaded with it."""
    k_cls, t = state["coef"].shape[0], int(state["input_times"].item())
    model: StatisticsModel
    if "filters" in state:
        model = CSPLDA(state["filters"].shape[1], k_cls, t, 0.0, n_components=state["filters"].shape[0])
    elif "ref_isqrt" in state:
        model = TangentLDA(state["ref_isqrt"].shape[0], k_cls, t, 0.0)
    else:
        raise ValueError("the global state is not a statistics model's (no filters / ref_isqrt)")
    model.load_state_dict(dict(state), strict=True)
    return model


def solve_state(model: StatisticsModel, old: Mapping[str, Tensor], averaged: Mapping[str, Tensor], n_total: float,
                dp: DPSpec, round_seed: int, shrinkage: float = 0.0) -> dict[str, Tensor]:
    """The server's step: pooled sums (``averaged`` = the trial-weighted mean of the clients' states, times
    ``n_total`` trials) -> this phase's parameters; everything else from ``old``; ``phase`` + 1. ``shrinkage``: the
    LDA's (:func:`lda_from_statistics`).

    With ``dp.on`` each pooled statistic gets Gaussian noise of std ``dp.noise * dp.clip`` per coordinate (counts:
    the noise on ``count_weight * count``; public counts: none), seeded by ``(dp.seed, round_seed, phase)``; with
    ``dp.ea_sum`` the mirrored statistic's class 0 block is noised and class 1's set to its negative.
    """
    out = {k: v.clone() for k, v in old.items()}
    phase = int(old["phase"].item())
    if phase >= model.PHASES:
        return out
    rng = np.random.default_rng([dp.seed, round_seed, phase])
    pooled = {k: averaged[k].to(torch.float64).numpy() * n_total for k in model.PHASE_STATS[phase]}
    noise = dp.noise_of(phase)
    if dp.on and noise > 0:  # noise on the clipped vector's coordinates: centred statistics, weighted counts
        off = model.public_offset(phase, pooled)
        mirror = model.dp_mirror(phase) if dp.ea_sum else None
        sd = noise * dp.clip_of(phase)
        for k in model.PHASE_STATS[phase]:
            if k in model.COUNTS and dp.public_counts:
                continue
            w = dp.count_weight if k in model.COUNTS else 1.0
            if k == mirror:
                c0 = pooled[k][0] - off[k][0] + rng.normal(0.0, sd, pooled[k][0].shape)
                pooled[k] = np.stack([c0, -c0])
            else:
                pooled[k] = pooled[k] - off.get(k, 0.0) + rng.normal(0.0, sd, pooled[k].shape) / w
        off = model.public_offset(phase, pooled)  # back from the noisy counts
        pooled = {k: v + off.get(k, 0.0) for k, v in pooled.items()}
    out.update(model.solve_phase(phase, pooled, old, noisy=dp.on and noise > 0, shrinkage=shrinkage))
    for k in out:
        if k.startswith(STAT):
            out[k] = torch.zeros_like(out[k])
    out["phase"] = old["phase"] + 1
    return out
