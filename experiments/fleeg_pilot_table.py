"""Issue 19 pilot table: per-profile held-out BCA of each condition, and paired comparisons.

Run: python experiments/fleeg_pilot_table.py [experiments/results/fleeg_pilot]
Reads <dir>/<condition>/results.json (written by experiments/fleeg_pilot.txt) and prints markdown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

CONDITIONS = {
    "a_hier_fedbs": "(a) hierarchical (FLEEG split, FedBS rule), own montages",
    "b_hier_fedbs_standardbn": "(b) = (a) with standard BN",
    "c_intersection": "(c) one federation on the channel intersection (C3, C4), FedBS",
    "d_unicorn8_alone": "(d) unicorn8 group federated alone, FedBS",
}


def main(root: Path) -> None:
    res = {k: json.loads((root / k / "results.json").read_text()) for k in CONDITIONS if (root / k / "results.json").exists()}
    if not res:
        raise SystemExit(f"no results under {root}")
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

    paired("a_hier_fedbs", "d_unicorn8_alone", "unicorn8")
    paired("a_hier_fedbs", "c_intersection", None)
    paired("a_hier_fedbs", "b_hier_fedbs_standardbn", None)
    for p in profiles:
        paired("a_hier_fedbs", "c_intersection", p)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "experiments/results/fleeg_pilot"))
