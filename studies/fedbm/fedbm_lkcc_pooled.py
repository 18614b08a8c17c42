"""Diagnostic for the FedBM pilot: does the frozen concept classifier (LKCC) learn at all on pooled data?

One "client" holding the pooled trials of S001-S008 (i.e. centralised training through the federated
code path, fraction 1, one local epoch per round), tested on S009-S012; the same run with the plain
linear classifier (fedavg) for comparison. Seed 0.

Run: OMP_NUM_THREADS=1 nice -n 10 python studies/fedbm/fedbm_lkcc_pooled.py --out runs/studies/results/fedbm_pilot/lkcc_pooled.json
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import typer

from neurofed.trainer.data import PreprocessConfig, load_subjects
from neurofed.trainer.experiments.runner import EvalSpec, evaluate_subjects, run_federated
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.presets import get_preset


def main(out: Path = Path("runs/studies/results/fedbm_pilot/lkcc_pooled.json"), rounds: int = 20) -> None:
    """Pooled training with and without the LKCC head; writes per-subject BCA and the loss curves."""
    torch.set_num_threads(1)
    preset = get_preset("published")
    pre = PreprocessConfig.from_preset(preset.channels, resample=preset.resample, ea=True, fmin=8.0, fmax=30.0,
                                       tmin=0.0, tmax=4.0)
    train = load_subjects(list(range(1, 9)), pre)
    test = load_subjects(list(range(9, 13)), pre)
    pooled = replace(train[0], subject="pooled", X=np.concatenate([s.X for s in train]),
                     y=np.concatenate([s.y for s in train]))
    cfg = replace(LocalConfig(), local_epochs=1)
    result = {}
    for name, st in (("linear", get_strategy("fedavg")),
                     ("lkcc_t17.5", get_strategy("fedbm", fedbm_gen_every=0)),
                     ("lkcc_t50", get_strategy("fedbm", fedbm_gen_every=0, fedbm_temperature=50.0))):
        spec = EvalSpec(test=test, every=5)
        model, info = run_federated({"pooled": pooled}, "eegnet", st, cfg, rounds, 1.0, 0, spec)
        per = evaluate_subjects(model, spec)
        result[name] = {"bca": float(np.mean([r["bca"] for r in per.values()])), "per_subject": per,
                        "curve": info["curve"]}
        print(name, round(100 * result[name]["bca"], 1), [round(p["loss"], 3) for p in info["curve"]][-3:])
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
