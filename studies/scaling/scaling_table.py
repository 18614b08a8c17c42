"""How the best deployable recipe's held-out BCA grows with the number of training subjects (study `scaling`).

Reads this study's raw file (``scaling/safe_r100_swa_k2``, ``_k3``: subject-wise 2- and 3-fold; ``_fs1``: the 5-fold
with fold seed 1), the levers study's ``levers/safe_r100_swa`` (5-fold) and table46's Riemannian tangent space (5-fold,
the best classical reference), fold seed 0 over the same 46 subjects; each run's seeds that finished every fold,
each subject's BCA averaged over them. Every subject is scored once per protocol, so the protocols pair by subject.
Writes ``table.md``, ``summary.json`` and ``scaling.png`` beside this file:

* each protocol's mean BCA (95 % t-interval over subjects) and mean number of training subjects per model;
* each other protocol against the 5-fold, paired by subject (t-test and Wilcoxon);
* a least-squares line BCA = a + b * log2(training subjects) through the protocol means, its slope's 95 % interval
  from a bootstrap over subjects (2,000 resamples, seed 0; it does not hold the fold draw's own variation), and
  where the line crosses 75 % -- an extrapolation beyond the measured range, reported as such.

Run from the repository root: ``python studies/scaling/scaling_table.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "studies" / "levers"))
from levers_table import jobs_of, pair_stats, per_subject  # noqa: E402 - the levers study's pairing, one place

from neurofed.trainer.report import mean_ci95  # noqa: E402

TARGET = 0.75
#: protocol label -> (raw file, group, run)
RUNS = {"2-fold": (HERE / "raw.jsonl.gz", "scaling", "safe_r100_swa_k2"),
        "3-fold": (HERE / "raw.jsonl.gz", "scaling", "safe_r100_swa_k3"),
        "5-fold": (REPO / "studies" / "levers" / "raw.jsonl.gz", "levers", "safe_r100_swa")}
#: the yardstick: the 5-fold with another fold draw (fold seed 1), against fold seed 0, both training seed 0
YARDSTICK = (HERE / "raw.jsonl.gz", "scaling", "safe_r100_swa_fs1")
REFERENCE = (REPO / "studies" / "table46" / "raw.jsonl.gz", "classical/s46", "riemann")


def protocol(raw: Path, group: str, run: str, only: tuple[int, ...] = ()) -> dict:
    """A run's jobs of every seed that finished all its folds: per-subject BCA (mean over those seeds), seeds,
    training subjects per job, folds, seconds."""
    jobs = jobs_of(raw, group).get(run, {})
    folds = {f for _, f in jobs}
    seeds = [s for s in sorted({s for s, _ in jobs}) if all((s, f) in jobs for f in folds) and (not only or s in only)]
    if not seeds:
        raise SystemExit(f"{raw}: no seed of {group}/{run} finished every fold (run the grid first: see spec.toml)")
    keys = [k for k in sorted(jobs) if k[0] in seeds]
    n_train = [len(jobs[k].get("participation", {})) for k in keys]  # the job's training clients
    by_seed = {s: float(np.mean(list(per_subject(jobs, [k for k in keys if k[0] == s], "bca").values())))
               for s in seeds}
    return {"bca": per_subject(jobs, keys, "bca"), "folds": len(folds), "seeds": seeds, "by_seed": by_seed,
            "train_subjects_mean": float(np.mean(n_train)),
            "seconds_mean": float(np.mean([jobs[k]["seconds"] for k in keys]))}


def fit(xs: np.ndarray, ys: np.ndarray) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b)."""
    b, a = np.polyfit(xs, ys, 1)
    return float(a), float(b)


def main() -> None:
    prots = {name: protocol(*where) for name, where in RUNS.items()}
    ref = protocol(*REFERENCE)
    subs = sorted(set.intersection(*(set(p["bca"]) for p in prots.values())))
    summary: dict = {"question": "held-out BCA of the best deployable recipe (levers/safe_r100_swa) against the number "
                                 "of training subjects per model", "subjects": len(subs),
                     "target": TARGET, "protocols": {}, "vs_5fold": {}}
    lines = ["| protocol | training subjects per model (mean) | folds | seeds | BCA % (95 % CI) | per seed | "
             "s per job |", "|---|---|---|---|---|---|---|"]
    for name, p in prots.items():
        m, lo, hi = mean_ci95(np.array([p["bca"][s] for s in subs]))
        summary["protocols"][name] = {"train_subjects_mean": p["train_subjects_mean"], "folds": p["folds"],
                                      "seeds": p["seeds"], "bca_by_seed": p["by_seed"], "bca": m, "ci95": [lo, hi],
                                      "seconds_mean": p["seconds_mean"]}
        per_seed = " / ".join(f"{100 * v:.1f}" for v in p["by_seed"].values())
        lines.append(f"| {name} | {p['train_subjects_mean']:.1f} | {p['folds']} | {','.join(map(str, p['seeds']))} | "
                     f"{100 * m:.1f} ({100 * lo:.1f} to {100 * hi:.1f}) | {per_seed} | {p['seconds_mean']:.0f} |")
    lines += ["", "Against the 5-fold (paired by subject; points):", "",
              "| protocol | delta (95 % CI) | better / worse | p (t / Wilcoxon) |", "|---|---|---|---|"]
    for name in (n for n in prots if n != "5-fold"):
        c = pair_stats(prots[name]["bca"], prots["5-fold"]["bca"])
        summary["vs_5fold"][name] = c
        lines.append(f"| {name} | {c['delta']:+.2f} ({c['ci'][0]:+.1f} to {c['ci'][1]:+.1f}) | {c['better']} / "
                     f"{c['worse']} | {c['p_t']:.2g} / {c['p_wilcoxon']:.2g} |")
    c = pair_stats(protocol(*YARDSTICK, only=(0,))["bca"], protocol(*RUNS["5-fold"], only=(0,))["bca"])
    summary["fold_draw"] = {"what": "5-fold, fold seed 1 against fold seed 0 (training seed 0 both)", **c}
    lines.append(f"| 5-fold, fold seed 1 (yardstick: another draw of the same size; seed 0 against seed 0) | "
                 f"{c['delta']:+.2f} ({c['ci'][0]:+.1f} to {c['ci'][1]:+.1f}) | {c['better']} / {c['worse']} | "
                 f"{c['p_t']:.2g} / {c['p_wilcoxon']:.2g} |")
    ref_c = pair_stats(prots["5-fold"]["bca"], ref["bca"])
    summary["five_fold_vs_riemann"] = ref_c

    # log-linear trend through the per-subject points, slope's bootstrap interval over subjects
    x = np.log2([prots[n]["train_subjects_mean"] for n in prots])
    y = np.array([[prots[n]["bca"][s] for n in prots] for s in subs])  # subjects x protocols
    a, b = fit(x, y.mean(axis=0))
    rng = np.random.default_rng(0)
    boots = np.array([fit(x, y[rng.integers(0, len(subs), len(subs))].mean(axis=0))[1] for _ in range(2000)])
    b_lo, b_hi = (float(q) for q in np.percentile(boots, [2.5, 97.5]))
    n75 = float(2 ** ((TARGET - a) / b)) if b > 0 else None
    summary["trend"] = {"model": "bca = a + b * log2(training subjects), least squares on the protocol means",
                        "a": a, "b_per_doubling": b, "b_ci95_bootstrap": [b_lo, b_hi],
                        "training_subjects_at_target": n75,
                        "note": "an extrapolation beyond the measured range of training subjects",
                        "measured_range": [float(2 ** x.min()), float(2 ** x.max())]}
    lines += ["", f"Trend (least squares on the {len(prots)} protocol means): BCA = {100 * a:.1f} + {100 * b:.2f} x "
                  f"log2(training subjects) %, i.e. {100 * b:+.2f} points per doubling (95 % bootstrap interval over "
                  f"subjects {100 * b_lo:+.2f} to {100 * b_hi:+.2f}); the line reaches {100 * TARGET:.0f} % at "
              + (f"{n75:.0f} training subjects (an extrapolation beyond the measured range)." if n75 else
                 "no number of subjects (the slope is not positive)."),
              "", f"5-fold against table46's Riemannian tangent space (seeds {','.join(map(str, ref['seeds']))}): "
                  f"{ref_c['delta']:+.2f} points, "
                  f"p {ref_c['p_t']:.2g}."]
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(prots, subs, a, b)
    print("\n".join(lines))


def plot(prots: dict, subs: list[str], a: float, b: float) -> None:
    """Left: each protocol's mean BCA, the trend and the target; right: each protocol against the 5-fold, paired by
    subject (95 % CI of the paired difference: the between-subject spread cancels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.6))
    xs = [prots[n]["train_subjects_mean"] for n in prots]
    five = np.array([prots["5-fold"]["bca"][s] for s in subs])
    for n, xv in zip(prots, xs):
        v = np.array([prots[n]["bca"][s] for s in subs])
        seeds = ",".join(map(str, prots[n]["seeds"]))
        ax.plot([xv], [100 * v.mean()], "o", color="C0")
        ax.annotate(f"{n} (seeds {seeds})", (xv, 100 * v.mean()), textcoords="offset points", xytext=(6, -12),
                    fontsize=7)
        if n != "5-fold":
            m, lo, hi = mean_ci95(v - five)
            bx.errorbar([xv], [100 * m], yerr=[[100 * (m - lo)], [100 * (hi - m)]], fmt="o", capsize=4, color="C0")
            bx.annotate(n, (xv, 100 * m), textcoords="offset points", xytext=(6, 4), fontsize=7)
    grid = np.linspace(min(xs), 110, 100)
    ax.plot(grid, 100 * (a + b * np.log2(grid)), "--", color="C1", label="log-linear trend (extrapolated)")
    ax.axhline(100 * TARGET, color="grey", lw=0.8, ls=":", label="issue 57's target")
    ax.set_ylabel("held-out BCA % (46 subjects)")
    ax.legend(fontsize=7, loc="lower right")
    bx.axhline(0, color="grey", lw=0.8)
    bx.set_ylabel("BCA points against the 5-fold (paired)")
    bx.plot([prots["5-fold"]["train_subjects_mean"]], [0], "s", color="grey")
    for axis in (ax, bx):
        axis.set_xscale("log", base=2)
        axis.set_xticks([round(x) for x in xs] + ([64] if axis is ax else []))
        axis.xaxis.set_major_formatter(ScalarFormatter())
        axis.xaxis.set_minor_formatter(plt.NullFormatter())
        axis.set_xlabel("training subjects per model")
    fig.tight_layout()
    fig.savefig(HERE / "scaling.png", dpi=110)


if __name__ == "__main__":
    main()
