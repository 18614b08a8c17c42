"""Classical references on NeuroFed's folds: EA + CSP + LDA (MNE, scikit-learn) and Riemannian tangent space.

What a BCI practitioner would run instead of a deep federated model, evaluated on exactly the same subject
folds (:func:`neurofed.trainer.experiments.protocol.make_folds` with the same fold seed) and the same cached epochs
(:func:`neurofed.trainer.data.load_subjects`), written as a ``results.json`` in the schema ``neurofed simulate`` writes
so ``neurofed report`` shows the classical pipelines as rows next to the deep runs.

Methods
-------
``csp-lda``
    Per-subject Euclidean alignment (the epochs' own EA) -> ``mne.decoding.CSP`` (6 log-variance
    components) -> ``LinearDiscriminantAnalysis``, fitted on the pooled training subjects.
``tangent-lda``
    Per-subject EA'd epochs -> ``pyriemann`` covariances (OAS) -> tangent space at the log-Euclidean mean of the
    training covariances -> ``LinearDiscriminantAnalysis``: the centralised twin of ``neurofed simulate
    --algorithm fed-tangent`` (which federates it exactly, :mod:`neurofed.trainer.fl.algorithms.classical`).
``riemann``
    Unaligned epochs -> ``pyriemann`` covariances (OAS shrinkage) -> per-subject re-centring of the
    covariances to the identity (``pyriemann.transfer.TLCenter``, each subject from its own unlabelled
    trials, as EA does) -> tangent space -> logistic regression.

Attacks: black-box only (``square``, ``hsj`` through ART, on the class scores; same std scaling, budgets and
test batches of 8 as for the deep models), on the method's input (EA'd trials for csp-lda, unaligned trials
for riemann with the subject's clean re-centring kept).

Both are unsupervised-aligned per subject and trained centrally on the training subjects (a centralised
reference, like CT). They are deterministic except for the logistic regression's ``random_state`` (= seed).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from neurofed.trainer.art_attacks import blackbox_on_scores
from neurofed.trainer.atomic import atomic_write_bytes
from neurofed.trainer.attacks import attack_budgets
from neurofed.trainer.data import PreprocessConfig, SubjectData, load_subjects
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.evaluate import bca
from neurofed.trainer.experiments.protocol import make_folds
from neurofed.trainer.experiments.simulate import aggregate_seeds, open_run

logger = logging.getLogger("neurofed.trainer")

METHODS = ("csp-lda", "riemann", "tangent-lda")
#: tangent-lda's LDA shrinkage (231 tangent coordinates at 21 channels: a few hundred trials make the within-class
#: covariance singular); fed-tangent's default too
TANGENT_SHRINKAGE = 0.5
#: Whether a method works on per-subject EA'd epochs (csp-lda, tangent-lda) or re-centres covariances itself (riemann).
METHOD_EA = {"csp-lda": True, "riemann": False, "tangent-lda": True}


@dataclass
class ClassicalConfig:
    """One classical experiment (the fields ``neurofed report`` reads match :class:`SimConfig`'s).

    Parameters
    ----------
    method : str
        ``csp-lda`` or ``riemann``.
    n_components : int
        CSP components (csp-lda).
    C : float
        Inverse regularisation of the logistic regression (riemann).
    """

    method: str = "csp-lda"
    subjects: list[int] = field(default_factory=list)
    protocol: str = "kfold:5"
    seeds: list[int] = field(default_factory=lambda: [0])
    preprocess: dict = field(default_factory=lambda: PreprocessConfig().to_dict())
    fold_seed: int = 0
    n_components: int = 6
    C: float = 1.0
    data_dir: str | None = None
    attacks: list[list] = field(default_factory=list)  # black-box only: [["square", 0.05], ["hsj", 0.05]]
    test_batch: int = 8
    strategy_overrides: dict = field(default_factory=dict)  # none: kept so reports treat the run as plain

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise NeuroFedError(f"--method {self.method!r}: use one of {', '.join(METHODS)}")
        if not self.seeds:
            raise NeuroFedError("--seeds: give at least one seed")
        if bad := [a for a, _ in self.attacks if a not in ("square", "hsj")]:
            raise NeuroFedError(f"--attack {', '.join(bad)}: the classical pipelines take black-box attacks only "
                                "(square, hsj)")


def build_pipeline(method: str, seed: int = 0, n_components: int = 6, C: float = 1.0,
                   shrinkage: float = TANGENT_SHRINKAGE):
    """The scikit-learn pipeline of ``method`` on trials (csp-lda) or re-centred covariances (riemann).

    Parameters
    ----------
    method : str
        ``csp-lda`` or ``tangent-lda`` (input: EA'd trials, shape (n, ch, t)) or ``riemann`` (input: SPD matrices,
        shape (n, ch, ch), already re-centred per subject by :func:`recentred_covariances`).
    seed : int
        ``random_state`` of the logistic regression.
    shrinkage : float
        tangent-lda: the LDA's shrinkage (scikit-learn's lsqr solver; 0: its svd solver).
    """
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    if method == "csp-lda":
        from mne.decoding import CSP

        return make_pipeline(CSP(n_components=n_components, log=True, norm_trace=False),
                             LinearDiscriminantAnalysis())
    if method == "tangent-lda":
        from pyriemann.estimation import Covariances
        from pyriemann.tangentspace import TangentSpace

        lda = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=shrinkage) if shrinkage else LinearDiscriminantAnalysis()
        return make_pipeline(Covariances(estimator="oas"), TangentSpace(metric={"mean": "logeuclid", "map": "riemann"}),
                             lda)
    if method == "riemann":
        from pyriemann.tangentspace import TangentSpace

        return make_pipeline(TangentSpace(metric="riemann"),
                             LogisticRegression(C=C, max_iter=1000, random_state=seed))
    raise NeuroFedError(f"unknown classical method {method!r}: use one of {', '.join(METHODS)}")


def _oas(x: np.ndarray) -> np.ndarray:
    from pyriemann.estimation import Covariances

    return Covariances(estimator="oas").fit_transform(np.asarray(x, dtype=np.float64))


def subject_centre(sd: SubjectData):
    """The transformer re-centring ``sd``'s covariances so their Riemannian mean is the identity.

    Fitted on the subject's own trials without labels (``pyriemann.transfer.TLCenter``), the
    covariance-domain counterpart of per-subject Euclidean alignment.
    """
    from pyriemann.transfer import TLCenter, encode_domains

    covs = _oas(sd.X)
    dummy = np.zeros(len(covs), dtype=int)  # labels are not used by the centring
    _, y_enc = encode_domains(covs, dummy, np.array([sd.subject] * len(covs)))
    return TLCenter(target_domain=sd.subject, metric="riemann").fit(covs, y_enc).centers_[sd.subject]


def recentred_covariances(subjects: list[SubjectData]) -> list[np.ndarray]:
    """Per subject: OAS covariances re-centred by :func:`subject_centre`."""
    return [subject_centre(sd).transform(_oas(sd.X)) for sd in subjects]


def scorer(method: str, pipe, sd: SubjectData):
    """Class scores of ``sd``-like trials (the method's input: EA'd for csp-lda, unaligned for riemann).

    For riemann the re-centring stays the one fitted on ``sd``'s clean trials (an attacker perturbs
    trials, not the device's alignment reference).
    """
    if method == "riemann":
        centre = subject_centre(sd)
        return lambda x: pipe.predict_proba(centre.transform(_oas(x)))
    return lambda x: pipe.predict_proba(np.asarray(x, dtype=np.float64))


def _features(method: str, subjects: list[SubjectData]) -> list[np.ndarray]:
    if method == "riemann":
        return recentred_covariances(subjects)
    return [sd.X.astype(np.float64) for sd in subjects]


def fit_predict_fold(cfg: ClassicalConfig, train: list[SubjectData], test: list[SubjectData],
                     seed: int) -> dict[str, dict[str, float]]:
    """Fit on the pooled training subjects, return ``{subject: {"bca": ...}}`` for each test subject."""
    from mne.utils import use_log_level

    Xtr = _features(cfg.method, train)
    pipe = build_pipeline(cfg.method, seed, cfg.n_components, cfg.C)
    with use_log_level("warning"):  # MNE's CSP logs its rank estimate on every fit
        pipe.fit(np.concatenate(Xtr), np.concatenate([sd.y for sd in train]))
    out = {sd.subject: {"bca": bca(sd.y, pipe.predict(x))} for sd, x in zip(test, _features(cfg.method, test))}
    for attack, eps in cfg.attacks:
        for sd in test:
            score = scorer(cfg.method, pipe, sd)
            pred = []
            for b, i in enumerate(range(0, sd.n_trials, cfg.test_batch)):
                xb, yb = sd.X[i : i + cfg.test_batch], sd.y[i : i + cfg.test_batch]
                pred.append(score(blackbox_on_scores(attack, score, xb, yb, eps, seed + b)).argmax(1))
            out[sd.subject][f"{attack}@{eps:g}"] = bca(sd.y, np.concatenate(pred))
    return out


def run_classical(cfg: ClassicalConfig, out_dir: str | os.PathLike,
                  on_done: Callable[[dict, int, int], None] | None = None) -> dict:
    """Every (seed, fold) of ``cfg``; writes ``config.json``, ``jobs/*.json`` and ``results.json`` in ``out_dir``.

    Re-running with the same configuration (seeds may be added) skips the (seed, fold) jobs already written.

    Returns the results (the schema of :func:`neurofed.trainer.experiments.simulate.summarise`).
    """
    import mne
    import sklearn

    out = open_run(out_dir, cfg)
    pre = PreprocessConfig.from_dict(cfg.preprocess)
    data = {int(sd.subject[1:]): sd for sd in load_subjects(cfg.subjects, pre, cfg.data_dir)}
    folds = make_folds(cfg.subjects, cfg.protocol, cfg.fold_seed)
    if folds == [[]]:
        raise NeuroFedError("classical references need held-out subjects: use --protocol loso or kfold:K; for a "
                            "deployable classical model train `neurofed simulate --algorithm fed-csp-lda` (or "
                            "fed-tangent) `--test-subjects none` and score it with `neurofed evaluate`")
    jobs, total = [], len(folds) * len(cfg.seeds)
    for seed in cfg.seeds:
        for k, fold in enumerate(folds):
            path = out / "jobs" / f"seed{seed}_fold{k:02d}.json"
            if path.exists():  # finished earlier (resume: attacked runs take minutes per fold)
                jobs.append(json.loads(path.read_text()))
                continue
            t0 = time.time()
            train = [data[s] for s in cfg.subjects if s not in fold]
            test = [data[s] for s in fold]
            job = {"fold": k, "seed": seed, "test_subjects": [sd.subject for sd in test],
                   "per_subject": fit_predict_fold(cfg, train, test, seed), "curve": [], "participation": {},
                   "seconds": time.time() - t0}
            atomic_write_bytes(path, json.dumps(job).encode())
            jobs.append(job)
            if on_done:
                on_done(job, len(jobs), total)
    per_seed: dict[int, dict[str, dict]] = {}
    for j in jobs:
        per_seed.setdefault(j["seed"], {}).update(j["per_subject"])
    per_subject, summary = aggregate_seeds(per_seed)
    config = {**asdict(cfg), "algorithm": cfg.method, "model": cfg.method}
    results = {
        "algorithm": cfg.method, "model": cfg.method, "config": config,
        "strategy": {"name": cfg.method, "n_components": cfg.n_components, "C": cfg.C, "ea": pre.ea,
                     "recentre": cfg.method == "riemann"},
        "summary": summary, "per_subject": per_subject, "per_seed": {str(k): v for k, v in per_seed.items()},
        "curve": [], "seconds": float(sum(j["seconds"] for j in jobs)),
        "data_hashes": {k: v for sd in data.values() for k, v in sd.file_hashes.items()},
        "checkpoints": [], "attack_budgets": attack_budgets([a for a, _ in cfg.attacks]), "versions": {"mne": mne.__version__, "sklearn": sklearn.__version__,
                                        "pyriemann": _pyriemann_version()},
    }
    atomic_write_bytes(out / "results.json", json.dumps(results, indent=1).encode())
    return results


def _pyriemann_version() -> str:
    import pyriemann

    return pyriemann.__version__


