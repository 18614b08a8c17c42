"""``neurofed ensemble``: the held-out BCA of an average of saved models, per fold, without training again.

One of the cheap answers to "what closes the gap to the classical references" (issue 21): runs trained with
``--save-models`` keep each (fold, seed) job's global model; for every fold, the ensemble averages the
softmax outputs of every member saved for that fold (all the given runs x the chosen seeds) on the fold's
held-out subjects, decoded in the runs' own test batches (batch-specific BN sees the deployment batch), and
takes the arg-max. All members of a fold must hold out the same subjects with the same preprocessing (the
k-fold split depends on the fold seed only, not the training seed); anything else is refused by name.

The result is a ``results.json`` that ``neurofed report`` reads like any run's (one "seed": the ensemble
is deterministic given its members), plus, per subject, the mean BCA of its members alone (``member_bca``),
so the gain of averaging is paired subject by subject.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments.jobs import fold_members, job_checkpoint
from neurofed.trainer.experiments.sweep import held_out_subjects, run_config

logger = logging.getLogger("neurofed.trainer")


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of logits (scipy's, numerically stable)."""
    from scipy.special import softmax as _softmax

    return _softmax(z, axis=1)


def ensemble_runs(runs: Sequence[str | os.PathLike], seeds: Sequence[int] | None = None,
                  on_fold: Callable[[int, int], None] | None = None, test_batch: int | None = None) -> dict:
    """Average the saved models of ``runs`` (jobs of ``seeds``, default all) fold by fold.

    ``test_batch`` overrides the runs' test batch (default: theirs, 8): with batch-specific BN a larger batch
    gives the BN layers more of the subject's unlabelled trials (a value >= the trials per subject: all of them,
    the information the Riemannian reference's per-subject re-centring uses).

    Returns
    -------
    dict
        ``per_subject`` (ensemble ``bca``, members' mean ``member_bca``, ``members``), ``summary`` and the
        ``neurofed report`` fields (``per_seed`` with the one key ``"0"``, ``algorithm``, ``config``...).

    Raises
    ------
    NeuroFedError
        A run without saved models, runs whose folds hold out different subjects or were batched differently,
        preprocessings that give different trials, no job of the chosen seeds.

    Members may read the trials through different preprocessings (e.g. 21 and 64 channels): each decodes the held-out
    subjects loaded with its own run's, and the trials must be the same ones.
    """
    from neurofed.trainer.checkpoint import load_checkpoint  # lazy: torch (loaded only when used)
    from neurofed.trainer.evaluate import bca, logits  # lazy: torch (loaded only when used)
    from neurofed.trainer.experiments.simulate import aggregate_seeds  # lazy: torch (loaded only when used)

    run_dirs = [Path(r) for r in runs]
    cfgs = [run_config(r) for r in run_dirs]
    view_of = {r: json.dumps(c.preprocess, sort_keys=True) for r, c in zip(run_dirs, cfgs)}  # run -> its trials' view
    cfg_of_view = {view_of[r]: c for r, c in zip(run_dirs, cfgs)}
    for r, c in zip(run_dirs[1:], cfgs[1:]):
        if c.test_batch != cfgs[0].test_batch or c.subjects != cfgs[0].subjects:
            raise NeuroFedError(f"{r}: its subjects or test batch differ from {run_dirs[0]}'s; an ensemble needs "
                                "members evaluated on the same subjects and batches")
    folds = fold_members(run_dirs, seeds)
    batch = int(test_batch or cfgs[0].test_batch)
    if batch < 1:
        raise NeuroFedError(f"test batch must be >= 1, got {batch}")
    per_subject: dict[str, dict] = {}
    members_used = []
    for n, fold in enumerate(sorted(folds), 1):
        members = folds[fold]
        # each member decodes the held-out trials through its own run's preprocessing (e.g. 21 and 64 channels); the
        # trials must be the same ones in every view
        views: dict[str, list] = {}
        for jp, job in members:
            key = view_of[jp.parents[1]]
            if key not in views:
                views[key] = held_out_subjects(cfg_of_view[key], job)
        test = next(iter(views.values()))
        for view in views.values():
            for a, b in zip(test, view):
                if a.subject != b.subject or not np.array_equal(a.y, b.y):
                    raise NeuroFedError(f"fold {fold}: {b.subject}'s trials differ between the members' "
                                        "preprocessings; an ensemble needs members evaluated on the same trials")
        probs = {sd.subject: [] for sd in test}
        for jp, job in members:
            model, _ = load_checkpoint(job_checkpoint(jp, job))
            members_used.append(str(jp))
            for sd in views[view_of[jp.parents[1]]]:
                probs[sd.subject].append(softmax(logits(model, sd.X, batch)))
        for sd in test:
            p = np.stack(probs[sd.subject])  # (members, trials, classes)
            per_subject[sd.subject] = {"bca": bca(sd.y, p.mean(0).argmax(1)),
                                       "member_bca": float(np.mean([bca(sd.y, m.argmax(1)) for m in p])),
                                       "members": len(p)}
        if on_fold:
            on_fold(n, len(folds))
    _, summary = aggregate_seeds({"0": {s: {k: r[k] for k in ("bca", "member_bca")} for s, r in per_subject.items()}})
    first = json.loads((run_dirs[0] / "results.json").read_text()) if (run_dirs[0] / "results.json").exists() else {}
    return {
        "algorithm": "ensemble(" + "+".join(r.name for r in run_dirs) + ")",
        "model": first.get("model", cfgs[0].model),
        "config": first.get("config", {}),
        "data_hashes": first.get("data_hashes", {}),
        "ensemble": {"runs": [str(r) for r in run_dirs], "seeds": None if seeds is None else list(seeds),
                     "members": members_used, "rule": "mean of softmax outputs, arg-max", "test_batch": batch},
        "summary": summary,
        "per_subject": per_subject,
        "per_seed": {"0": {s: {"bca": r["bca"]} for s, r in per_subject.items()}},
        "curve": [],
    }


__all__ = ["ensemble_runs", "fold_members", "softmax"]
