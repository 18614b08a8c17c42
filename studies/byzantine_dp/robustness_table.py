"""Markdown tables of the Byzantine-defence and DP pilots (issue 17) from their results.json files.

Run: python studies/byzantine_dp/robustness_table.py   (after `neurofed grid studies/byzantine_dp/spec.toml`, byzantine_folds.txt,
byzantine_frac.txt and dp.txt, each with --backend pool --workers 2)
Paired t-tests over the held-out subjects against the clean run (FedAvg, no attacker, no clipping); the five-fold
target check pairs each run with the clean run of the default configuration on all 46 held-out subjects.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import stats

from neurofed.trainer.experiments.raw import unpack_studies  # noqa: E402 - the committed raw results

ROOT = Path("runs/studies/results")  # unpacked from the studies' raw.jsonl.gz


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


DEFENCES = (("mean", "no defence"), ("clip15", "clip 1.5 x median (default)"), ("clip3", "clip 3 x median"), ("median", "median"),
            ("trim", "trimmed mean 0.2"), ("mkrum", "Multi-Krum f=7"))
ATTACKS = (("scale", "scale x10"), ("huge", "1000x weights"), ("signflip", "sign flip x4"),
           ("labelflip", "label flip"))


def folds_table() -> None:
    """The target check on folds 0-2: default configuration, clean vs 20 % scaled-update attackers."""
    ref = load("byzantine_folds", "clean_clip3")
    if ref is None:
        return
    n = len(ref["per_subject"])
    print()
    print(f"| run (folds 0-2, seed 0, FedAvg) | BCA % (mean ± sample std, {n} held-out subjects) | vs clean | paired p |")
    print("|---|---|---|---|")
    print(row("clean, clip 3 x median", ref, ref))
    print(row("20 % scale x10, clip 3 x median", load("byzantine_folds", "scale_clip3"), ref))
    print(row("clean, clip 1.5 x median (default)", load("byzantine_clip", "clean_clip15"), ref))
    print(row("20 % scale x10, clip 1.5 x median (default)", load("byzantine_clip", "scale_clip15"), ref))


def fraction_table(ref: dict) -> None:
    """10 % and 30 % attackers (fold 0, seed 0), every attack x defence, against the clean run."""
    if not (ROOT / "byzantine_frac").is_dir():
        return
    print()
    print("| attack, defence | 10 % attackers: BCA % | vs clean | p | 30 % attackers: BCA % | vs clean | p |")
    print("|---|---|---|---|---|---|---|")
    for atk, lab in ATTACKS:
        for d, dl in DEFENCES:
            cells = []
            for pc in (10, 30):
                r = row("", load("byzantine_frac", f"{atk}_{d}_p{pc}"), ref)
                cells.append(" | ".join(c.strip() for c in r.strip("|").split("|")[1:4]))
            if any(not c.startswith("not run yet") for c in cells):  # rows still queued are left out
                print(f"| {lab}, {dl} | " + " | ".join(cells) + " |")


def main() -> None:
    ref = load("byzantine", "clean")
    if ref is None:
        raise SystemExit("run studies/byzantine_dp/spec.toml first (its 'clean' run is the reference)")
    print(f"| run (20 % attackers, FedAvg) | BCA % (mean ± sample std, {len(ref['per_subject'])} held-out subjects) "
          "| vs clean | paired p |")
    print("|---|---|---|---|")
    print(row("clean (no attacker, no defence)", ref, ref))
    for d, lab in DEFENCES[1:]:
        print(row(f"clean, {lab}", load("byzantine", f"clean_{d}") or load("byzantine_clip", f"clean_{d}"), ref))
    for atk, lab in ATTACKS:
        for d, dl in DEFENCES:
            # clip 1.5 ran on folds 0-2 (byzantine_clip.txt): row() pairs its fold-0 subjects with the reference
            print(row(f"{lab}, {dl}", load("byzantine", f"{atk}_{d}") or load("byzantine_clip", f"{atk}_{d}"), ref))
    fraction_table(ref)
    folds_table()
    print()
    print("| DP-FedAvg run | BCA % | vs clean | paired p | epsilon (delta 1e-5) |")
    print("|---|---|---|---|---|")
    for name in ("dp_clip_only", "dp_eps512", "dp_eps64", "dp_eps8", "clean_all10", "dp_eps8_all10", "dp_eps8_all5"):
        r = load("dp", name)
        eps = ("" if r is None else " no DP |" if "privacy" not in r
               else f" {r['privacy'].get('epsilon', float('nan')):.3g} |")
        print(row(name, r, ref, eps))


if __name__ == "__main__":
    unpack_studies(['byzantine_dp'])  # the studies' raw.jsonl.gz -> runs/studies/results/ (kept files stay)
    main()
