"""Summary of the study `levers`: each lever's run against table46's committed run of the same algorithm (FedBS,
SAFE or CT), paired by subject.

Usage::

    python studies/levers/levers_table.py        # reads studies/levers/raw.jsonl.gz and studies/table46/raw.jsonl.gz

For every run of the grid `levers` it pairs each finished (seed, fold) job with table46's job of the same algorithm,
seed and fold (the same held-out subjects); a subject's BCA is averaged over the seeds both runs have. The federated
classical runs (kept for the hybrid) have no table46 base and are left out here; the hybrid's rows come from
`neurofed ensemble` (studies/levers/README.md, "Hybrid"). Paired tests over the
46 subjects: t-test and Wilcoxon signed-rank (two-sided). Writes ``table.md`` and ``summary.json`` beside this file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from scipy import stats

from neurofed.trainer.experiments.raw import read

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BASES = {"fedbs": "fedbs", "safe": "safe", "ct": "ct"}  # a lever run's algorithm -> its table46 base run
METRICS = ("bca", "fgsm@0.03", "pgd@0.03")
JOB = re.compile(r"^(?P<group>[^/]+)/(?P<run>[^/]+)/jobs/seed(?P<seed>\d+)_fold(?P<fold>\d+)\.json$")


def jobs_of(raw: Path, group: str) -> dict[str, dict[tuple[int, int], dict]]:
    """``{run: {(seed, fold): job}}`` of a group in a raw file."""
    out: dict[str, dict[tuple[int, int], dict]] = {}
    for path, js in read(raw).items():
        m = JOB.match(path)
        if m and m["group"] == group:
            out.setdefault(m["run"], {})[(int(m["seed"]), int(m["fold"]))] = js
    return out


def per_subject(jobs: dict[tuple[int, int], dict], keys: list[tuple[int, int]], metric: str) -> dict[str, float]:
    """Each subject's metric averaged over the seeds of ``keys``."""
    acc: dict[str, list[float]] = {}
    for k in keys:
        for s, r in jobs[k]["per_subject"].items():
            acc.setdefault(s, []).append(r[metric])
    return {s: float(np.mean(v)) for s, v in acc.items()}


def compare(run_jobs: dict, base_jobs: dict) -> dict:
    """The lever's run against the base on the seeds it finished for every fold (a seed with folds missing appears
    only in the per-seed rows, on its finished folds' subjects)."""
    paired = sorted(k for k in run_jobs if k in base_jobs)
    all_folds = sorted({f for _, f in base_jobs})
    complete = [s for s in sorted({s for s, _ in paired}) if all((s, f) in run_jobs for f in all_folds)]
    keys = [k for k in paired if k[0] in complete] or paired
    seeds = sorted({s for s, _ in keys})
    folds = sorted({f for _, f in keys})
    out: dict = {"seeds": seeds, "folds": folds, "jobs": len(keys),
                 "seconds_mean": float(np.mean([run_jobs[k]["seconds"] for k in keys])),
                 "base_seconds_mean": float(np.mean([base_jobs[k]["seconds"] for k in keys]))}
    for metric in METRICS:
        a, b = per_subject(run_jobs, keys, metric), per_subject(base_jobs, keys, metric)
        subs = sorted(a)
        x, y = np.array([a[s] for s in subs]), np.array([b[s] for s in subs])
        d = x - y
        entry = {"subjects": len(subs), "lever": 100 * float(x.mean()), "lever_sd": 100 * float(x.std(ddof=1)),
                 "base": 100 * float(y.mean()), "base_sd": 100 * float(y.std(ddof=1)),
                 "delta": 100 * float(d.mean()), "better": int((d > 0).sum()), "worse": int((d < 0).sum())}
        if len(subs) > 1 and np.any(d != 0):
            entry["p_t"] = float(stats.ttest_rel(x, y).pvalue)
            entry["p_wilcoxon"] = float(stats.wilcoxon(x, y).pvalue)
        out[metric] = entry
    # per seed (each seed's 46 subjects, paired)
    out["per_seed"] = {}
    for s in sorted({s for s, _ in paired}):
        ks = [k for k in paired if k[0] == s]
        a, b = per_subject(run_jobs, ks, "bca"), per_subject(base_jobs, ks, "bca")
        subs = sorted(a)
        x, y = np.array([a[t] for t in subs]), np.array([b[t] for t in subs])
        out["per_seed"][str(s)] = {"folds": sorted(f for t, f in ks if t == s),
                                   "lever": 100 * float(x.mean()), "base": 100 * float(y.mean()),
                                   "delta": 100 * float((x - y).mean()), "subjects": len(subs),
                                   "p_t": float(stats.ttest_rel(x, y).pvalue)}
    return out


def hybrid_rows(raw: dict, runs: dict[str, dict]) -> dict:
    """Each ``hybrid/NAME/results.json`` (a `neurofed ensemble` of lever runs) against each of its member runs alone,
    paired by subject (each member run's per-subject BCA over the same seeds' jobs)."""
    out = {}
    for path, res in sorted(raw.items()):
        parts = path.split("/")
        if len(parts) != 3 or parts[0] != "hybrid" or parts[2] != "results.json":
            continue
        members = [Path(r).name for r in res["ensemble"]["runs"]]
        hyb = {sub: r["bca"] for sub, r in res["per_subject"].items()}
        subs = sorted(hyb)
        row = {"members": members, "subjects": len(subs), "bca": 100 * float(np.mean([hyb[t] for t in subs])),
               "vs": {}}
        for m in members:
            jobs = runs[m]
            keys = sorted(jobs)
            alone = per_subject(jobs, keys, "bca")
            x, y = np.array([hyb[t] for t in subs]), np.array([alone[t] for t in subs])
            d = x - y
            row["vs"][m] = {"member": 100 * float(y.mean()), "delta": 100 * float(d.mean()),
                            "better": int((d > 0).sum()), "worse": int((d < 0).sum()),
                            "p_t": float(stats.ttest_rel(x, y).pvalue), "p_wilcoxon": float(stats.wilcoxon(x, y).pvalue)}
        out[parts[1]] = row
    return out


def describe(cfg: dict) -> str:
    """What a run adds to table46's protocol, as simulate options."""
    pre, out = cfg.get("preprocess", {}), []
    if cfg.get("local", {}).get("augment"):
        out.append(f"--augment {cfg['local']['augment']}")
    ch = pre.get("channels")
    if ch is None or len(ch) != 21:  # None: every channel of the recording (64)
        out.append(f"--channels {'all' if ch is None or len(ch) == 64 else ','.join(ch)}")
    if (pre.get("fmin"), pre.get("fmax")) != (8.0, 30.0):
        out.append(f"--fmin {pre['fmin']:g} --fmax {pre['fmax']:g}")
    if cfg.get("rounds") != 50:
        out.append(f"--rounds {cfg['rounds']}")
    return f"{cfg['algorithm']} " + " ".join(f"`{o}`" for o in out)


def main() -> None:
    table46 = jobs_of(REPO / "studies/table46/raw.jsonl.gz", "table46")
    runs = jobs_of(HERE / "raw.jsonl.gz", "levers")
    configs = {p.split("/")[1]: js for p, js in read(HERE / "raw.jsonl.gz").items()
               if p.startswith("levers/") and p.endswith("/config.json")}
    summary = {"base": "studies/table46/raw.jsonl.gz: table46/<the run's algorithm>", "runs": {}}
    lines = ["| run | lever (table46's protocol + ...) | seeds x folds | BCA % lever | BCA % base (table46, same "
             "algorithm) | delta (points) | better / worse subjects | p (t / Wilcoxon) | PGD 0.03 lever / base | "
             "s per job (lever / base) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for run, jobs in sorted(runs.items()):
        cfg = configs.get(run, {})
        if cfg.get("algorithm") not in BASES:
            continue  # the classical runs of the hybrid
        c = compare(jobs, table46[BASES[cfg["algorithm"]]])
        c["augment"] = cfg.get("local", {}).get("augment")
        c["lever"], c["base_run"] = describe(cfg), f"table46/{BASES[cfg['algorithm']]}"
        summary["runs"][run] = c
        e, g = c["bca"], c["pgd@0.03"]
        p = f"{e['p_t']:.2g} / {e['p_wilcoxon']:.2g}" if "p_t" in e else "-"
        lines.append(f"| {run} | {c['lever']} | {len(c['seeds'])} x {len(c['folds'])} | "
                     f"{e['lever']:.1f} ± {e['lever_sd']:.1f} | {e['base']:.1f} ± {e['base_sd']:.1f} | "
                     f"{e['delta']:+.2f} | {e['better']} / {e['worse']} | {p} | {g['lever']:.1f} / {g['base']:.1f} | "
                     f"{c['seconds_mean']:.0f} / {c['base_seconds_mean']:.0f} |")
    lines += ["", "Per seed (BCA %, the held-out subjects of the folds finished, paired t):", "",
              "| lever | seed | folds | subjects | lever | base | delta | p |", "|---|---|---|---|---|---|---|---|"]
    for run, c in sorted(summary["runs"].items()):
        for s, e in c["per_seed"].items():
            lines.append(f"| {run} | {s} | {','.join(map(str, e['folds']))} | {e['subjects']} | {e['lever']:.1f} | "
                         f"{e['base']:.1f} | {e['delta']:+.2f} | {e['p_t']:.2g} |")
    hybrid = hybrid_rows(read(HERE / "raw.jsonl.gz"), runs)
    if hybrid:
        summary["hybrid"] = hybrid
        lines += ["", "Hybrid (`neurofed ensemble`: the mean of the members' softmax outputs, one fold's members "
                  "each; BCA %, 46 subjects, paired by subject):", "",
                  "| hybrid | members | BCA % hybrid | vs member | member BCA % | delta (points) | better / worse | "
                  "p (t / Wilcoxon) |", "|---|---|---|---|---|---|---|---|"]
        for name, h in hybrid.items():
            for m, e in h["vs"].items():
                lines.append(f"| {name} | {' + '.join(h['members'])} | {h['bca']:.1f} | {m} | {e['member']:.1f} | "
                             f"{e['delta']:+.2f} | {e['better']} / {e['worse']} | {e['p_t']:.2g} / "
                             f"{e['p_wilcoxon']:.2g} |")
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
