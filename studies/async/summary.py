"""Summarise the async study's grids (studies/async/raw.jsonl.gz) into studies/async/summary.json.

* ``async46`` (fold 0, seed 0): per run, held-out BCA (mean over fold 0's 10 held-out subjects) at the end, the mean
  of the last three evaluations (rounds/aggregations 40, 45, 50: the final point alone moves by several points) and
  of the last six, per evaluated round/aggregation, the updates used, and the first evaluation reaching its
  synchronous run's final BCA minus 2 points (fedbs_async: fedbs_sync's; fedavg_*: fedavg_sync's) with the updates
  used until then, and the difference to that synchronous run; async runs add rejected stale, lost offline and the
  measured online fraction.
* ``asyncval46`` (fold 0's 36 training subjects split again: 28 clients, 8 validation subjects; the held-out
  subjects are not used): the same per run, each against its synchronous run on the same split (fedbs_async_* ->
  fedbs_sync, fedbs_nosam_async -> fedbs_nosam_sync, fedavg_async -> fedavg_sync).
* ``async46all`` (5 folds x the seeds run): each (seed, fold) async job paired with table46's committed synchronous
  job of the same algorithm, seed and fold (``studies/table46/raw.jsonl.gz``): mean BCA +- SE over the 46 subjects
  (each subject's BCA averaged over the seeds run) and over seeds, the paired difference async - sync over subjects
  (paired t and Wilcoxon signed-rank), over jobs (each job's mean of its last three evaluations), and per job the
  updates used until the first evaluation at or above the synchronous job's final BCA minus 2 points.

    python studies/async/summary.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from scipy import stats

from neurofed.trainer.experiments.raw import read, run_results
from neurofed.trainer.report import mean_ci95

HERE = Path(__file__).parent
TABLE46 = HERE.parent / "table46" / "raw.jsonl.gz"


def _per_update(r: dict) -> int:
    """Updates one round/aggregation uses: K (async) or the synchronous cohort (select_clients' floor)."""
    cfg = r["config"]
    if cfg.get("mode") == "async":
        return int(cfg["buffer_k"])
    n_train = len(cfg["subjects"]) - len(r["per_subject"])  # one fold's training clients
    return max(1, int(cfg["fraction"] * n_train + 1e-9))


def _run_row(r: dict, target: float) -> dict:
    """One single-job run (one fold, one seed): final BCA, last-3 and last-6 means, curve, updates to ``target``."""
    cfg = r["config"]
    is_async = cfg.get("mode") == "async"
    curve = r["curve"]
    per_update = _per_update(r)
    row = {"algorithm": r["algorithm"], "mode": cfg.get("mode", "sync"), "bca": r["summary"]["bca"]["mean"],
           "bca_last3": float(np.mean([p["bca"] for p in curve[-3:]])),
           "bca_last6": float(np.mean([p["bca"] for p in curve[-6:]])),
           "curve": [[p["round"], round(p["bca"], 4)] for p in curve]}
    if is_async:
        tot = r["async"]["total"]
        job = next(iter(r["async"]["per_job"].values()))
        row.update(updates_used=tot["updates_used"], rejected_stale=tot["rejected_stale"],
                   lost_offline=tot["lost_offline"], submitted=tot["submitted"],
                   online_fraction_measured=job["online_fraction_measured"], sim_time=job["sim_time"],
                   reveal=cfg["async_reveal"], buffer_k=per_update, max_staleness=cfg["max_staleness"],
                   server_lr=cfg["async_server_lr"])
    else:
        row.update(updates_used=per_update * cfg["rounds"])
    hit = next((p["round"] for p in curve if p["bca"] >= target), None)
    row["first_eval_within_2_points"] = hit
    row["updates_to_within_2_points"] = None if hit is None else hit * per_update
    return row


def _sync_of(name: str) -> str:
    """The synchronous run an async run is compared with: ``fedbs_async_lr05`` -> ``fedbs_sync``,
    ``fedbs_nosam_async`` -> ``fedbs_nosam_sync``."""
    return name.split("_async")[0] + "_sync" if "_async" in name else name


def single_job_grid(runs: dict[str, dict]) -> dict:
    """``async46`` / ``asyncval46``: every run against its synchronous run's final BCA minus 2 points, and its
    difference to that run (final, last 3, last 6 evaluations)."""
    out = {}
    for name, r in sorted(runs.items()):
        ref = runs[_sync_of(name)]
        row = _run_row(r, ref["summary"]["bca"]["mean"] - 0.02)
        sync = _run_row(ref, 0.0)
        row.update(reference=_sync_of(name), target_bca=ref["summary"]["bca"]["mean"] - 0.02,
                   diff_vs_reference={k: row[k] - sync[k] for k in ("bca", "bca_last3", "bca_last6")})
        out[name] = row
    return {"runs": out}


def _mean_se(x) -> dict:
    x = np.asarray(x, dtype=float)
    se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else None
    return {"mean": float(x.mean()), "se": se, "n": int(len(x))}


def _paired(a, b) -> dict:
    """async - sync, paired: mean, SE, 95 % t interval, paired t and Wilcoxon p."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    out = _mean_se(d)
    if len(d) > 1:
        _, lo, hi = mean_ci95(d)
        out.update(ci95=[lo, hi], p_t=float(stats.ttest_rel(a, b).pvalue),
                   p_wilcoxon=float(stats.wilcoxon(d).pvalue) if np.any(d != 0) else 1.0)
    return out


def paired_with_table46(raw: dict[str, dict], sync_raw: dict[str, dict], group: str,
                        reference: dict[str, str] | None = None) -> dict:
    """``async46all`` / ``async46v2``: each async run's jobs paired with table46's synchronous jobs of the same
    algorithm, seed and fold, or (``reference``: async run -> run prefix in ``sync_raw``) with another synchronous
    run's; synchronous runs of the group are references only."""
    out = {}
    names = sorted({p.split("/")[1] for p in raw if p.startswith(group + "/") and "/jobs/" in p})
    for name in names:
        cfg = raw[f"{group}/{name}/config.json"]
        if cfg.get("mode") != "async" or (reference is not None and name not in reference):
            continue
        alg = cfg["algorithm"]
        ref = (reference or {}).get(name, f"table46/{alg}")
        jobs = {p.rsplit("/", 1)[1]: j for p, j in raw.items() if p.startswith(f"{group}/{name}/jobs/")}
        pairs = []
        for fname, j in sorted(jobs.items()):
            if f"{ref}/jobs/{fname}" not in sync_raw:
                continue  # the reference has not run this (seed, fold)
            s = sync_raw[f"{ref}/jobs/{fname}"]
            if sorted(s["per_subject"]) != sorted(j["per_subject"]):
                raise ValueError(f"{name} {fname}: held-out subjects differ from table46's")
            pairs.append((j, s))
        seeds = sorted({j["seed"] for j, _ in pairs})
        folds = sorted({j["fold"] for j, _ in pairs})
        # per subject: BCA averaged over the seeds run (only (seed, fold) jobs present in the async run)
        subj_a: dict[str, list[float]] = {}
        subj_s: dict[str, list[float]] = {}
        per_job = []
        for j, s in pairs:
            for sub, v in j["per_subject"].items():
                subj_a.setdefault(sub, []).append(v["bca"])
                subj_s.setdefault(sub, []).append(s["per_subject"][sub]["bca"])
            ca, cs = j["curve"], s["curve"]
            target = float(np.mean([v["bca"] for v in s["per_subject"].values()])) - 0.02  # sync final - 2 points
            k = j["async"]["buffer_k"]
            n_sync = s["curve"][0]["participants"]  # the synchronous cohort per round (18)
            hit_a = next((p["round"] for p in ca if "bca" in p and p["bca"] >= target), None)
            hit_s = next((p["round"] for p in cs if "bca" in p and p["bca"] >= target), None)
            la = float(np.mean([p["bca"] for p in ca if "bca" in p][-3:]))
            ls = float(np.mean([p["bca"] for p in cs if "bca" in p][-3:]))
            per_job.append({"seed": j["seed"], "fold": j["fold"],
                            "async_bca": float(np.mean([v["bca"] for v in j["per_subject"].values()])),
                            "sync_bca": target + 0.02, "async_last3": la, "sync_last3": ls,
                            "target_bca": target,
                            "async_updates_to_target": None if hit_a is None else hit_a * k,
                            "sync_updates_to_target": None if hit_s is None else hit_s * n_sync,
                            "async_seconds": j["seconds"], "sync_seconds": s["seconds"],
                            "lost_offline": j["async"]["lost_offline"], "rejected_stale": j["async"]["rejected_stale"],
                            "max_staleness_seen": max(p["max_staleness"] for p in ca),
                            "mean_staleness": float(np.mean([p["mean_staleness"] for p in ca]))})
        subs = sorted(subj_a)
        a_sub = [float(np.mean(subj_a[s])) for s in subs]
        s_sub = [float(np.mean(subj_s[s])) for s in subs]
        seed_a = [float(np.mean([v["bca"] for j, _ in pairs if j["seed"] == sd for v in j["per_subject"].values()]))
                  for sd in seeds]
        seed_s = [float(np.mean([v["bca"] for j, s in pairs if j["seed"] == sd for v in s["per_subject"].values()]))
                  for sd in seeds]
        reached_a = [p["async_updates_to_target"] for p in per_job if p["async_updates_to_target"] is not None]
        reached_s = [p["sync_updates_to_target"] for p in per_job if p["sync_updates_to_target"] is not None]
        out[name] = {
            "algorithm": alg, "sync_reference": ref, "seeds": seeds, "folds": folds,
            "jobs": len(pairs), "subjects": len(subs),
            "config": {k: cfg[k] for k in ("buffer_k", "max_staleness", "online_fraction", "session_mean",
                                            "async_server_lr", "rounds")},
            "async_bca_subjects": _mean_se(a_sub), "sync_bca_subjects": _mean_se(s_sub),
            "diff_subjects": _paired(a_sub, s_sub),
            "async_bca_seeds": _mean_se(seed_a), "sync_bca_seeds": _mean_se(seed_s),
            "diff_jobs_last3": _paired([p["async_last3"] for p in per_job], [p["sync_last3"] for p in per_job]),
            "diff_jobs_final": _paired([p["async_bca"] for p in per_job], [p["sync_bca"] for p in per_job]),
            "updates_to_target": {
                "async_reached": len(reached_a), "sync_reached": len(reached_s), "jobs": len(per_job),
                "async_median": float(np.median(reached_a)) if reached_a else None,
                "sync_median": float(np.median(reached_s)) if reached_s else None,
                "async_mean": float(np.mean(reached_a)) if reached_a else None,
                "sync_mean": float(np.mean(reached_s)) if reached_s else None},
            "target_met": bool(np.mean(a_sub) - np.mean(s_sub) >= -0.02),
            "per_job": per_job,
        }
    return out


def main() -> None:
    raw = read(HERE / "raw.jsonl.gz")
    results = dict(run_results(HERE / "raw.jsonl.gz"))
    out: dict = {}
    for group in ("async46", "asyncval46"):
        runs = {p.split("/")[-1]: r for p, r in results.items() if p.startswith(group + "/")}
        if runs:
            out[group] = single_job_grid(runs)
    if any(p.startswith("async46all/") for p in raw):
        out["async46all"] = paired_with_table46(raw, read(TABLE46), "async46all")
    if any(p.startswith("async46v2/") for p in raw):  # the rule after the value-entries fix (2026-12-01)
        out["async46v2"] = paired_with_table46(raw, read(TABLE46), "async46v2")
        if any(p.startswith("async46v2/fedbs_nosam_sync/jobs/") for p in raw):  # like for like: no SAM either way
            out["async46v2_vs_nosam_sync"] = paired_with_table46(
                raw, raw, "async46v2", {"fedbs_nosam_async": "async46v2/fedbs_nosam_sync"})
    (HERE / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
    for group in ("async46", "asyncval46"):
        for name, row in out.get(group, {}).get("runs", {}).items():
            d = row["diff_vs_reference"]
            print(f"{group}/{name:22s} BCA {100 * row['bca']:.1f} (last 3 {100 * row['bca_last3']:.1f}, last 6 "
                  f"{100 * row['bca_last6']:.1f}; vs {row['reference']} {100 * d['bca']:+.1f} / "
                  f"{100 * d['bca_last3']:+.1f} / {100 * d['bca_last6']:+.1f})  updates {row['updates_used']}  to "
                  f"within 2 points of it: {row['updates_to_within_2_points']}")
    for name, r in [(f"{g}/{n}", r) for g in ("async46all", "async46v2", "async46v2_vs_nosam_sync")
                    for n, r in out.get(g, {}).items()]:
        d, u = r["diff_subjects"], r["updates_to_target"]
        print(f"{name}: {r['jobs']} jobs, {r['subjects']} subjects; async "
              f"{100 * r['async_bca_subjects']['mean']:.1f} +- {100 * r['async_bca_subjects']['se']:.1f}, sync "
              f"{100 * r['sync_bca_subjects']['mean']:.1f} +- {100 * r['sync_bca_subjects']['se']:.1f}; diff "
              f"{100 * d['mean']:+.1f} +- {100 * d['se']:.1f} (95 % CI {100 * d['ci95'][0]:+.1f}..{100 * d['ci95'][1]:+.1f},"
              f" p_t {d['p_t']:.3g}); last-3 diff over jobs {100 * r['diff_jobs_last3']['mean']:+.1f}; updates to "
              f"sync-2: async median {u['async_median']} ({u['async_reached']}/{u['jobs']}), sync median "
              f"{u['sync_median']} ({u['sync_reached']}/{u['jobs']}); target met: {r['target_met']}")


if __name__ == "__main__":
    main()
