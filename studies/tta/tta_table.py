"""Issue 57 lever 1 (test-time adaptation): the tables and summary.json, from the study's raw file.

Run: python studies/tta/tta_table.py [--raw studies/tta/raw.jsonl.gz] [--out studies/tta]
Reads ``<group>/<condition>/jobs/seedS_foldKK.json`` of every TTA group in the raw file (``tta_fedbs``,
``tta_safe``, ...), averages each subject's BCA over the seeds present, and pairs conditions by subject: paired
t-test and Wilcoxon signed-rank over subjects. Writes ``table.md`` and ``summary.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

from neurofed.trainer.experiments.raw import read

CONDS = ["protocol", "off_context", "off_adabn", "off_tent", "off_im", "off_ctxall", "off_adabn125", "off_im10",
         "on_context", "on_adabn", "on_tent", "on_im", "on_ctxall", "on_adabn125", "on_im10"]
LABELS = {
    "protocol": "table46 evaluation (offline EA, test batches of 8)",
    "off_context": "causal, context of 8 (offline EA)",
    "off_adabn": "adaptive BN (offline EA)",
    "off_tent": "adaptive BN + entropy min. (offline EA)",
    "off_im": "adaptive BN + entropy + diversity (offline EA)",
    "on_context": "causal, context of 8, online EA (the standalone graph's decoder)",
    "on_adabn": "adaptive BN (online EA)",
    "on_tent": "adaptive BN + entropy min. (online EA)",
    "on_im": "adaptive BN + entropy + diversity (online EA)",
    "off_ctxall": "secondary: causal, context = every window so far (offline EA)",
    "off_adabn125": "secondary: adaptive BN, momentum 0.125 (offline EA)",
    "on_ctxall": "secondary: causal, context = every window so far (online EA)",
    "on_adabn125": "secondary: adaptive BN, momentum 0.125 (online EA)",
    "off_im10": "secondary: adaptive BN + entropy + diversity, lr 1e-2 (offline EA)",
    "on_im10": "secondary: adaptive BN + entropy + diversity, lr 1e-2 (online EA)",
}
#: (condition, reference): the lever against what it adds to, then the costs of causality and online EA
PAIRS = [
    ("off_adabn", "off_context"), ("off_tent", "off_context"), ("off_im", "off_context"),
    ("off_tent", "off_adabn"), ("off_im", "off_adabn"),
    ("on_adabn", "on_context"), ("on_tent", "on_context"), ("on_im", "on_context"),
    ("on_tent", "on_adabn"), ("on_im", "on_adabn"),
    ("off_context", "protocol"), ("on_context", "off_context"),
    ("off_adabn", "protocol"), ("off_tent", "protocol"), ("off_im", "protocol"),
    ("off_ctxall", "off_context"), ("off_adabn125", "off_context"),
    ("on_ctxall", "on_context"), ("on_adabn125", "on_context"),
    ("off_im10", "off_adabn"), ("on_im10", "on_adabn"), ("off_im10", "off_context"), ("on_im10", "on_context"),
]


def per_subject(files: dict[str, dict], group: str, cond: str, seeds: set[int] | None) -> tuple[dict, dict]:
    """Subject -> BCA averaged over seeds; and the adaptation counters summed over jobs."""
    vals: dict[str, list[float]] = defaultdict(list)
    counters = {"updates": 0, "skipped": 0, "resets": 0, "windows": 0, "jobs": 0, "seeds": set()}
    for path, job in files.items():
        if not path.startswith(f"{group}/{cond}/jobs/") or (seeds is not None and job["seed"] not in seeds):
            continue
        counters["jobs"] += 1
        counters["seeds"].add(job["seed"])
        for s, row in job["per_subject"].items():
            vals[s].append(row["bca"])
        for st in job.get("tta_stats", {}).values():
            counters["updates"] += st["updates"]
            counters["skipped"] += st["skipped"]
            counters["resets"] += len(st["resets"])
            counters["windows"] += st["windows"]
    counters["seeds"] = sorted(counters["seeds"])
    return {s: float(np.mean(v)) for s, v in sorted(vals.items())}, counters


def compare(a: dict, b: dict) -> dict:
    subj = sorted(set(a) & set(b))
    x, y = np.array([a[s] for s in subj]), np.array([b[s] for s in subj])
    d = x - y
    nz = d[np.abs(d) > 1e-12]
    return {"n": len(subj), "delta": float(100 * d.mean()), "sd_delta": float(100 * d.std(ddof=1)),
            "p_t": float(stats.ttest_rel(x, y).pvalue) if np.abs(d).max() > 1e-12 else 1.0,
            "p_wilcoxon": float(stats.wilcoxon(nz).pvalue) if len(nz) else 1.0,
            "better": int((d > 1e-12).sum()), "worse": int((d < -1e-12).sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", type=Path, default=Path("studies/tta/raw.jsonl.gz"))
    ap.add_argument("--out", type=Path, default=Path("studies/tta"))
    args = ap.parse_args()
    files = read(args.raw)
    groups = sorted({p.split("/")[0] for p in files if p.split("/")[0].startswith("tta_") and "/jobs/" in p
                     and p.split("/")[1] in CONDS})
    summary: dict = {}
    lines = ["# Test-time adaptation (issue 57, lever 1): held-out BCA, 46 subjects", ""]
    for g in groups:
        all_seeds = sorted({j["seed"] for p, j in files.items() if p.startswith(f"{g}/protocol/jobs/")})
        for seeds in ([None, {0}] if len(all_seeds) > 1 else [None]):
            tag = g + ("" if seeds is None else "_seed0")
            ps = {c: per_subject(files, g, c, seeds) for c in CONDS}
            ps = {c: v for c, v in ps.items() if v[0]}
            used = ps["protocol"][1]["seeds"]
            summary[tag] = {"seeds": used, "conditions": {}, "pairs": []}
            lines += [f"## {g}, seeds {','.join(map(str, used))} (each subject's BCA averaged over seeds)", "",
                      "| condition | BCA % (mean ± sd over subjects) | SGD steps / windows | skipped | resets |",
                      "|---|---|---|---|---|"]
            for c, (vals, cnt) in ps.items():
                v = 100 * np.array(list(vals.values()))
                summary[tag]["conditions"][c] = {"bca": float(v.mean() / 100), "std_subjects": float(v.std() / 100),
                                                 "n_subjects": len(v), **cnt}
                steps = f"{cnt['updates']} / {cnt['windows']}" if c.endswith(("tent", "im", "im10")) else "-"
                lines.append(f"| {c}: {LABELS[c]} | {v.mean():.1f} ± {v.std():.1f} | {steps} | "
                             f"{cnt['skipped'] if c.endswith(('tent', 'im', 'im10')) else '-'} | "
                             f"{cnt['resets'] if c.endswith(('tent', 'im', 'im10')) else '-'} |")
            lines += ["", "| comparison (paired by subject) | Δ points | sd of Δ | p (t) | p (Wilcoxon) | better / worse |",
                      "|---|---|---|---|---|---|"]
            for a, b in PAIRS:
                if a in ps and b in ps:
                    r = compare(ps[a][0], ps[b][0])
                    summary[tag]["pairs"].append({"a": a, "b": b, **r})
                    lines.append(f"| {a} − {b} | {r['delta']:+.2f} | {r['sd_delta']:.2f} | {r['p_t']:.2g} | "
                                 f"{r['p_wilcoxon']:.2g} | {r['better']} / {r['worse']} |")
            lines.append("")
    # across models, seed 0 (paired by subject): does adapting a standard-BN model reach batch-specific BN?
    cross = [("tta_fedavg", "on_adabn", "tta_fedbs", "on_context"), ("tta_fedavg", "off_adabn", "tta_fedbs", "protocol"),
             ("tta_fedavg", "on_adabn", "tta_safe", "on_context"), ("tta_fedbs", "on_context", "tta_safe", "on_context")]
    rows = []
    for ga, a, gb, b in cross:
        if ga in groups and gb in groups:
            r = compare(per_subject(files, ga, a, {0})[0], per_subject(files, gb, b, {0})[0])
            summary.setdefault("cross_seed0", []).append({"a": f"{ga}/{a}", "b": f"{gb}/{b}", **r})
            rows.append(f"| {ga}/{a} − {gb}/{b} | {r['delta']:+.2f} | {r['sd_delta']:.2f} | {r['p_t']:.2g} | "
                        f"{r['p_wilcoxon']:.2g} | {r['better']} / {r['worse']} |")
    if rows:
        lines += ["## Across models, seed 0 (paired by subject)", "",
                  "| comparison | Δ points | sd of Δ | p (t) | p (Wilcoxon) | better / worse |",
                  "|---|---|---|---|---|---|", *rows, ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text("\n".join(lines))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
