"""Clips for client-level DP chosen by a fixed rule from each fold's TRAINING clients (no held-out subject read).

Rule (fixed before any measurement): in each fold and round, the clip is the median L2 norm of the training
clients' statistics vectors, as :meth:`neurofed.trainer.models.classical.StatisticsModel.local_fit` forms them under
the run's DP options (centred sums; counts weighted or public; EA's class mirror). The LDA round's vectors depend
on round 1's result: its norms are taken under the round-1 model fitted WITHOUT noise from the same training
clients. Half the clients are then clipped in each round (the target quantile of adaptive clipping, Andrew et al.,
NeurIPS 2021). The median is read from the training clients' private statistics without being accounted for (a
leak like any tuning on private data; a DP quantile estimate would spend a little of the budget); no test subject
is involved, unlike the first study's clips (tuned on folds 0-1, held-out subjects included).

Usage::

    python studies/fed_classical/dp_clips.py            # -> dp_clips.json and spec_rule.txt beside this file
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from neurofed.trainer.data import PreprocessConfig, load_subjects
from neurofed.trainer.data.eegmmidb import parse_subjects
from neurofed.trainer.experiments.protocol import make_folds
from neurofed.trainer.experiments.spec import parse_options
from neurofed.trainer.models.classical import STATISTICS_MODELS, DPSpec, solve_state

HERE = Path(__file__).resolve().parent
SUBJECTS = "1-19,24-50"
PROTOCOL = "kfold:5"
#: the variants: pipeline -> (algorithm, count weight (0 = public counts), EA mirror)
VARIANTS = {
    "csp_rule": ("fed-csp-lda", "csp_lda", 0.0, True),     # public counts + EA mirror (both new options)
    "csp_rulec": ("fed-csp-lda", "csp_lda", 0.3, False),   # the first study's mechanism, only the clips by the rule
    "tan_rule": ("fed-tangent", "tangent_lda", 0.0, False),  # public counts (no mirror for the tangent space)
}
EPSILONS = (8,)
SEEDS = (0, 1, 2)


def fold_clips(kind: str, count_weight: float, ea_sum: bool, clients) -> tuple[float, float]:
    """Median norm of round 1, and of the LDA round under the noise-free round-1 fit, over ``clients``."""
    n1, n2 = fold_norms(kind, count_weight, ea_sum, clients)
    return float(np.median(n1)), float(np.median(n2))


def fold_norms(kind: str, count_weight: float, ea_sum: bool, clients) -> tuple[np.ndarray, np.ndarray]:
    """The clients' statistics-vector norms in round 1, and in the LDA round under the noise-free round-1 fit."""
    sd0 = clients[0]
    model = STATISTICS_MODELS[kind](sd0.X.shape[1], 2, sd0.X.shape[2], 80.0)
    settings = {"classical_dp_clip": 1e30, "classical_dp_count_weight": count_weight, "dp_seed": 0,
                "classical_dp_ea_sum": ea_sum}
    dp_off = DPSpec()
    # round 1: the norms, then the noise-free pooled fit (the ordinary weighted mean of the states x trials)
    norms1, states, ns = [], [], []
    for sd in clients:
        met = model.local_fit(sd.X, sd.y, settings)
        norms1.append(met["stat_norm"])
        states.append({k: v.clone() for k, v in model.state_dict().items()})
        ns.append(len(sd.X))
    n = float(sum(ns))
    mean = {k: sum(s[k].to(torch.float64) * w for s, w in zip(states, ns)) / n for k in states[0]
            if states[0][k].is_floating_point()}
    old = {k: v.clone() for k, v in model.state_dict().items()}
    for k in old:
        if k.startswith("stat_"):
            old[k] = torch.zeros_like(old[k])
    new = solve_state(model, old, {**old, **mean}, n, dp_off, 0, 0.5 if kind == "tangent_lda" else 0.0)
    model.load_state_dict(new)
    norms2 = [model.local_fit(sd.X, sd.y, settings)["stat_norm"] for sd in clients]
    return np.asarray(norms1), np.asarray(norms2)


def main() -> None:
    cfg = parse_options({"algorithm": "fed-csp-lda", "subjects": SUBJECTS, "protocol": PROTOCOL}).to_sim_config()
    pre = PreprocessConfig.from_dict(cfg.preprocess)
    subjects = parse_subjects(SUBJECTS, None)
    data = {int(sd.subject[1:]): sd for sd in load_subjects(subjects, pre, None)}
    folds = make_folds(subjects, PROTOCOL, 0)
    clips: dict[str, dict] = {}
    lines = ["# Issue 57, item 4: fed_classical's DP at epsilon 8 with clips set by a rule on each fold's TRAINING",
             "# clients (median norm per round; dp_clips.py wrote this file and dp_clips.json) and the new options:",
             "# csp_rule: public counts (--classical-dp-count-weight 0) + EA mirror (--classical-dp-ea-sum);",
             "# csp_rulec: the first study's mechanism (count weight 0.3, both classes noised), clips by the rule;",
             "# tan_rule: fed-tangent with public counts. One run per (variant, fold, noise seed).",
             "# Run: neurofed grid studies/fed_classical/spec_rule.txt --group fed_classical "
             "--results runs/studies/results --backend pool"]
    for name, (algo, kind, cw, ea) in VARIANTS.items():
        clips[name] = {}
        for k, test in enumerate(folds):
            train = [data[s] for s in subjects if s not in test]
            c1, c2 = fold_clips(kind, cw, ea, train)
            clips[name][str(k)] = {"clip": c1, "clip_lda": c2, "train_clients": len(train)}
            for eps in EPSILONS:
                for s in SEEDS:
                    lines.append(f"{name}_eps{eps}_f{k}_s{s}  --algorithm {algo} --protocol {PROTOCOL} --folds {k} "
                                 f"--seeds {s} --dp-seed {s} --classical-dp-clip {c1:.4g} --classical-dp-clip-lda "
                                 f"{c2:.4g} --classical-dp-count-weight {cw:g}"
                                 + (" --classical-dp-ea-sum" if ea else "") + f" --classical-dp-epsilon {eps}")
            print(name, k, f"{c1:.4g}", f"{c2:.4g}")
    (HERE / "dp_clips.json").write_text(json.dumps({"rule": "median of the training clients' statistics-vector norms "
                                                            "per fold and round (LDA round: under the noise-free "
                                                            "round-1 fit)", "clips": clips}, indent=1) + "\n")
    (HERE / "spec_rule.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
