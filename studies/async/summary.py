"""Summarise the async46 grid (studies/async/raw.jsonl.gz) into studies/async/summary.json.

Per run: held-out BCA (mean over fold 0's 10 held-out subjects) at the end, the mean of the last three evaluations
(rounds/aggregations 40, 45, 50: the final point alone moves by several points), per evaluated round/aggregation, the
updates used, and the first evaluation reaching the synchronous FedAvg run's final BCA minus 2 points with the
updates used until then; async runs add rejected stale, lost offline and the measured online fraction.

    python studies/async/summary.py
"""

from __future__ import annotations

import json
from pathlib import Path

from neurofed.trainer.experiments.raw import run_results

HERE = Path(__file__).parent


def main() -> None:
    runs = {p.split("/")[-1]: r for p, r in run_results(HERE / "raw.jsonl.gz")}
    target = runs["fedavg_sync"]["summary"]["bca"]["mean"] - 0.02
    out = {"target_bca": target, "runs": {}}
    for name, r in sorted(runs.items()):
        cfg = r["config"]
        is_async = cfg.get("mode") == "async"
        per_round = cfg["buffer_k"] if is_async else None
        curve = r["curve"]
        row = {"algorithm": r["algorithm"], "mode": cfg.get("mode", "sync"), "bca": r["summary"]["bca"]["mean"],
               "bca_last3": sum(p["bca"] for p in curve[-3:]) / len(curve[-3:]),  # evaluations 40, 45, 50
               "curve": [[p["round"], round(p["bca"], 4)] for p in curve]}
        if is_async:
            tot = r["async"]["total"]
            job = next(iter(r["async"]["per_job"].values()))
            row.update(updates_used=tot["updates_used"], rejected_stale=tot["rejected_stale"],
                       lost_offline=tot["lost_offline"], submitted=tot["submitted"],
                       online_fraction_measured=job["online_fraction_measured"], sim_time=job["sim_time"],
                       reveal=cfg["async_reveal"], buffer_k=per_round, max_staleness=cfg["max_staleness"])
            per_update = per_round
        else:
            n_train = len(cfg["subjects"]) - len(r["per_subject"])  # fold 0: 46 - 10 held out = 36 clients
            per_update = max(1, int(cfg["fraction"] * n_train + 1e-9))  # select_clients' floor: 18 per round
            row.update(updates_used=per_update * cfg["rounds"])
        hit = next((p["round"] for p in curve if p["bca"] >= target), None)
        row["first_eval_within_2_points"] = hit
        row["updates_to_within_2_points"] = None if hit is None else hit * per_update
        out["runs"][name] = row
    (HERE / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
    for name, row in out["runs"].items():
        print(f"{name:24s} BCA {100 * row['bca']:.1f} (last 3 evaluations {100 * row['bca_last3']:.1f})  updates {row['updates_used']}  "
              f"to within 2 points of sync FedAvg: {row['updates_to_within_2_points']}")


if __name__ == "__main__":
    main()
