"""What changed from the 30-subject to the 46-subject headline table (issue 16 item 5).

Per subject, BCA averaged over seeds 0-2 of each table's jobs (the 30-subject table also holds seeds 3-4; they are
left out so both sides have 3 seeds). The 30 original subjects are paired across the two tables (same subject,
held out in both; the 46-subject folds differ, and each fold trains on 37 instead of 24 subjects).

Run: python studies/table46/table46_compare.py   -> prints a markdown table, writes studies/table46/report/compare30.json
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import stats

from neurofed.trainer.experiments.raw import unpack_studies  # noqa: E402 - the committed raw results

ROOT = Path("runs/studies/results")  # unpacked from the studies' raw.jsonl.gz
OLD30 = [*range(1, 20), *range(24, 34), 42]
RUNS = ("ct", "fedavg", "fedbs", "safe")


def per_subject(run_dir: Path, seeds: tuple[int, ...] = (0, 1, 2)) -> dict[int, float]:
    """Mean held-out BCA per subject over ``seeds`` from a run's ``jobs/*.json``."""
    acc: dict[int, list[float]] = {}
    for f in sorted(run_dir.glob("jobs/seed*_fold*.json")):
        job = json.loads(f.read_text())
        if job["seed"] in seeds:
            for s, v in job["per_subject"].items():
                acc.setdefault(int(s.lstrip("S")), []).append(v["bca"])
    if {len(v) for v in acc.values()} != {len(seeds)}:
        raise SystemExit(f"{run_dir}: not every subject has {len(seeds)} seeds")
    return {s: float(np.mean(v)) for s, v in acc.items()}


def main() -> None:
    out: dict[str, dict] = {}
    print("| run | 30-table, 30 subjects | 46-table, all 46 | 46-table, the same 30 | paired diff (30) | p | "
          "46-table, the 16 new |")
    print("|---|---|---|---|---|---|---|")
    for r in RUNS:
        a, b = per_subject(ROOT / "table46" / r), per_subject(ROOT / "table" / r)
        o46 = np.array([a[s] for s in OLD30])
        o30 = np.array([b[s] for s in OLD30])
        new = np.array([v for s, v in a.items() if s not in OLD30])
        p = float(stats.ttest_rel(o46, o30).pvalue)
        out[r] = {"table30_mean": float(o30.mean()), "table46_mean": float(np.mean(list(a.values()))),
                  "table46_on_old30": float(o46.mean()), "diff_old30": float((o46 - o30).mean()), "p_old30": p,
                  "table46_on_new16": float(new.mean()), "n_new": int(new.size)}
        print(f"| {r} | {100 * o30.mean():.1f} | {100 * np.mean(list(a.values())):.1f} | {100 * o46.mean():.1f} | "
              f"{100 * (o46 - o30).mean():+.1f} | {p:.2g} | {100 * new.mean():.1f} |")
    dst = Path("studies/table46/report/compare30.json")
    dst.write_text(json.dumps({"command": "python studies/table46/table46_compare.py", "seeds": [0, 1, 2],
                               "subjects_old30": OLD30, "runs": out}, indent=1))


if __name__ == "__main__":
    unpack_studies(['table46', 'table30'])  # the studies' raw.jsonl.gz -> runs/studies/results/ (kept files stay)
    main()
