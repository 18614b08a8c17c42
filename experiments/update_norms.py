"""Spread of honest clients' update norms per round (why 3 x the median is a safe default clip).

Run: python experiments/update_norms.py   (12 shared subjects, FedAvg, published protocol, all clients, 6 rounds)
Writes docs/bench/update_norms.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from trainer.data import PreprocessConfig, load_subjects
from trainer.experiments.runner import run_federated
from trainer.fl.algorithms import robust
from trainer.fl.local import LocalConfig
from trainer.fl.strategies import get_strategy

SUBJECTS = [1, 2, 3, 4, 5, 6, 7, 8, 24, 25, 26, 27]


def main() -> None:
    torch.set_num_threads(1)
    rounds: list[list[float]] = []
    orig = robust.RobustStates._clipped

    def spy(self):  # record the norms the clipping rule sees
        rounds.append(robust.update_norms(self.states, self.old))
        return orig(self)

    robust.RobustStates._clipped = spy
    data = load_subjects(SUBJECTS, PreprocessConfig.from_preset("sensorimotor21", resample=80.0), None)
    run_federated({sd.subject: sd for sd in data}, "eegnet", get_strategy("fedavg", clip_mult=1e9), LocalConfig(),
                  6, 1.0, 0)
    rows = [{"round": r, "median": float(np.median(n)), "max_over_median": float(max(n) / np.median(n)),
             "min_over_median": float(min(n) / np.median(n))} for r, n in enumerate(rounds)]
    out = {"subjects": SUBJECTS, "algorithm": "fedavg", "rounds": rows,
           "max_over_median": max(r["max_over_median"] for r in rows)}
    Path("docs/bench/update_norms.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
