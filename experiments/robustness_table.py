"""Markdown tables of the Byzantine-defence and DP pilots (issue 17) from their results.json files.

Run: python experiments/robustness_table.py   (after bash experiments/queue.sh experiments/byzantine.txt / dp.txt)
Paired t-tests over the held-out subjects against the clean run (FedAvg, no attacker, no clipping).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parent / "results"


def load(group: str, name: str) -> dict | None:
    p = ROOT / group / name / "results.json"
    return json.loads(p.read_text()) if p.is_file() else None


def row(label: str, r: dict | None, ref: dict, extra: str = "") -> str:
    if r is None:
        return f"| {label} | not run yet | | |{extra}"
    subs = sorted(set(r["per_subject"]) & set(ref["per_subject"]))
    a = np.array([r["per_subject"][s]["bca"] for s in subs])
    b = np.array([ref["per_subject"][s]["bca"] for s in subs])
    p = stats.ttest_rel(a, b).pvalue if not np.allclose(a, b) else 1.0
    return f"| {label} | {100 * a.mean():.1f} ± {100 * a.std(ddof=1):.1f} | {100 * (a - b).mean():+.1f} | {p:.2g} |{extra}"


def main() -> None:
    ref = load("byzantine", "clean")
    if ref is None:
        raise SystemExit("run experiments/byzantine.txt first (its 'clean' run is the reference)")
    print("| run (20 % attackers, FedAvg) | BCA % (mean ± sample std, 9 held-out subjects) | vs clean | paired p |")
    print("|---|---|---|---|")
    print(row("clean (no attacker, no defence)", ref, ref))
    for d, lab in (("clip3", "clip 3 x median (default)"), ("median", "median"), ("trim", "trimmed mean 0.2"),
                   ("mkrum", "Multi-Krum f=7")):
        print(row(f"clean, {lab}", load("byzantine", f"clean_{d}"), ref))
    for atk, lab in (("scale", "scale x10"), ("huge", "1000x weights"), ("signflip", "sign flip x4"),
                     ("labelflip", "label flip")):
        for d, dl in (("mean", "no defence"), ("clip3", "clip 3 x median (default)"), ("median", "median"),
                      ("trim", "trimmed mean 0.2"), ("mkrum", "Multi-Krum f=7")):
            print(row(f"{lab}, {dl}", load("byzantine", f"{atk}_{d}"), ref))
    print()
    print("| DP-FedAvg run | BCA % | vs clean | paired p | epsilon (delta 1e-5) |")
    print("|---|---|---|---|---|")
    for name in ("dp_clip_only", "dp_eps512", "dp_eps64", "dp_eps8"):
        r = load("dp", name)
        eps = "" if r is None else f" {r.get('privacy', {}).get('epsilon', float('nan')):.3g} |"
        print(row(name, r, ref, eps))


if __name__ == "__main__":
    main()
