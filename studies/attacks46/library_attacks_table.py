"""Table of the library-attack runs (studies/attacks46/library_attacks.py): BCA per attack, retention, SAFE vs FedAvg and CT+AT.

Run: python studies/attacks46/library_attacks_table.py [runs/studies/results/library_attacks] [--skip KEY] ...
(--skip hsj@0.05 leaves a column out, --skip safe:hsj@0.05 one run's cell, e.g. numbers from code since fixed.)
Prints a markdown table (mean ± std over the held-out subjects of fold 0, seed 0) and paired t-tests of SAFE vs
FedAvg and vs CT+AT (ct_at) per attack; also whether benign/FGSM/PGD equal the published fold-0 job (the wrapper check).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy import stats

from neurofed.trainer.experiments.raw import unpack_studies  # noqa: E402 - the committed raw results

LABELS = {"bca": "benign", "fgsm@0.03": "FGSM 0.03 (NeuroFed)", "pgd@0.03": "PGD-10 0.03 (NeuroFed)",
          "autoattack@0.03": "AutoAttack 0.03 (ART: APGD-CE + Square)", "square@0.05": "Square 0.05 (ART, 1000 q)",
          "hsj@0.05": "HopSkipJump 0.05 (ART, hard label)"}


def main(root: Path, skip: tuple[str, ...] = ()) -> None:
    labels = {k: v for k, v in LABELS.items() if k not in skip}

    def shown(run: str, key: str) -> bool:
        return f"{run}:{key}" not in skip
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(root.glob("*.json")) if not p.name.endswith(".job.json")}
    if not runs:
        raise SystemExit(f"no library-attack results under {root}")
    names = list(runs)
    print("| attack (eps x channel std) | " + " | ".join(f"{n} BCA % (retained)" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for key, label in labels.items():
        cells = []
        for n in names:
            ps = runs[n]["per_subject"]
            if not shown(n, key) or not all(key in row for row in ps.values()):
                cells.append("-")
                continue
            v = 100 * np.array([row[key] for row in ps.values()])
            benign = 100 * np.mean([row["bca"] for row in ps.values()])
            cells.append(f"{v.mean():.1f} ± {v.std(ddof=1):.1f}" + ("" if key == "bca" else f" ({v.mean() / benign:.0%})"))
        print(f"| {label} | " + " | ".join(cells) + " |")
    # per subject, the lowest BCA over the white-box attacks: an upper bound on the per-trial worst case
    white = ("fgsm@0.03", "pgd@0.03", "autoattack@0.03")
    cells = []
    for n in names:
        ps = runs[n]["per_subject"]
        v = 100 * np.array([min(row[k] for k in white if k in row) for row in ps.values()])
        benign = 100 * np.mean([row["bca"] for row in ps.values()])
        cells.append(f"{v.mean():.1f} ± {v.std(ddof=1):.1f} ({v.mean() / benign:.0%})")
    print("| lowest of the white-box attacks 0.03, per subject | " + " | ".join(cells) + " |")
    n_sub = {n: len(r["per_subject"]) for n, r in runs.items()}
    print(f"\nheld-out subjects (fold 0, seed 0): {n_sub}")
    for n, r in runs.items():
        pub = r.get("published_fold0", {})
        diff = [f"{s} {k} {100 * r['per_subject'][s][k]:.1f} vs {100 * v:.1f}" for s, row in pub.items()
                for k, v in row.items() if abs(r["per_subject"][s][k] - v) >= 1e-12]
        same = ("no published job to check against" if "published_fold0" not in r else
                "yes" if not diff else "all but " + ", ".join(diff) + " (this run vs published)")
        hs = r.get("hsj_stats")
        capped = f"; HopSkipJump stopped at its query budget on {hs['capped']} of {hs['attacked']} trials" if hs else ""
        print(f"- {n}: benign/FGSM/PGD equal the published fold-0 job: {same}; training {r['seconds']:.0f} s "
              f"(query budgets: attack_budgets in the JSON){capped}")
    for ref in ("fedavg", "ct_at"):
        if "safe" not in runs or ref not in runs:
            continue
        a, b = runs["safe"]["per_subject"], runs[ref]["per_subject"]
        subs = sorted(set(a) & set(b))
        for key, label in labels.items():
            if all(key in a[s] and key in b[s] for s in subs) and shown("safe", key) and shown(ref, key):
                x, y = np.array([a[s][key] for s in subs]), np.array([b[s][key] for s in subs])
                print(f"- SAFE - {ref}, {label}: {100 * (x - y).mean():+.1f} points "
                      f"(n={len(subs)}, paired t p={stats.ttest_rel(x, y).pvalue:.2g})")


if __name__ == "__main__":
    unpack_studies(['attacks46', 'table30'])  # the studies' raw.jsonl.gz -> runs/studies/results/ (kept files stay)
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path, nargs="?", default=Path("runs/studies/results/library_attacks"))
    ap.add_argument("--skip", action="append", default=[], help="KEY (a column) or RUN:KEY (one run's cell)")
    a = ap.parse_args()
    main(a.root, tuple(a.skip))
