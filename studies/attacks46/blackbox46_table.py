"""Table of the black-box runs of studies/attacks46/blackbox46_onnx.sh: BCA under an attack on the exported graphs, 46 subjects.

Run: python studies/attacks46/blackbox46_table.py [--attack square_0.05] [--seeds 0,1,2] [--out studies/attacks46/square] [RUN ...]
     [--plot]  (also OUT/bca_vs_eps.png: BCA against eps for every budget of --attack's attack that all the runs have
     on every fold of --seeds, eps 0 = benign; SAFE's Figs. 4-7 shape, drawn by `neurofed sweep`'s plot)
     python studies/attacks46/blackbox46_table.py --swept autoattack@0.03,fgsm@0.03 [--seeds 0,1,2] [RUN ...]   (the
     white-box attacks that `neurofed sweep RUN --attack ...` has finished so far: mean over those jobs' subjects)
(runs default: safe fedavg; a name is a folder under runs/studies/results/blackbox46, a path with a "/" any run folder
trained with --save-models, e.g. runs/studies/results/baselines46/ct_at). Per run: the held-out subjects of every
finished job of the given seeds (default 0; several seeds: each subject's mean over them), benign and attacked BCA as
`neurofed evaluate` measured them on the ONNX graph (mean ± sample sd over subjects), the share of benign BCA kept
(mean attacked / mean benign) and the paired t-test attacked vs benign; then each run against the first on the
subjects both have. Also checks that each fold's benign BCA on the graph equals
the training job's own torch BCA (`jobs/seedS_foldKK.json`) subject by subject. Writes OUT/summary.json and
OUT/table.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy import stats

from neurofed.trainer.experiments.raw import unpack_studies  # noqa: E402 - the committed raw results
from neurofed.trainer.experiments.sweep import _key, sweep_plot

RES = Path("runs/studies/results/blackbox46")


def run_dir(run: str) -> Path:
    """A run's folder: a bare name lives under :data:`RES`, a path is taken as given."""
    return Path(run) if "/" in run else RES / run


def load(run: str, attack: str, seeds: list[int]) -> tuple[dict[str, dict], list[str], int]:
    """Per-subject rows of a run's finished jobs (mean over ``seeds`` per subject, and each seed's value), the jobs,
    and how many (subject, seed) benign BCAs on the graph differ from the training job's."""
    per: dict[str, list[dict]] = {}
    jobs, differ = [], 0
    for seed in seeds:
        for p in sorted((run_dir(run) / "onnx_attack" / attack).glob(f"seed{seed}_fold*.json")):
            res = json.loads(p.read_text())
            job = json.loads((run_dir(run) / "jobs" / p.name).read_text())
            for s, row in res["per_subject"].items():
                if row["trained_on"]:
                    raise SystemExit(f"{p}: {s} is a training subject of that model")
                per.setdefault(s, []).append({**row, "seed": seed})
                differ += abs(row["bca"] - job["per_subject"][s]["bca"]) > 1e-9
            jobs.append(p.stem)
    return by_subject(per, ["bca", "bca_attacked"]), jobs, differ


def by_subject(per: dict[str, list[dict]], keys: list[str]) -> dict[str, dict]:
    """Each subject's mean of ``keys`` over its seeds' rows, the rows themselves under ``"seeds"``."""
    return {s: {k: float(np.mean([r[k] for r in rs])) for k in keys} | {"seeds": rs} for s, rs in per.items()}


def seed_means(rows: dict[str, dict], key: str) -> dict[int, float]:
    """Per seed the mean of ``key`` over the subjects that seed scored (%), from :func:`by_subject` rows."""
    per_seed: dict[int, list[float]] = {}
    for row in rows.values():
        for r in row["seeds"]:
            per_seed.setdefault(r["seed"], []).append(r[key])
    return {sd: 100 * float(np.mean(v)) for sd, v in sorted(per_seed.items())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="*", default=["safe", "fedavg"])
    ap.add_argument("--attack", default="square_0.05")
    ap.add_argument("--out", type=Path, default=Path("studies/attacks46/square"))
    ap.add_argument("--seeds", default="0", help="comma-separated run seeds (per subject: the mean over them)")
    ap.add_argument("--plot", action="store_true", help="also OUT/bca_vs_eps.png over the attack's budgets")
    ap.add_argument("--swept", help="comma-separated attack@eps keys of the runs' finished sweep/seedS_fold*.json "
                    "(of --seeds)")
    a = ap.parse_args()
    if a.swept:
        return swept(a.runs, a.swept.split(","), [int(x) for x in a.seeds.split(",")])
    seeds = [int(x) for x in a.seeds.split(",")]
    data = {Path(r).name: load(r, a.attack, seeds) for r in a.runs}  # labelled by the run folder's name
    data = {r: d for r, d in data.items() if d[0]}
    if not data:
        raise SystemExit(f"no results under {', '.join(str(run_dir(r) / 'onnx_attack' / a.attack) for r in a.runs)}")
    summary: dict[str, dict] = {}
    lines = [f"| run (seeds {a.seeds}) | jobs | subjects | benign BCA % | {a.attack} BCA % | retained | p attacked vs benign |",
             "|---|---|---|---|---|---|---|"]
    for r, (rows, folds, differ) in data.items():
        b = 100 * np.array([row["bca"] for row in rows.values()])
        x = 100 * np.array([row["bca_attacked"] for row in rows.values()])
        p = float(stats.ttest_rel(x, b).pvalue) if len(b) > 1 else float("nan")
        summary[r] = {"jobs": folds, "attacked_per_seed": seed_means(rows, "bca_attacked"),
                      "n_subjects": len(b), "benign_mean": b.mean(), "benign_sd": b.std(ddof=1),
                      "attacked_mean": x.mean(), "attacked_sd": x.std(ddof=1), "retained": x.mean() / b.mean(),
                      "p_attacked_vs_benign": p, "benign_differs_from_training_job": differ}
        lines.append(f"| {r} | {len(folds)} | {len(b)} | {b.mean():.1f} ± {b.std(ddof=1):.1f} | "
                     f"{x.mean():.1f} ± {x.std(ddof=1):.1f} | {100 * x.mean() / b.mean():.0f} % | {p:.2g} |")
    bullets: list[str] = []
    first = next(iter(data))
    for r in list(data)[1:]:
        common = sorted(set(data[first][0]) & set(data[r][0]))
        if len(common) < 2:
            continue
        for key, label in (("bca", "benign"), ("bca_attacked", a.attack)):
            u = 100 * np.array([data[first][0][s][key] for s in common])
            v = 100 * np.array([data[r][0][s][key] for s in common])
            p = float(stats.ttest_rel(u, v).pvalue)
            summary[f"{first}-{r}:{label}"] = {"n_subjects": len(common), "diff_mean": float((u - v).mean()), "p": p}
            bullets.append(f"- {first} − {r}, {label}: {(u - v).mean():+.1f} points (n={len(common)}, paired t p={p:.2g})")
    text = "\n".join(lines) + ("\n\n" + "\n".join(bullets) if bullets else "")
    print(text)
    for r, (_, _, differ) in data.items():
        print(f"{r}: benign BCA on the graph differs from the training job's on {differ} subjects")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.json").write_text(json.dumps({"attack": a.attack, "seeds": seeds, "runs": summary}, indent=1, default=float))
    (a.out / "table.md").write_text(text + "\n")
    if a.plot:
        curves = eps_curves(a.runs, a.attack.rsplit("_", 1)[0], seeds)
        sweep_plot(curves, a.out / "bca_vs_eps.png")
        print(f"plot: {a.out / 'bca_vs_eps.png'} (eps {', '.join(f'{e:g}' for _, e in next(iter(curves.values()))['attacks'])})")


def eps_curves(runs: list[str], attack: str, seeds: list[int]) -> dict[str, dict]:
    """Per run, mean BCA over subjects (per subject the mean over ``seeds``) benign and at every eps of ``attack``
    that every run has on all its folds of ``seeds``, in the form :func:`neurofed.trainer.experiments.sweep.sweep_plot` draws."""
    def complete(run: str, folder: Path) -> bool:
        return all(len(list(folder.glob(f"seed{sd}_fold*.json"))) == len(list((run_dir(run) / "jobs").glob(
            f"seed{sd}_fold*.json"))) > 0 for sd in seeds)

    eps_sets = [{float(f.name.rsplit("_", 1)[1]) for f in (run_dir(r) / "onnx_attack").glob(f"{attack}_*")
                 if complete(r, f)} for r in runs]
    eps = sorted(set.intersection(*eps_sets))
    if not eps:
        raise SystemExit(f"no {attack} budget is complete on seeds {seeds} for all of {runs}")
    out = {}
    for r in runs:
        rows = {e: load(r, f"{attack}_{e:g}", seeds)[0] for e in eps}
        summary = {"bca": {"mean": float(np.mean([row["bca"] for row in rows[eps[0]].values()]))}}
        summary |= {_key(attack, e): {"mean": float(np.mean([row["bca_attacked"] for row in rows[e].values()]))}
                    for e in eps}
        out[Path(r).name] = {"attacks": [(attack, e) for e in eps], "summary": summary}
    return out


def swept(runs: list[str], keys: list[str], seeds: list[int]) -> None:
    """Benign and ``keys`` BCA (mean ± sd over subjects; per subject the mean over ``seeds``) of each run's finished
    sweep jobs, the lowest per subject, and each seed's mean."""
    for r in runs:
        jobs = sorted(jp for sd in seeds for jp in (run_dir(r) / "sweep").glob(f"seed{sd}_fold*.json"))
        per: dict[str, list[dict]] = {}
        for jp in jobs:
            res = json.loads(jp.read_text())
            for s, row in res["per_subject"].items():
                if all(k in row for k in keys):
                    per.setdefault(s, []).append({**row, "seed": res["seed"]})
        if not per:
            print(f"{r}: no finished sweep job of seeds {seeds} with {keys}")
            continue
        rows = by_subject(per, ["bca", *keys])
        cells = []
        for k in ["bca", *keys]:
            v = 100 * np.array([row[k] for row in rows.values()])
            by_seed = seed_means(rows, k).values()
            cells.append(f"{k} {v.mean():.1f} ± {v.std(ddof=1):.1f} (seeds {', '.join(f'{m:.1f}' for m in by_seed)})")
        low = 100 * np.array([min(row[k] for k in keys) for row in rows.values()])
        print(f"{r}: {len(jobs)} jobs ({', '.join(jp.stem for jp in jobs)}), {len(rows)} subjects: " + "; ".join(cells)
              + f"; lowest per subject {low.mean():.1f}")


if __name__ == "__main__":
    unpack_studies(['attacks46', 'table46'])  # the studies' raw.jsonl.gz -> runs/studies/results/ (kept files stay)
    main()
