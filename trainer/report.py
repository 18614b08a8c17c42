"""``neurofed report``: markdown tables and PNG plots from one or more results.json run directories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from scipy import stats


def load_runs(run_dirs: list[Path], seeds: list[int] | None = None) -> list[dict]:
    """Read each run's results.json; with ``seeds``, keep only those seeds' results (per subject and summary
    are recomputed from ``per_seed``; the learning curve stays the mean over all the run's seeds)."""
    runs = []
    for d in run_dirs:
        p = d / "results.json" if d.is_dir() else d
        if not p.is_file():
            raise typer.BadParameter(f"{p}: no results.json (run `neurofed simulate --out {d}` first)")
        r = json.loads(p.read_text())
        r["_dir"] = str(d)
        if seeds is not None:
            r = only_seeds(r, seeds)
        runs.append(r)
    return runs


def only_seeds(run: dict, seeds: list[int]) -> dict:
    """The run restricted to ``seeds`` (those it has); an error naming the run if it has none of them."""
    from trainer.experiments.simulate import aggregate_seeds

    kept = {k: v for k, v in (run.get("per_seed") or {}).items() if int(k) in seeds}
    if not kept:
        have = sorted(int(k) for k in run.get("per_seed") or {})
        raise typer.BadParameter(f"{run['_dir']}: has seeds {have}, none of {sorted(seeds)}")
    per_subject, summary = aggregate_seeds(kept)
    return {**run, "per_seed": kept, "per_subject": per_subject, "summary": summary}


def label_of(run: dict) -> str:
    """The run directory's name (unique per run; e.g. ``fedbs``, ``ct_noea``)."""
    return Path(run["_dir"]).name or run["algorithm"]


def paired_p(a: dict, b: dict, metric: str = "bca") -> float | None:
    """Paired t-test over subjects both runs hold (two-sided)."""
    common = sorted(set(a["per_subject"]) & set(b["per_subject"]))
    if len(common) < 3:
        return None
    x = [a["per_subject"][s][metric] for s in common]
    y = [b["per_subject"][s][metric] for s in common]
    if np.allclose(x, y):
        return 1.0
    return float(stats.ttest_rel(x, y).pvalue)


def markdown_table(runs: list[dict], refs: tuple[str, ...] = ("ct", "fedavg"),
                   p_metrics: tuple[str, ...] = ("bca",)) -> str:
    """Accuracy (and robustness) table, with paired p-values (per metric in ``p_metrics``) against the plain runs
    of the algorithms in ``refs`` where present."""
    metrics = sorted({m for r in runs for m in r["summary"]}, key=lambda m: (m != "bca", m))
    # reference = the run named like the algorithm (e.g. directory "ct"), else its first plain run
    ref_runs: dict[str, dict] = {}
    for r in runs:
        plain = not r["config"].get("strategy_overrides") and r["config"]["preprocess"].get("ea", True)
        if r["algorithm"] in refs and (label_of(r) == r["algorithm"] or (plain and r["algorithm"] not in ref_runs)):
            ref_runs[r["algorithm"]] = r
    head = ["algorithm", "subjects", "seeds"] + [f"{m} mean ± std (%)" for m in metrics]
    head += ["bca std over seeds"]
    head += [f"p vs {k}" + ("" if pm == "bca" else f" ({pm})") for pm in p_metrics for k in refs if k in ref_runs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        n_seeds = len(r.get("per_seed") or r["config"]["seeds"])  # seeds actually run
        row = [label_of(r), str(len(r["per_subject"])), str(n_seeds)]
        for m in metrics:
            s = r["summary"].get(m)
            row.append(f"{100 * s['mean']:.1f} ± {100 * s['std_subjects']:.1f}" if s else "-")
        row.append(f"{100 * r['summary']['bca']['std_seeds']:.1f}" if n_seeds > 1 else "-")
        for pm in p_metrics:
            for k in refs:
                if k in ref_runs:
                    p = None if ref_runs[k] is r or pm not in r["summary"] else paired_p(r, ref_runs[k], pm)
                    row.append("-" if p is None else f"{p:.3g}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plots(runs: list[dict], out: Path) -> list[Path]:
    """Per-subject BCA bars, learning curves, BCA vs attack epsilon."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    subjects = sorted({s for r in runs for s in r["per_subject"]})
    if subjects:
        fig, ax = plt.subplots(figsize=(max(8, len(subjects) * 0.45), 4))
        w = 0.8 / len(runs)
        for i, r in enumerate(runs):
            vals = [100 * r["per_subject"].get(s, {}).get("bca", np.nan) for s in subjects]
            ax.bar(np.arange(len(subjects)) + i * w, vals, w, label=label_of(r))
        ax.axhline(50, color="grey", lw=0.8, ls="--")
        ax.set_xticks(np.arange(len(subjects)) + 0.4 - w / 2, subjects, rotation=90)
        ax.set_ylabel("BCA (%)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(out / "per_subject_bca.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    if any(r["curve"] for r in runs):
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in runs:
            if r["curve"]:
                ax.plot([p["round"] for p in r["curve"]], [100 * p["bca"] for p in r["curve"]], label=label_of(r))
        ax.set_xlabel("round (CT: epoch)")
        ax.set_ylabel("held-out BCA (%)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(out / "learning_curves.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    attacked = [r for r in runs if any("@" in m for m in r["summary"])]
    if attacked:
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in attacked:
            for attack in sorted({m.split("@")[0] for m in r["summary"] if "@" in m}):
                pts = sorted((float(m.split("@")[1]), r["summary"][m]["mean"]) for m in r["summary"]
                             if m.startswith(attack + "@"))
                pts = [(0.0, r["summary"]["bca"]["mean"])] + pts
                ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=f"{label_of(r)} {attack}")
        ax.set_xlabel("epsilon (x per-channel std)")
        ax.set_ylabel("BCA (%)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(out / "bca_vs_epsilon.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    return made


def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="run directories (each with results.json)")],
    out: Annotated[Path, typer.Option(help="folder for report.md and PNG plots")] = Path("runs/report"),
    seeds: Annotated[str | None, typer.Option(help="only these seeds, e.g. '0' or '0,1' (default: all a run has)")] = None,
    refs: Annotated[str, typer.Option(help="algorithms to give paired p-values against (their plain run)")] = "ct,fedavg",
    p_metrics: Annotated[str, typer.Option(help="metrics to test, e.g. 'bca,pgd@0.03'")] = "bca",
) -> None:
    """Render a markdown table (mean ± std, paired t-test p-values) and PNG plots from runs."""
    wanted = None
    if seeds is not None:
        try:
            wanted = [int(x) for x in seeds.split(",") if x.strip()]
        except ValueError:
            raise typer.BadParameter(f"--seeds {seeds!r}: expected comma-separated integers") from None
    runs = load_runs(run_dirs, wanted)
    out.mkdir(parents=True, exist_ok=True)
    known = {m for r in runs for m in r["summary"]}
    pms = tuple(x.strip() for x in p_metrics.split(",") if x.strip())
    if unknown := [m for m in pms if m not in known]:
        raise typer.BadParameter(f"--p-metrics {','.join(unknown)}: no run has it (runs have {sorted(known)})")
    table = markdown_table(runs, tuple(x.strip() for x in refs.split(",") if x.strip()), pms)
    pngs = plots(runs, out)
    md = "# NeuroFed report\n\n" + table + "\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in pngs) + "\n"
    (out / "report.md").write_text(md)
    typer.echo(table)
    typer.echo(f"report: {out / 'report.md'}")
