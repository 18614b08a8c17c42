"""SAFE's Table VII shape on 46 subjects: every combination of LBSN / FAT / AWP x benign / white-box / black-box.

Run (after `neurofed grid studies/tablevii46/spec.toml` and `neurofed sweep` of its runs, see that spec):
    python studies/tablevii46/tablevii46_table.py [--seeds 0,1,2] [--out studies/tablevii46/table]

Reads each row's per-job sweep files (`sweep/seedS_foldKK.json`, written by `neurofed sweep`; per subject the mean
over --seeds, every seed needing all five folds) for the benign and white-box columns, and the black-box column (Square 0.05 on the exported graph, `studies/attacks46/blackbox46_onnx.sh`)
from `onnx_attack/square_0.05/seedS_foldKK.json` where a row has it, on the seeds it has (said in the table). The
rows "none" (= FedAvg) and "SAFE" are sweep46's fedavg and safe runs; their black-box results are blackbox46's (the
same models: blackbox46's jobs equal sweep46's subject by subject); a last row, CT+AT (baselines46's centralised FGSM
adversarial training), is a reference, not a combination. Paired t-tests over subjects against "none" and against
SAFE (neurofed.trainer.report.paired_comparison), and the pairs in :data:`PAIRS` listed under the table (Square on the seeds
both rows were attacked on). Writes OUT/table.md and OUT/summary.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "attacks46"))
from blackbox46_table import load  # noqa: E402 - studies/attacks46/blackbox46_table.py

from neurofed.trainer.experiments.raw import unpack_studies  # noqa: E402 - the committed raw results
from neurofed.trainer.experiments.simulate import aggregate_seeds
from neurofed.trainer.report import paired_comparison

R = Path("runs/studies/results")
# label, trained run (sweep/), black-box run (onnx_attack/), LBSN, FAT, AWP
ROWS = [
    ("none (FedAvg)", R / "sweep46/fedavg", R / "blackbox46/fedavg", False, False, False),
    ("LBSN", R / "tablevii46/lbsn", R / "tablevii46/lbsn", True, False, False),
    ("FAT", R / "tablevii46/fat", R / "tablevii46/fat", False, True, False),
    ("AWP", R / "tablevii46/awp", R / "tablevii46/awp", False, False, True),
    ("LBSN+FAT", R / "tablevii46/lbsn_fat", R / "tablevii46/lbsn_fat", True, True, False),
    ("LBSN+AWP", R / "tablevii46/lbsn_awp", R / "tablevii46/lbsn_awp", True, False, True),
    ("FAT+AWP", R / "tablevii46/fat_awp", R / "tablevii46/fat_awp", False, True, True),
    ("SAFE (LBSN+FAT+AWP)", R / "sweep46/safe", R / "blackbox46/safe", True, True, True),
    # not a combination: centralised training with FGSM adversarial training (standard BN), for reference
    ("CT+AT (centralised)", R / "baselines46/ct_at", R / "baselines46/ct_at", None, None, None),
]
WHITE = ["fgsm@0.03", "pgd@0.03"]
# further paired comparisons listed under the table (row, against row)
PAIRS = [("FAT", "CT+AT (centralised)"), ("LBSN+FAT", "FAT"), ("LBSN+FAT", "CT+AT (centralised)"),
         ("FAT", "SAFE (LBSN+FAT+AWP)"), ("LBSN", "none (FedAvg)"), ("LBSN+AWP", "LBSN"),
         ("FAT+AWP", "FAT"), ("AWP", "none (FedAvg)")]
BLACK = "square_0.05"


def white_box(run: Path, seeds: list[int]) -> tuple[dict[str, dict], dict[str, dict]] | None:
    """Per-subject benign and white-box BCA (mean over ``seeds``) and their summary (with each seed's mean over
    subjects; ``aggregate_seeds``) from the run's per-job sweep files (``sweep/seedS_foldKK.json``, written by
    `neurofed sweep`), or None unless every seed has all five folds swept with the :data:`WHITE` attacks."""
    keys = ["bca", *WHITE]
    per_seed: dict[int, dict[str, dict[str, float]]] = {}
    for sd in seeds:
        files = sorted((run / "sweep").glob(f"seed{sd}_fold*.json"))
        rows = [r for f in files for r in json.loads(f.read_text())["per_subject"].items()]
        if len(files) < 5 or not all(k in row for _, row in rows for k in WHITE):
            return None
        per_seed[sd] = {subj: {k: row[k] for k in keys} for subj, row in rows}
    return aggregate_seeds(per_seed)


def black_box(run: Path, seeds: list[int]) -> tuple[dict[str, dict], list[int]]:
    """Per-subject Square BCA by seed, ``{subject: {"seeds": {seed: attacked}, "bca graph": benign mean}}``, and the
    seeds found, read by blackbox46_table.load (which checks the graph's benign BCA against the training job's); only
    seeds with all five folds attacked count."""
    found = [sd for sd in seeds if len(list((run / "onnx_attack" / BLACK).glob(f"seed{sd}_fold*.json"))) == 5]
    if not found:
        return {}, []
    rows, _, differ = load(str(run), BLACK, found)
    if differ:
        raise SystemExit(f"{run}: the graph's benign BCA differs from the training job's on {differ} subject-seeds")
    return {s: {"seeds": {r["seed"]: r["bca_attacked"] for r in row["seeds"]}, "bca graph": row["bca"]}
            for s, row in rows.items()}, found


def square_on(data: dict[str, dict], row: str, seeds: list[int]) -> dict[str, float]:
    """Each subject's Square BCA of ``row``, the mean over ``seeds`` (seeds the row was attacked on)."""
    return {s: float(np.mean([v[sd] for sd in seeds])) for s, v in data[row]["square_by_seed"].items()}


def compare(data: dict[str, dict], x: str, y: str, key: str) -> dict | None:
    """Paired comparison of rows ``x`` and ``y`` on ``key`` over the subjects both hold it for (x − y)."""
    return paired_comparison(*({s: v[key] for s, v in data[r]["per_subject"].items() if key in v} for r in (x, y)))


def fmt_pair(key: str, c: dict) -> str:
    """One paired comparison as listed under the table: difference in points, p and subjects higher."""
    return f"{key} {100 * c['diff']:+.1f} (p {c['t_p']:.2g}, higher on {c['higher']} of {c['n']})"


def fmt_p(c: dict | None) -> str:
    return "-" if c is None else f"{100 * c['diff']:+.1f} (p {c['t_p']:.2g})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", type=Path, default=Path("studies/tablevii46/table"))
    a = ap.parse_args()
    seeds = [int(x) for x in a.seeds.split(",")]
    cols = ["bca", *WHITE, "lowest white-box"]
    data: dict[str, dict] = {}
    for label, run, bb_run, *parts in ROWS:
        s = white_box(run, seeds)
        if s is None:
            print(f"{label}: {run} has no sweep of all five folds of seeds {seeds} with {WHITE} (run `neurofed sweep`"
                  " first); skipped")
            continue
        per = {subj: {**row, "lowest white-box": min(row[k] for k in WHITE)} for subj, row in s[0].items()}
        bb, bb_seeds = black_box(bb_run, seeds)
        data[label] = {"parts": parts, "per_subject": per, "black_box_seeds": bb_seeds,
                       "square_by_seed": {subj: v["seeds"] for subj, v in bb.items()},
                       "seeds": {k: s[1][k] for k in ("bca", "pgd@0.03")}}
        for subj, att in square_on(data, label, bb_seeds).items():
            per.setdefault(subj, {}).update({BLACK: att, "bca graph": bb[subj]["bca graph"]})
    if not data:
        raise SystemExit("no row has its sweep yet")
    refs = [r for r in ("none (FedAvg)", "SAFE (LBSN+FAT+AWP)") if r in data]
    head = (["row", "LBSN", "FAT", "AWP", "benign BCA %", "FGSM 0.03 %", "PGD-10 0.03 %", "lowest white-box %",
             "Square 0.05 % (graph)"] + [f"{c} − {r.split(' ')[0]}" for r in refs for c in ("benign", "white-box")])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    summary: dict[str, dict] = {}
    for label, d in data.items():
        per = d["per_subject"]
        mean = {k: 100 * float(np.mean([row[k] for row in per.values() if k in row])) for k in cols}
        sd = {k: 100 * float(np.std([row[k] for row in per.values() if k in row], ddof=1)) for k in cols}
        bb = [row[BLACK] for row in per.values() if BLACK in row]
        bb_cell = (f"{100 * np.mean(bb):.1f} ({np.mean(bb) / np.mean([r['bca graph'] for r in per.values() if BLACK in r]):.0%};"
                   f" seed {','.join(map(str, d['black_box_seeds']))})" if bb else "not run")
        cells = [label, *("✓" if p else ("-" if p is None else "") for p in d["parts"]), f"{mean['bca']:.1f} ± {sd['bca']:.1f}",
                 *(f"{mean[k]:.1f} ({mean[k] / mean['bca']:.0%})" for k in cols[1:]), bb_cell]
        comps = {}
        for r in refs:
            for key, name in (("bca", "benign"), ("lowest white-box", "white-box")):
                c = None if r == label else compare(data, label, r, key)
                comps[f"{name} vs {r}"] = c
                cells.append(fmt_p(c))
        lines.append("| " + " | ".join(cells) + " |")
        summary[label] = {"mean": mean, "sd_subjects": sd, "per_seed": {k: v["per_seed"] for k, v in d["seeds"].items()},
                          "n_subjects": len(per), "square_0.05": float(np.mean(bb)) if bb else None,
                          "square_seeds": d["black_box_seeds"], "comparisons": comps}
    bullets = []
    for x, y in PAIRS:
        if x not in data or y not in data:
            continue
        cells = []
        for key in ("bca", "pgd@0.03"):
            c = compare(data, x, y, key)
            if c is not None:
                cells.append(fmt_pair(key, c))
                summary[x]["comparisons"][f"{key} vs {y}"] = c
        # Square only on the seeds both rows were attacked on (the same models' seeds), per subject the mean over them
        common = sorted(set(data[x]["black_box_seeds"]) & set(data[y]["black_box_seeds"]))
        c = paired_comparison(square_on(data, x, common), square_on(data, y, common)) if common else None
        if c is not None:
            cells.append(fmt_pair(f"{BLACK} (seed {','.join(map(str, common))})", c))
            summary[x]["comparisons"][f"{BLACK} vs {y}"] = c | {"seeds": common}
        bullets.append(f"- {x} − {y}: " + "; ".join(cells))
    if len(seeds) > 1:  # the seed-to-seed spread of each row's mean over subjects
        bullets.append(f"\nEach seed's mean over the subjects, benign / PGD-10 0.03 % (seeds {a.seeds}; std over seeds):")
        for label, d in data.items():
            b, w = (d["seeds"][k] for k in ("bca", "pgd@0.03"))
            bullets.append(f"- {label}: " + ", ".join(f"{100 * x:.1f} / {100 * y:.1f}"
                                                      for x, y in zip(b["per_seed"], w["per_seed"]))
                           + f" (std {100 * b['std_seeds']:.1f} / {100 * w['std_seeds']:.1f})")
    text = (f"Seeds {a.seeds}; per subject the mean over seeds; paired t over the subjects both rows hold "
            "(difference in points).\n\n" + "\n".join(lines) + "\n\n" + "\n".join(bullets))
    print(text)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.md").write_text(text + "\n")
    (a.out / "summary.json").write_text(json.dumps({"seeds": seeds, "rows": summary}, indent=1, default=float))


if __name__ == "__main__":
    unpack_studies(['tablevii46', 'attacks46', 'table46'])  # the studies' raw.jsonl.gz -> runs/studies/results/ (kept files stay)
    main()
