"""Issue 19 table: per-profile held-out BCA of each condition, paired comparisons and the interaction test.

Run: python experiments/fleeg_table.py [DIR ...]   (default experiments/results/fleeg; e.g. also
     experiments/results/fleeg_proj or experiments/results/fleeg_proj_pilot, or experiments/results/fleeg_pilot;
     several folders are merged, the first with a condition wins)
Reads <dir>/<condition>/results.json (written by experiments/fleeg.txt or the pilot's fleeg_pilot.txt) and prints
markdown; conditions not (yet) run are left out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

PROFILES = ("lab64", "research21", "cyton_daisy16", "unicorn8")
CONDITIONS = {
    "a_hier_fedbs": "(a) hierarchical (FLEEG split, FedBS rule), own montages",
    "b_hier_fedbs_standardbn": "(b) = (a) with standard BN",
    "c_intersection": "(c) one federation on the channel intersection (C3, C4), FedBS",
    **{f"d_{p}_alone": f"(d) {p} group federated alone, FedBS" for p in PROFILES},
    **{f"e_{p}_ct": f"(e) {p} group, centralised training" for p in PROFILES},
    "f_onedevice_fedbs": "(f) one device (every subject through lab64), FedBS",
    "g_onedevice_fedbs_standardbn": "(g) = (f) with standard BN",
    # experiments/fleeg_proj.txt (results in experiments/results/fleeg_proj)
    "a_proj_hier_fedbs": "(a') channel map per profile (spline init) + shared EEGNet on 21 ch, FedBS",
    "b_proj_hier_fedbs_standardbn": "(b') = (a') with standard BN",
    "c2_interpolate_fixed": "(c2) one EEGNet federation on 21 ch, every device by the fixed spline map, FedBS",
}


def main(roots: list[Path]) -> None:
    """Conditions from every folder in ``roots`` (the first folder that has a condition wins)."""
    res = {}
    for root in roots:
        res.update({k: json.loads((root / k / "results.json").read_text()) for k in CONDITIONS
                    if k not in res and (root / k / "results.json").exists()})
    if not res:
        raise SystemExit(f"no results under {', '.join(map(str, roots))}")
    profiles = sorted({p for r in res.values() for p in r.get("per_profile", {})})
    print("| condition | " + " | ".join(profiles) + " | all held-out | wall s (loaded machine) |")
    print("|---|" + "---|" * (len(profiles) + 2))
    for k, r in res.items():
        pp = r.get("per_profile", {})
        cells = [f"{100 * pp[p]['bca']:.1f} (n={pp[p]['n']})" if p in pp else "-" for p in profiles]
        print(f"| {CONDITIONS[k]} | " + " | ".join(cells) +
              f" | {100 * r['summary']['bca']['mean']:.1f} ± {100 * r['summary']['bca']['std_subjects']:.1f} | "
              f"{r['seconds']:.0f} |")
    print()
    assign = next(iter(res.values()))["config"]["profiles"]

    def paired(a: str, b: str, profile: str | None) -> None:
        if a not in res or b not in res:
            return
        pa, pb = res[a]["per_subject"], res[b]["per_subject"]
        subs = sorted(s for s in set(pa) & set(pb) if profile is None or assign[str(int(s[1:]))] == profile)
        if len(subs) < 2:
            return
        x = np.array([pa[s]["bca"] for s in subs])
        y = np.array([pb[s]["bca"] for s in subs])
        t = stats.ttest_rel(x, y)
        print(f"- {a} vs {b}{' on ' + profile if profile else ''}: {100 * (x - y).mean():+.1f} points "
              f"(n={len(subs)} held-out subjects, paired t p={t.pvalue:.2f})")

    for p in profiles:
        for mixed in ("a_hier_fedbs", "a_proj_hier_fedbs", "c2_interpolate_fixed"):
            paired(mixed, f"d_{p}_alone", p)
            paired(mixed, "c_intersection", p)
    paired("a_hier_fedbs", "c_intersection", None)
    paired("a_hier_fedbs", "b_hier_fedbs_standardbn", None)
    paired("f_onedevice_fedbs", "g_onedevice_fedbs_standardbn", None)
    # target: the 8-channel profile in the mixed federation vs the 21-channel group alone (different subjects: unpaired)
    for mixed in ("a_hier_fedbs", "a_proj_hier_fedbs", "c2_interpolate_fixed"):
        if mixed in res and "d_research21_alone" in res:
            a8 = res[mixed].get("per_profile", {}).get("unicorn8")
            r21 = res["d_research21_alone"].get("per_profile", {}).get("research21")
            if a8 and r21:
                print(f"- unicorn8 in {mixed} {100 * a8['bca']:.1f} vs research21 alone {100 * r21['bca']:.1f}: "
                      f"{100 * (a8['bca'] - r21['bca']):+.1f} points (target: within 3)")
    # interaction: does the BN rule gain more under device heterogeneity ((a) - (b)) than on one device ((f) - (g))?
    keys = ("a_hier_fedbs", "b_hier_fedbs_standardbn", "f_onedevice_fedbs", "g_onedevice_fedbs_standardbn")
    if all(k in res for k in keys):
        ps = [res[k]["per_subject"] for k in keys]
        subs = sorted(set.intersection(*(set(p) for p in ps)))
        if len(subs) >= 2:
            mixed = np.array([ps[0][s]["bca"] - ps[1][s]["bca"] for s in subs])
            one = np.array([ps[2][s]["bca"] - ps[3][s]["bca"] for s in subs])
            t = stats.ttest_rel(mixed, one)
            print(f"- interaction (BN rule gain mixed devices minus one device): {100 * (mixed - one).mean():+.1f} "
                  f"points (mixed {100 * mixed.mean():+.1f}, one device {100 * one.mean():+.1f}; n={len(subs)} "
                  f"held-out subjects, paired t p={t.pvalue:.2f})")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or [Path("experiments/results/fleeg")])
