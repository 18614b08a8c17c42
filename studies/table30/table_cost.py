"""Compute cost of the published table: minutes of single-thread compute per run and seed, from the job JSONs.

Each job (one fold x one seed of one run) records its wall time; the queues run with one torch thread
per job, so the sum over one seed is the single-thread cost of that seed of the table.
Usage: python studies/table30/table_cost.py [runs/studies/results/table]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from neurofed.trainer.experiments.raw import unpack_studies  # noqa: E402 - the committed raw results


def main(root: Path) -> None:
    per_seed: dict[int, dict[str, float]] = defaultdict(dict)
    for run in sorted(p for p in root.iterdir() if (p / "jobs").is_dir()):
        for job in (run / "jobs").glob("seed*_fold*.json"):
            j = json.loads(job.read_text())
            per_seed[j["seed"]][run.name] = per_seed[j["seed"]].get(run.name, 0.0) + j["seconds"] / 60
    runs = sorted({r for s in per_seed.values() for r in s})
    print("| seed | " + " | ".join(runs) + " | total |")
    print("|---|" + "---|" * (len(runs) + 1))
    for seed in sorted(per_seed):
        row = per_seed[seed]
        cells = [f"{row[r]:.1f}" if r in row else "-" for r in runs]
        print(f"| {seed} | " + " | ".join(cells) + f" | {sum(row.values()):.0f} |")
    print("\nminutes of single-thread compute (sum of the five folds' job times)")


if __name__ == "__main__":
    unpack_studies(['table30'])  # the studies' raw.jsonl.gz -> runs/studies/results/ (kept files stay)
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/studies/results/table"))
