"""Summary of the study `levers`: each lever's run against table46's committed run of the same algorithm (FedBS,
SAFE or CT), paired by subject.

Usage::

    python studies/levers/levers_table.py        # reads studies/levers/raw.jsonl.gz and studies/table46/raw.jsonl.gz

For every run of the grid `levers` it pairs each finished (seed, fold) job with table46's job of the same algorithm,
seed and fold (the same held-out subjects); a subject's BCA is averaged over the seeds both runs have. The federated
classical runs (kept for the hybrid) have no table46 base and are left out here; the hybrid's rows come from
`neurofed ensemble` (studies/levers/README.md, "Hybrid"). Paired tests over the
46 subjects: t-test and Wilcoxon signed-rank (two-sided). Writes ``table.md``, ``summary.json`` and ``levers.png``
beside this file.

Three more comparisons (2026-12-07):

* a run that releases the server's weight average (``swa_decay``) also scored its last trained global model in every
  job (per-subject ``bca_global``): the average against it, paired inside the same jobs;
* a distilled run (``distill_from``) against its teacher run (the same seeds and folds), not only against table46,
  and a run of :data:`RECIPE_BASE` against the same recipe without its lever (e.g. without a teacher);
* every run against the best classical reference, table46's Riemannian tangent space (``classical/s46/riemann``,
  its seeds 0-2), the comparison issue 57's target names (>= 3 points, p < 0.05).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy import stats

from neurofed.trainer.experiments.raw import read
from neurofed.trainer.report import mean_ci95

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BASES = {"fedbs": "fedbs", "safe": "safe", "ct": "ct"}  # a lever run's algorithm -> its table46 base run
METRICS = ("bca", "fgsm@0.03", "pgd@0.03")
#: a run -> the same recipe without its lever (its fair base beside table46's): a distilled run's is the recipe trained
#: without a teacher; the window and cropped-decoding runs' is safe_r100_swa (safe_r200_swa at 200 rounds)
RECIPE_BASE = {"distill_safe_r100_swa": "safe_r100_swa", "distill_itnet_safe_r100_swa": "safe_r100_swa",
               "safe_r100_swa_t05_45": "safe_r100_swa", "safe_r100_swa_crop": "safe_r100_swa",
               "safe_r200_swa_crop": "safe_r200_swa", "safe_r100_swa_mirror": "safe_r100_swa",
               "safe_r100_swa_do25": "safe_r100_swa"}
REFERENCE = "riemann"  # the best classical reference of table46 (68.8 %): table46 raw, classical/s46/riemann
#: a job's path; a group may be nested (table46's ``classical/s46``)
JOB = re.compile(r"^(?P<group>.+)/(?P<run>[^/]+)/jobs/seed(?P<seed>\d+)_fold(?P<fold>\d+)\.json$")


@lru_cache(maxsize=None)
def entries(raw: Path) -> dict[str, dict]:
    """A raw file's entries, read once per process (several tables read the same files)."""
    return read(raw)


def jobs_of(raw: Path, group: str) -> dict[str, dict[tuple[int, int], dict]]:
    """``{run: {(seed, fold): job}}`` of a group in a raw file."""
    out: dict[str, dict[tuple[int, int], dict]] = {}
    for path, js in entries(raw).items():
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


def pair_stats(a: dict[str, float], b: dict[str, float]) -> dict:
    """``a`` against ``b`` over their common subjects (percent points): means, sd, delta, its 95 % CI (t), subjects
    better / worse, paired t and Wilcoxon p."""
    subs = sorted(set(a) & set(b))
    x, y = np.array([a[t] for t in subs]), np.array([b[t] for t in subs])
    d = x - y
    out = {"subjects": len(subs), "lever": 100 * float(x.mean()), "lever_sd": 100 * float(x.std(ddof=1)),
           "base": 100 * float(y.mean()), "base_sd": 100 * float(y.std(ddof=1)),
           "delta": 100 * float(d.mean()), "better": int((d > 0).sum()), "worse": int((d < 0).sum())}
    if len(subs) > 1 and np.any(d != 0):
        _, lo, hi = mean_ci95(d)
        out.update(ci=[100 * lo, 100 * hi],
                   p_t=float(stats.ttest_rel(x, y).pvalue), p_wilcoxon=float(stats.wilcoxon(x, y).pvalue))
    return out


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
        out[metric] = pair_stats(per_subject(run_jobs, keys, metric), per_subject(base_jobs, keys, metric))
    # per seed (each seed's 46 subjects, paired)
    out["per_seed"] = {}
    for s in sorted({s for s, _ in paired}):
        ks = [k for k in paired if k[0] == s]
        e = pair_stats(per_subject(run_jobs, ks, "bca"), per_subject(base_jobs, ks, "bca"))
        out["per_seed"][str(s)] = {"folds": sorted(f for t, f in ks if t == s), "lever": e["lever"],
                                   "base": e["base"], "delta": e["delta"], "subjects": e["subjects"],
                                   "p_t": e.get("p_t", 1.0)}
    out["keys"] = [list(k) for k in keys]
    return out


def against_jobs(run_jobs: dict, keys: list, other: dict, metric: str = "bca", other_metric: str = "bca") -> dict:
    """The run's subjects over ``keys`` against ``other``'s jobs of the same keys (``other_metric``)."""
    ks = [tuple(k) for k in keys if tuple(k) in other]
    out = pair_stats(per_subject(run_jobs, ks, metric), per_subject(other, ks, other_metric))
    out["seeds"], out["folds"] = sorted({s for s, _ in ks}), sorted({f for _, f in ks})
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
    if cfg.get("model", "eegnet") != "eegnet":
        out.append(f"--model {cfg['model']}")
    for k, v in sorted(cfg.get("strategy_overrides", {}).items()):  # e.g. --swa-decay, --server-momentum
        out.append(f"--{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}")
    if cfg.get("distill_from"):
        out.append(f"--distill-from {','.join(Path(r).name for r in cfg['distill_from'])}")
    if cfg.get("local", {}).get("augment"):
        out.append(f"--augment {cfg['local']['augment']}")
    ch = pre.get("channels")
    if ch is None or len(ch) != 21:  # None: every channel of the recording (64)
        out.append(f"--channels {'all' if ch is None or len(ch) == 64 else ','.join(ch)}")
    if (pre.get("fmin"), pre.get("fmax")) != (8.0, 30.0):
        out.append(f"--fmin {pre['fmin']:g} --fmax {pre['fmax']:g}")
    if (pre.get("tmin", 0.0), pre.get("tmax", 4.0)) != (0.0, 4.0):
        out.append(f"--tmin {pre['tmin']:g} --tmax {pre['tmax']:g}")
    if cfg.get("rounds") != 50:
        out.append(f"--rounds {cfg['rounds']}")
    return f"{cfg['algorithm']} " + " ".join(f"`{o}`" for o in out)


def reference_jobs() -> dict[tuple[int, int], dict]:
    """table46's best classical reference (:data:`REFERENCE`), its jobs by (seed, fold)."""
    return jobs_of(REPO / "studies/table46/raw.jsonl.gz", "classical/s46")[REFERENCE]


def fmt_p(e: dict) -> str:
    return f"{e['p_t']:.2g} / {e['p_wilcoxon']:.2g}" if "p_t" in e else "-"


def main() -> None:
    table46 = jobs_of(REPO / "studies/table46/raw.jsonl.gz", "table46")
    ref = reference_jobs()
    runs = jobs_of(HERE / "raw.jsonl.gz", "levers")
    configs = {p.split("/")[1]: js for p, js in entries(HERE / "raw.jsonl.gz").items()
               if p.startswith("levers/") and p.endswith("/config.json")}
    summary = {"base": "studies/table46/raw.jsonl.gz: table46/<the run's algorithm>",
               "reference": f"studies/table46/raw.jsonl.gz: classical/s46/{REFERENCE}", "runs": {}}
    lines = ["| run | lever (table46's protocol + ...) | seeds x folds | BCA % lever | BCA % base (table46, same "
             "algorithm) | delta (points) | better / worse subjects | p (t / Wilcoxon) | PGD 0.03 lever / base | "
             f"vs {REFERENCE} (delta, p t) | s per job (lever / base) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run, jobs in sorted(runs.items()):
        cfg = configs.get(run, {})
        if cfg.get("algorithm") not in BASES:
            continue  # the classical runs of the hybrid
        c = compare(jobs, table46[BASES[cfg["algorithm"]]])
        c["augment"] = cfg.get("local", {}).get("augment")
        c["lever"], c["base_run"] = describe(cfg), f"table46/{BASES[cfg['algorithm']]}"
        c["vs_reference"] = against_jobs(jobs, c["keys"], ref)
        if any("bca_global" in r for j in jobs.values() for r in j["per_subject"].values()):
            c["vs_trained_global"] = against_jobs(jobs, c["keys"], jobs, "bca", "bca_global")
        teachers = [Path(t).name for t in cfg.get("distill_from", [])]
        if teachers and all(t in runs for t in teachers):
            c["teachers"] = teachers
            c["vs_teacher"] = against_jobs(jobs, c["keys"], runs[teachers[0]])
        if run in RECIPE_BASE and RECIPE_BASE[run] in runs:
            c["recipe_base_run"] = RECIPE_BASE[run]
            c["vs_recipe_base"] = against_jobs(jobs, c["keys"], runs[RECIPE_BASE[run]])
        summary["runs"][run] = c
        e, g, r = c["bca"], c["pgd@0.03"], c["vs_reference"]
        lines.append(f"| {run} | {c['lever']} | {len(c['seeds'])} x {len(c['folds'])} | "
                     f"{e['lever']:.1f} ± {e['lever_sd']:.1f} | {e['base']:.1f} ± {e['base_sd']:.1f} | "
                     f"{e['delta']:+.2f} | {e['better']} / {e['worse']} | {fmt_p(e)} | {g['lever']:.1f} / {g['base']:.1f} | "
                     f"{r['delta']:+.2f}, {r.get('p_t', 1):.2g} | {c['seconds_mean']:.0f} / {c['base_seconds_mean']:.0f} |")
    lines += ["", "Per seed (BCA %, the held-out subjects of the folds finished, paired t):", "",
              "| lever | seed | folds | subjects | lever | base | delta | p |", "|---|---|---|---|---|---|---|---|"]
    for run, c in sorted(summary["runs"].items()):
        for s, e in c["per_seed"].items():
            lines.append(f"| {run} | {s} | {','.join(map(str, e['folds']))} | {e['subjects']} | {e['lever']:.1f} | "
                         f"{e['base']:.1f} | {e['delta']:+.2f} | {e['p_t']:.2g} |")
    inner = {r: c for r, c in summary["runs"].items() if "vs_trained_global" in c or "vs_teacher" in c
             or "vs_recipe_base" in c}
    if inner:
        lines += ["", "The weight average against the last trained global model of the same jobs, a distilled "
                  "run against its teacher run, and a run against the same recipe without its lever (same seeds and "
                  "folds; BCA %, paired by subject):", "",
                  "| run | comparison | seeds x folds | BCA % run | BCA % other | delta (points, 95 % CI) | "
                  "better / worse | p (t / Wilcoxon) |", "|---|---|---|---|---|---|---|---|"]
        for run, c in sorted(inner.items()):
            for key, what in (("vs_trained_global", "released average vs last global model"),
                              ("vs_teacher", f"student vs teacher run {', '.join(c.get('teachers', []))}"),
                              ("vs_recipe_base", f"vs the same recipe without the lever "
                                                 f"({c.get('recipe_base_run', '')})")):
                if key in c:
                    e = c[key]
                    ci = f" ({e['ci'][0]:+.1f} to {e['ci'][1]:+.1f})" if "ci" in e else ""
                    lines.append(f"| {run} | {what} | {len(e['seeds'])} x {len(e['folds'])} | {e['lever']:.1f} | "
                                 f"{e['base']:.1f} | {e['delta']:+.2f}{ci} | {e['better']} / {e['worse']} | "
                                 f"{fmt_p(e)} |")
    hybrid = hybrid_rows(entries(HERE / "raw.jsonl.gz"), runs)
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
    plot(summary, runs, table46)
    print("\n".join(lines))


def curve(jobs: dict, seeds: list[int], key: str = "bca") -> tuple[list[int], list[float]]:
    """Mean held-out BCA (%) per evaluated round over the jobs of ``seeds`` (weighted by held-out subjects)."""
    acc: dict[int, list[tuple[float, int]]] = {}
    for (s, _), j in jobs.items():
        if s in seeds:
            for pt in j["curve"]:
                if key in pt:
                    acc.setdefault(pt["round"], []).append((pt[key], len(j["test_subjects"])))
    full = max((len(v) for v in acc.values()), default=0)
    rounds = sorted(r for r, v in acc.items() if len(v) == full)
    return rounds, [100 * sum(b * n for b, n in acc[r]) / sum(n for _, n in acc[r]) for r in rounds]


def plot(summary: dict, runs: dict, table46: dict) -> None:
    """levers.png: each lever's paired gain over its table46 base with its 95 % CI (left; seeds x folds in the
    label), and the learning curves of SAFE at 50, 100 and 200 rounds (with and without the weight average), of
    EEG-ITNet and of the EEGNet distilled from it (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(summary["runs"].items(), key=lambda kv: kv[1]["bca"]["delta"])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 0.42 * len(rows) + 2.2), gridspec_kw={"width_ratios": [1.3, 1]})
    for i, (run, c) in enumerate(rows):
        e = c["bca"]
        lo, hi = e.get("ci", [e["delta"], e["delta"]])
        ax.plot([lo, hi], [i, i], color="0.4")
        ax.plot(e["delta"], i, "o", color="C2" if lo > 0 else ("C3" if hi < 0 else "C0"))
        ax.text(hi + 0.3, i, f"{e['lever']:.1f} %", va="center", fontsize=8)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(rows)), [f"{r} ({len(c['seeds'])}x{len(c['folds'])})" for r, c in rows], fontsize=8)
    ax.set_xlabel("held-out BCA gain over table46's run of the same algorithm (points, 95 % CI, paired by subject)")
    ax.set_title("levers, 46 subjects (seeds x folds)", fontsize=10)
    for name, jobs, key, style in (("SAFE, 50 rounds (table46)", table46["safe"], "bca", "C0--"),
                                   ("SAFE, 100 rounds", runs.get("safe_r100_swa", {}), "bca_global", "C0-"),
                                   ("SAFE, 100 rounds, weight average released", runs.get("safe_r100_swa", {}), "bca",
                                    "C1-"),
                                   ("SAFE, 200 rounds", runs.get("safe_r200_swa", {}), "bca_global", "C2-"),
                                   ("SAFE, EEG-ITNet, 50 rounds", runs.get("safe_itnet", {}), "bca", "C4--"),
                                   ("SAFE, 100 rounds, distilled from EEG-ITNet",
                                    runs.get("distill_itnet_safe_r100_swa", {}), "bca", "C4-")):
        seeds = sorted({s for s, _ in jobs})
        r, y = curve(jobs, seeds, key)
        if r:
            bx.plot(r, y, style, label=f"{name} (seeds {','.join(map(str, seeds))})")
    bx.axhline(68.8, color="0.5", ls=":", label="Riemannian tangent space (68.8 %)")
    bx.axhline(75, color="C3", ls=":", lw=0.8, label="issue 57 target (75 %)")
    bx.set_xlabel("round")
    bx.set_ylabel("mean held-out BCA % (46 subjects)")
    bx.set_title("learning curves", fontsize=10)
    bx.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(HERE / "levers.png", dpi=110)


if __name__ == "__main__":
    main()
