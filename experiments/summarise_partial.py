"""Summarise the finished seeds of a grid that is still running (or was stopped), for `neurofed report`.

A run's results.json is written when all its (seed, fold) jobs are done; this writes OUT/<run>/results.json from
the jobs of the given seeds only, for each run under RESULTS whose jobs of those seeds are ALL finished (a run
with a missing fold is left out and named). Nothing under RESULTS is changed, so the grid resumes as before.

Run: python experiments/summarise_partial.py experiments/results/table46 /tmp/table46_seed0 --seeds 0
then: neurofed report /tmp/table46_seed0/* ... --seeds 0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from neurofed.trainer.experiments.protocol import make_folds
from neurofed.trainer.experiments.simulate import SimConfig, write_results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seeds", default="0")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    for run in sorted(p for p in a.results.iterdir() if (p / "config.json").is_file()):
        cfg = SimConfig(**json.loads((run / "config.json").read_text()))
        n_folds = len(cfg.folds) if cfg.folds else len(make_folds(cfg.subjects, cfg.protocol, cfg.fold_seed))
        jobs = [json.loads(p.read_text()) for p in sorted((run / "jobs").glob("*.json"))]
        jobs = [j for j in jobs if j["seed"] in seeds]
        if len(jobs) != n_folds * len(seeds):
            print(f"{run.name}: {len(jobs)} of {n_folds * len(seeds)} jobs of seeds {seeds} finished: left out")
            continue
        out = a.out / run.name
        out.mkdir(parents=True, exist_ok=True)
        write_results(dataclasses.replace(cfg, seeds=seeds), out, jobs)
        print(f"{run.name}: {len(jobs)} jobs -> {out / 'results.json'}")


if __name__ == "__main__":
    main()
