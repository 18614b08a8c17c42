"""Summary of the fed_classical study: accuracy vs epsilon of fed-csp-lda / fed-tangent beside DP-FedAvg.

Usage::

    python studies/fed_classical/table.py [RESULTS_ROOT]   # runs in RESULTS_ROOT/fed_classical/<run>/results.json
    python studies/fed_classical/table.py --pack RESULTS_ROOT  # also (re)write raw.jsonl.gz from those runs

Without RESULTS_ROOT the runs are read from the study's ``raw.jsonl.gz`` (one gzip'd JSON line per file:
``{"path": "fed_classical/<run>/...", "json": {...}}``). Writes ``summary.json`` and ``table.md`` beside this file.
DP-FedAvg's numbers are the committed runs of issue 17 (``dp/<run>/results.json`` in studies/byzantine_dp/raw.jsonl.gz: fold 0 of
the same split, 10 held-out subjects, one seed), read from the repository when present.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from neurofed.trainer.experiments.raw import RAW_NAME, pack, read

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
GROUP = "fed_classical"
PIPES = {"csp": "fed-csp-lda", "tan": "fed-tangent"}
EPS = (8, 4, 1)
DPFEDAVG = {"dp_clip_only": "clip only (no noise)", "dp_eps512": "eps 520", "dp_eps64": "eps 66", "dp_eps8": "eps 8",
            "dp_eps8_all10": "eps 8, every client, 10 rounds", "clean_all10": "no DP, every client, 10 rounds"}


def load_runs(root: Path | None) -> dict[str, dict]:
    """``{run: results.json}`` from a results root or from raw.jsonl.gz."""
    if root is not None:
        return {p.parent.name: json.loads(p.read_text()) for p in sorted((root / GROUP).glob("*/results.json"))}
    return {k.split("/")[1]: v for k, v in read(HERE / RAW_NAME).items()
            if k.count("/") == 2 and k.endswith("/results.json")}


def pack_group(root: Path) -> None:
    """Every JSON of the group's runs (config, results, jobs) into raw.jsonl.gz."""
    pack(root, HERE / RAW_NAME, prefixes=[GROUP])


def per_subject(res: dict) -> dict[str, float]:
    return {s: v["bca"] for s, v in res["per_subject"].items()}


#: issue 57 item 4's variants at epsilon 8, one run per (fold, noise seed) with the fold's own clips:
#: name -> (no-DP base run, what it is)
VARIANTS = {
    "csp_rulec": ("csp_nodp", "fed-csp-lda, first study's mechanism (counts weighted 0.3), clips: median rule"),
    "csp_rule": ("csp_nodp", "fed-csp-lda, public counts + EA mirror, clips: median rule"),
    "csp_nested": ("csp_nodp", "fed-csp-lda, public counts + EA mirror, clip quantiles and budget split: nested CV"),
    "tan_rule": ("tan_nodp", "fed-tangent, public counts, clips: median rule"),
}


def variant_rows(runs: dict[str, dict], summary: dict) -> list[str]:
    """The per-fold-clip variants (spec_rule.txt, spec_nested.txt) against their no-DP run, paired by subject."""
    out = ["", "Issue 57 item 4 (epsilon 8, delta 1e-5; clips chosen on each fold's training clients only: "
           "dp_clips.py, dp_nested.py; one run per fold and noise seed):", "",
           "| variant | epsilon | BCA % (46 subjects, mean over the noise seeds) | sd over subjects | seed means | "
           "vs no DP (points) | paired p (t / Wilcoxon) | within 5 points? |", "|---|---|---|---|---|---|---|---|"]
    summary.setdefault("variants_eps8", {})
    for name, (base_run, what) in VARIANTS.items():
        if base_run not in runs:
            continue
        per_seed = []
        eps = []
        for seed in range(10):
            merged: dict[str, float] = {}
            for k in range(5):
                r = runs.get(f"{name}_eps8_f{k}_s{seed}")
                if r is None:
                    break
                merged.update(per_subject(r))
                eps.append(r.get("privacy", {}).get("epsilon"))
            else:
                per_seed.append(merged)
        if not per_seed:
            continue
        base = per_subject(runs[base_run])
        subs = sorted(base)
        m = np.array([[d[s] for s in subs] for d in per_seed])
        b = np.array([base[s] for s in subs])
        subj = m.mean(0)
        delta = 100 * (subj.mean() - b.mean())
        pt, pw = stats.ttest_rel(subj, b).pvalue, stats.wilcoxon(subj, b).pvalue
        summary["variants_eps8"][name] = {"what": what, "bca": float(subj.mean()), "std_subjects": float(subj.std(ddof=1)),
                                          "per_seed": m.mean(1).tolist(), "no_dp": float(b.mean()),
                                          "delta_points": float(delta), "p_t": float(pt), "p_wilcoxon": float(pw),
                                          "epsilon_max": float(max(eps)), "seeds": len(per_seed)}
        out.append(f"| {name}: {what} | {max(eps):.2f} | {100 * subj.mean():.1f} | {100 * subj.std(ddof=1):.1f} | "
                   f"{' / '.join(f'{100 * v:.1f}' for v in m.mean(1))} | {delta:+.1f} | {pt:.2g} / {pw:.2g} | "
                   f"{'yes' if delta >= -5 else 'no'} |")
    return out


def main() -> None:
    args = sys.argv[1:]
    root = None
    if args and args[0] == "--pack":
        root = Path(args[1])
        pack_group(root)
    elif args:
        root = Path(args[0])
    runs = load_runs(root)
    rows, summary = [], {"pipelines": {}, "dpfedavg": {}}
    dp_raw = REPO / "studies/byzantine_dp/raw.jsonl.gz"
    dp = {k[len("dp/"):-len("/results.json")]: v for k, v in read(dp_raw).items()
          if k.startswith("dp/") and k.endswith("/results.json")} if dp_raw.exists() else {}
    fold0 = sorted(dp["dp_eps8"]["per_subject"]) if "dp_eps8" in dp else []
    for p, algo in PIPES.items():
        if f"{p}_nodp" not in runs:
            continue
        base = per_subject(runs[f"{p}_nodp"])
        subs = sorted(base)
        b = np.array([base[s] for s in subs])
        entry = {"no_dp": {"bca": float(b.mean()), "subjects": len(subs),
                           "fold0_bca": float(np.mean([base[s] for s in fold0])) if fold0 else None}}
        rows.append((algo, "no DP", "-", 100 * b.mean(), 100 * b.std(ddof=1), "", "", "",
                     100 * entry["no_dp"]["fold0_bca"] if fold0 else float("nan")))
        for eps in EPS:
            seeds = [runs[f"{p}_eps{eps}_s{s}"] for s in range(3) if f"{p}_eps{eps}_s{s}" in runs]
            if not seeds:
                continue
            ps = [per_subject(r) for r in seeds]
            m = np.array([[d[s] for s in subs] for d in ps])  # seeds x subjects
            subj = m.mean(0)
            seed_means = m.mean(1)
            t = stats.ttest_rel(subj, b)
            priv = seeds[0].get("privacy", {})
            entry[f"eps{eps}"] = {"bca": float(subj.mean()), "std_subjects": float(subj.std(ddof=1)),
                                  "std_seeds": float(seed_means.std()), "per_seed": seed_means.tolist(),
                                  "delta_points": float(100 * (subj.mean() - b.mean())), "paired_p": float(t.pvalue),
                                  "epsilon": priv.get("epsilon"), "noise_multiplier": priv.get("noise_multiplier"),
                                  "clip": priv.get("clip"), "clip_lda": priv.get("clip_lda"),
                                  "count_weight": priv.get("count_weight"), "seeds": len(seeds),
                                  "fold0_bca": float(np.mean([np.mean([d[s] for d in ps]) for s in fold0]))
                                  if fold0 else None}
            e = entry[f"eps{eps}"]
            rows.append((algo, f"{priv.get('epsilon', float('nan')):.2f}", f"{priv.get('noise_multiplier', 0):.3f}",
                         100 * e["bca"], 100 * e["std_subjects"], f"{100 * e['std_seeds']:.1f}",
                         f"{e['delta_points']:+.1f}", f"{e['paired_p']:.2g}",
                         100 * e["fold0_bca"] if fold0 else float("nan")))
        summary["pipelines"][algo] = entry
    lines = ["| pipeline | epsilon (delta 1e-5) | noise z | BCA % (46 subjects, mean of 3 noise seeds) | sd over "
             "subjects | sd of seed means | vs no DP (points) | paired p | fold 0 (10 subjects) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1f} | {r[4]:.1f} | {r[5]} | {r[6]} | {r[7]} | {r[8]:.1f} |")
    if dp:
        lines += ["", "DP-FedAvg (issue 17's committed runs, `dp/<run>` in studies/byzantine_dp/raw.jsonl.gz: FedAvg + EEGNet, clip 1.0, "
                  "fold 0 of the same split = the 10 subjects of the last column above, seed 0):", "",
                  "| DP-FedAvg run | epsilon (delta 1e-5) | BCA % (fold 0, 10 subjects) |", "|---|---|---|"]
        for run, what in DPFEDAVG.items():
            if run in dp:
                r = dp[run]
                eps = r.get("privacy", {}).get("epsilon")
                lines.append(f"| {run} ({what}) | {'-' if eps is None else f'{eps:.3g}'} | "
                             f"{100 * r['summary']['bca']['mean']:.1f} |")
                summary["dpfedavg"][run] = {"epsilon": eps, "bca_fold0": r["summary"]["bca"]["mean"],
                                            "source": f"studies/byzantine_dp/raw.jsonl.gz:dp/{run}/results.json"}
    lines += variant_rows(runs, summary)
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
