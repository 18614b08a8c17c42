"""Spread of honest clients' update norms per round (why 1.5 x the median is a safe default clip).

Run: python studies/update_norms/update_norms.py [ALGORITHM ...]
  no argument: 12 shared subjects, FedAvg, published protocol, all clients, 6 rounds -> studies/update_norms/update_norms.json;
  with algorithms: the 37 training subjects of fold 0 of the 46-subject 5-fold split, half the clients per round
  (as the Byzantine experiments), 6 rounds, per algorithm -> studies/update_norms/update_norms_algorithms.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from neurofed.trainer.data import PreprocessConfig, load_subjects
from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl.algorithms import robust
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.strategies import get_strategy

SUBJECTS = [1, 2, 3, 4, 5, 6, 7, 8, 24, 25, 26, 27]


def per_algorithm(algorithms: list[str], rounds: list[list[float]]) -> None:
    """Max / median honest update norm per round for each algorithm (the clip never binds below it)."""
    from neurofed.trainer.experiments.protocol import make_folds

    subjects = [*range(1, 20), *range(24, 51)]
    held_out = set(make_folds(subjects, "kfold:5", 0)[0])
    train = [s for s in subjects if s not in held_out]
    data = load_subjects(train, PreprocessConfig.from_preset("sensorimotor21", resample=80.0), None)
    out: dict = {"command": "python studies/update_norms/update_norms.py " + " ".join(algorithms),
                 "subjects": train, "fraction": 0.5, "rounds": 6, "algorithms": {}}
    for alg in algorithms:
        rounds.clear()
        run_federated({sd.subject: sd for sd in data}, "eegnet", get_strategy(alg, clip_mult=1e9),
                      LocalConfig(), 6, 0.5, 0)
        ratios = [float(max(n) / np.median(n)) for n in rounds]
        out["algorithms"][alg] = {"max_over_median_per_round": ratios, "max_over_median": max(ratios)}
        print(alg, f"max/median {max(ratios):.3f}", flush=True)
    Path("studies/update_norms/update_norms_algorithms.json").write_text(json.dumps(out, indent=1))


def main(algorithms: list[str] | None = None) -> None:
    torch.set_num_threads(1)
    rounds: list[list[float]] = []
    orig = robust.RobustStates._clipped

    def spy(self):  # record the norms the clipping rule sees
        rounds.append(robust.update_norms(self.states, self.old))
        return orig(self)

    robust.RobustStates._clipped = spy
    if algorithms:
        return per_algorithm(algorithms, rounds)
    data = load_subjects(SUBJECTS, PreprocessConfig.from_preset("sensorimotor21", resample=80.0), None)
    run_federated({sd.subject: sd for sd in data}, "eegnet", get_strategy("fedavg", clip_mult=1e9), LocalConfig(),
                  6, 1.0, 0)
    rows = [{"round": r, "median": float(np.median(n)), "max_over_median": float(max(n) / np.median(n)),
             "min_over_median": float(min(n) / np.median(n))} for r, n in enumerate(rounds)]
    out = {"subjects": SUBJECTS, "algorithm": "fedavg", "rounds": rows,
           "max_over_median": max(r["max_over_median"] for r in rows)}
    Path("studies/update_norms/update_norms.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
