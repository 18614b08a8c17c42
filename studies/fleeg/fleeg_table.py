"""Issue 19 table: per-profile held-out BCA of each condition, paired comparisons and the interaction test.

Run: python studies/fleeg/fleeg_table.py [DIR ...] [--plot PNG]   (default runs/studies/results/fleeg; e.g. also
     runs/studies/results/fleeg_proj or runs/studies/results/fleeg_proj_pilot, or runs/studies/results/fleeg_pilot;
     several folders are merged, the first with a condition wins)
Reads <dir>/<condition>/results.json (written by studies/fleeg/spec.toml or the pilot's fleeg_pilot.txt) and prints
markdown; conditions not (yet) run are left out. Per-subject BCA is the mean over the run's seeds (paired tests run
on those); "± s" after a per-profile cell is the standard deviation of that profile's seed means (the spread a
re-run with another seed gives). With --plot, a bar chart of the per-profile BCA (error bars: that spread).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from neurofed.trainer.experiments.raw import unpack_studies  # noqa: E402 - the committed raw results
from neurofed.trainer.report import paired_comparison

PROFILES = ("lab64", "research21", "cyton_daisy16", "unicorn8")
CONDITIONS = {
    "a_hier_fedbs": "(a) hierarchical (FLEEG split, FedBS rule), own montages",
    "b_hier_fedbs_standardbn": "(b) = (a) with standard BN",
    "c_intersection": "(c) one federation on the channel intersection (C3, C4), FedBS",
    **{f"d_{p}_alone": f"(d) {p} group federated alone, FedBS" for p in PROFILES},
    **{f"e_{p}_ct": f"(e) {p} group, centralised training" for p in PROFILES},
    "f_onedevice_fedbs": "(f) one device (every subject through lab64), FedBS",
    "g_onedevice_fedbs_standardbn": "(g) = (f) with standard BN",
    # studies/fleeg/spec.toml (results in runs/studies/results/fleeg_proj)
    "a_proj_hier_fedbs": "(a') channel map per profile (spline init) + shared EEGNet on 21 ch, FedBS",
    "b_proj_hier_fedbs_standardbn": "(b') = (a') with standard BN",
    "c2_interpolate_fixed": "(c2) one EEGNet federation on 21 ch, every device by the fixed spline map, FedBS",
    "c3_fixmap_hier_fedbs": "(c3) = (c2) as a deployable model (fleeg_fixmap_eegnet: the map frozen inside it)",
}


def seed_means(r: dict, profile: str) -> list[float]:
    """One profile's mean held-out BCA on each seed of a condition, in seed order."""
    assign = r["config"]["profiles"]
    per_seed = r.get("per_seed", {})
    return [float(np.mean([row["bca"] for s, row in per_seed[seed].items() if assign[str(int(s[1:]))] == profile]))
            for seed in sorted(per_seed, key=int)]


def seed_spread(r: dict, profile: str) -> float:
    """Standard deviation over seeds of one profile's mean held-out BCA (0 with one seed)."""
    means = [m for m in seed_means(r, profile) if np.isfinite(m)]
    return float(np.std(means)) if len(means) > 1 else 0.0


def plot(res: dict, profiles: list[str], path: Path) -> None:
    """Grouped bars: per-profile held-out BCA of each condition, error bars the spread over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(k: str) -> str:
        return "(d) the group alone" if k.startswith("d_") else "(e) the group, CT" if k.startswith("e_") else \
            CONDITIONS[k].split(")")[0] + ")"

    names = list(dict.fromkeys(series(k) for k in CONDITIONS if k in res))
    colours = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(11, 4.8))
    width, labelled = 0.08, set()
    for j, p in enumerate(profiles):
        here = [k for k in CONDITIONS if k in res and p in res[k].get("per_profile", {})]
        for i, k in enumerate(here):
            n = series(k)
            n_seeds = len(res[k].get("per_seed", {})) or 1
            ax.bar(j + (i - (len(here) - 1) / 2) * width, 100 * res[k]["per_profile"][p]["bca"], width,
                   yerr=100 * seed_spread(res[k], p), capsize=2, color=colours[n],
                   label=None if n in labelled else f"{n} ({n_seeds} seed{'s' if n_seeds > 1 else ''})")
            labelled.add(n)
    ax.axhline(50, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(profiles)), profiles)
    ax.set_ylabel("held-out BCA (%)")
    ax.set_ylim(40, 85)
    ax.set_title("Mixed devices (issue 19): per-profile BCA of held-out subjects, 46 EEGMMIDB subjects, 5 folds")
    ax.legend(ncol=4, fontsize=7, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"\nplot: {path}")


def main(roots: list[Path], plot_path: Path | None = None) -> None:
    """Conditions from every folder in ``roots`` (the first folder that has a condition wins)."""
    res = {}
    for root in roots:
        res.update({k: json.loads((root / k / "results.json").read_text()) for k in CONDITIONS
                    if k not in res and (root / k / "results.json").exists()})
    if not res:
        raise SystemExit(f"no results under {', '.join(map(str, roots))}")
    profiles = sorted({p for r in res.values() for p in r.get("per_profile", {})})
    print("| condition | seeds | " + " | ".join(profiles) + " | all held-out (± std over subjects; ± over seeds) "
          "| CPU s |")
    print("|---|---|" + "---|" * (len(profiles) + 2))
    for k in [k for k in CONDITIONS if k in res]:
        r = res[k]
        pp = r.get("per_profile", {})
        n_seeds = len(r.get("per_seed", {})) or 1
        cells = [f"{100 * pp[p]['bca']:.1f}" + (f" ± {100 * seed_spread(r, p):.1f}" if n_seeds > 1 else "")
                 + f" (n={pp[p]['n']})" if p in pp else "-" for p in profiles]
        bca = r["summary"]["bca"]
        print(f"| {CONDITIONS[k]} | {n_seeds} | " + " | ".join(cells) +
              f" | {100 * bca['mean']:.1f} ± {100 * bca['std_subjects']:.1f}"
              + (f"; ± {100 * bca['std_seeds']:.1f}" if n_seeds > 1 else "") + f" | {r['seconds']:.0f} |")
    print()
    assign = next(iter(res.values()))["config"]["profiles"]

    def paired(a: str, b: str, profile: str | None) -> None:
        if a not in res or b not in res:
            return
        pa, pb = res[a]["per_subject"], res[b]["per_subject"]
        subs = sorted(s for s in set(pa) & set(pb) if profile is None or assign[str(int(s[1:]))] == profile)
        c = paired_comparison({s: pa[s]["bca"] for s in subs}, {s: pb[s]["bca"] for s in subs}, min_n=2)
        if c is None:
            return
        print(f"- {a} vs {b}{' on ' + profile if profile else ''}: {100 * c['diff']:+.1f} points "
              f"(n={c['n']} held-out subjects, paired t p={c['t_p']:.2g}, Wilcoxon p={c['wilcoxon_p']:.2g}; "
              f"better on {c['higher']} of {c['n']})")

    for p in profiles:
        for mixed in ("a_hier_fedbs", "a_proj_hier_fedbs", "c2_interpolate_fixed", "c3_fixmap_hier_fedbs"):
            paired(mixed, f"d_{p}_alone", p)
            paired(mixed, "c_intersection", p)
    # the 8-channel target seed by seed
    for k in ("a_proj_hier_fedbs", "c2_interpolate_fixed", "d_unicorn8_alone"):
        if k in res and len(res[k].get("per_seed", {})) > 1:
            print(f"- unicorn8 held-out BCA per seed, {k}: "
                  + " / ".join(f"{100 * m:.1f}" for m in seed_means(res[k], "unicorn8")))
    paired("a_hier_fedbs", "c_intersection", None)
    paired("a_hier_fedbs", "b_hier_fedbs_standardbn", None)
    paired("a_proj_hier_fedbs", "b_proj_hier_fedbs_standardbn", None)
    paired("c2_interpolate_fixed", "a_proj_hier_fedbs", None)
    paired("c3_fixmap_hier_fedbs", "c2_interpolate_fixed", None)
    paired("c2_interpolate_fixed", "f_onedevice_fedbs", None)  # mixed devices vs everyone on the 64-channel cap
    paired("f_onedevice_fedbs", "g_onedevice_fedbs_standardbn", None)
    # target: the 8-channel profile in the mixed federation vs the 21-channel group alone (different subjects: unpaired)
    for mixed in ("a_hier_fedbs", "a_proj_hier_fedbs", "c2_interpolate_fixed", "c3_fixmap_hier_fedbs"):
        if mixed in res and "d_research21_alone" in res:
            a8 = res[mixed].get("per_profile", {}).get("unicorn8")
            r21 = res["d_research21_alone"].get("per_profile", {}).get("research21")
            if a8 and r21:
                x = [v["bca"] for s, v in res[mixed]["per_subject"].items() if assign[str(int(s[1:]))] == "unicorn8"]
                y = [v["bca"] for s, v in res["d_research21_alone"]["per_subject"].items()
                     if assign[str(int(s[1:]))] == "research21"]
                t = stats.ttest_ind(x, y, equal_var=False)
                print(f"- unicorn8 in {mixed} {100 * a8['bca']:.1f} vs research21 alone {100 * r21['bca']:.1f}: "
                      f"{100 * (a8['bca'] - r21['bca']):+.1f} points (different subjects: Welch t p={t.pvalue:.2g}; "
                      f"target: within 3)")
    # interaction: does the BN rule gain more under device heterogeneity ((a) - (b)) than on one device ((f) - (g))?
    for keys in (("a_hier_fedbs", "b_hier_fedbs_standardbn", "f_onedevice_fedbs", "g_onedevice_fedbs_standardbn"),
                 ("a_proj_hier_fedbs", "b_proj_hier_fedbs_standardbn", "f_onedevice_fedbs",
                  "g_onedevice_fedbs_standardbn")):
        if not all(k in res for k in keys):
            continue
        ps = [res[k]["per_subject"] for k in keys]
        subs = sorted(set.intersection(*(set(p) for p in ps)))
        if len(subs) >= 2:
            mixed = np.array([ps[0][s]["bca"] - ps[1][s]["bca"] for s in subs])
            one = np.array([ps[2][s]["bca"] - ps[3][s]["bca"] for s in subs])
            t = stats.ttest_rel(mixed, one)
            print(f"- interaction (BN rule gain mixed devices minus one device; mixed = {keys[0]} - {keys[1]}): "
                  f"{100 * (mixed - one).mean():+.1f} points (mixed {100 * mixed.mean():+.1f}, one device "
                  f"{100 * one.mean():+.1f}; n={len(subs)} held-out subjects, paired t p={t.pvalue:.2g})")
    if plot_path is not None:
        plot(res, profiles, plot_path)


if __name__ == "__main__":
    unpack_studies(['fleeg'])  # the studies' raw.jsonl.gz -> runs/studies/results/ (kept files stay)
    args = sys.argv[1:]
    out = None
    if "--plot" in args:
        i = args.index("--plot")
        out = Path(args[i + 1])
        del args[i:i + 2]
    main([Path(a) for a in args] or [Path("runs/studies/results/fleeg")], out)
