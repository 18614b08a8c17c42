"""``neurofed report``: markdown tables and PNG plots from one or more results.json run directories."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from scipy import stats

from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments import raw
from neurofed.trainer.experiments.partition import parse_partition


class ReportError(NeuroFedError):
    """A run directory that cannot be reported as asked (no results.json, none of the seeds asked for)."""


def load_runs(run_dirs: list[Path], seeds: list[int] | None = None) -> list[dict]:
    """Read each run's results.json; with ``seeds``, keep only those seeds' results (per subject and summary
    are recomputed from ``per_seed``, the learning curve from ``curve_per_seed`` where the run has it; older
    results without it keep the mean curve over all their seeds).

    A study's raw results are read directly (:mod:`neurofed.trainer.experiments.raw`): ``studies/NAME`` or its
    ``raw.jsonl.gz`` gives every run in it, ``...raw.jsonl.gz:GROUP/RUN`` one run, ``...raw.jsonl.gz:GROUP`` the
    runs under that folder."""
    runs = []
    for d in run_dirs:
        if raw.is_raw(d) or ".jsonl.gz:" in str(d):
            try:
                found = raw.run_results(d)
            except NeuroFedError as exc:
                raise ReportError(str(exc)) from None
            for path, r in found:
                r["_dir"] = path
                runs.append(only_seeds(r, seeds) if seeds is not None else r)
            continue
        p = d / "results.json" if d.is_dir() else d
        if not p.is_file():
            raise ReportError(f"{p}: no results.json (run `neurofed simulate --out {d}` first)")
        r = json.loads(p.read_text())
        r["_dir"] = str(d)
        if seeds is not None:
            r = only_seeds(r, seeds)
        runs.append(r)
    return runs


def only_seeds(run: dict, seeds: list[int]) -> dict:
    """The run restricted to ``seeds`` (those it has); an error naming the run if it has none of them."""
    from neurofed.trainer.experiments.simulate import (  # lazy: torch (loaded only when used)
        aggregate_seeds,
        mean_curve,
    )

    kept = {k: v for k, v in (run.get("per_seed") or {}).items() if int(k) in seeds}
    if not kept:
        have = sorted(int(k) for k in run.get("per_seed") or {})
        raise ReportError(f"{run['_dir']}: has seeds {have}, none of {sorted(seeds)}")
    per_subject, summary = aggregate_seeds(kept)
    out = {**run, "per_seed": kept, "per_subject": per_subject, "summary": summary}
    if run.get("curve_per_seed"):
        curves = {k: v for k, v in run["curve_per_seed"].items() if k in kept}
        out["curve_per_seed"] = curves
        out["curve"] = mean_curve([{"curve": c} for c in curves.values()])  # seeds have the same folds
    return out


def curve_markdown(runs: list[dict]) -> str:
    """Held-out BCA (%) at each evaluated round: mean over folds and seeds, and per seed (``s0 / s1 / ...``)
    where results.json has ``curve_per_seed`` and more than one seed; "" when no run has a curve."""
    runs = [r for r in runs if r.get("curve")]
    if not runs:
        return ""
    rounds = sorted({p["round"] for r in runs for p in r["curve"]})
    head = "| run | " + " | ".join(f"round {k}" for k in rounds) + " |"
    lines = [head, "|" + "---|" * (len(rounds) + 1)]
    for r in runs:
        mean = {p["round"]: 100 * p["bca"] for p in r["curve"]}
        per_seed = [{p["round"]: 100 * p["bca"] for p in c} for _, c in sorted(
            (r.get("curve_per_seed") or {}).items(), key=lambda kv: int(kv[0]))]
        cells = []
        for k in rounds:
            cell = f"{mean[k]:.1f}" if k in mean else "-"
            if len(per_seed) > 1 and k in mean:
                cell += " (" + " / ".join(f"{c[k]:.1f}" if k in c else "-" for c in per_seed) + ")"
            cells.append(cell)
        lines.append(f"| {label_of(r)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def clipping_markdown(runs: list[dict]) -> str:
    """One line per run whose jobs count the server's adaptive norm clip (results.json ``clipping``), over the seeds
    the run is reported on; "" when none does."""
    lines = []
    for r in runs:
        kept = [c for k, c in (r.get("clipping") or {}).items() if k in (r.get("per_seed") or {})]
        if not kept:
            continue
        clipped, updates, jobs = (sum(c[f] for c in kept) for f in ("clipped", "updates", "jobs"))
        share = f" ({100 * clipped / updates:.1f} %)" if updates else ""
        lines.append(f"- `{label_of(r)}`: {clipped} of {updates} client updates clipped{share}, in the {jobs} job(s) "
                     "that count it")
    return "\n".join(lines)


def label_of(run: dict) -> str:
    """The run directory's name (unique per run; e.g. ``fedbs``, ``ct_noea``)."""
    return Path(run["_dir"]).name or run["algorithm"]


def subject_ranges(subjects) -> str:
    """``["S001", "S002", "S003", "S009"]`` (or ints) -> ``"S001-S003, S009"``."""
    nums = sorted({int(str(s).upper().lstrip("S")) for s in subjects})
    parts, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(f"S{nums[i]:03d}" + (f"-S{nums[j]:03d}" if j > i else ""))
        i = j + 1
    return ", ".join(parts)


def protocol_of(run: dict) -> dict[str, str]:
    """What a run did, in words, from its results.json (data, subjects, folds, model, preprocessing,
    optimiser, rounds, seeds, attacks); the keys are the report's protocol lines."""
    cfg = run.get("config", {})
    pre = cfg.get("preprocess", {})
    loc = cfg.get("local", {})
    strat = run.get("strategy", {})
    subjects = cfg.get("subjects") or sorted(run.get("per_subject", {}))
    files = sorted(run.get("data_hashes", {}))
    runs = sorted({f[4:7].lstrip("R").lstrip("0") for f in files if len(f) >= 7 and f[4] == "R"}, key=int)
    data = "EEGMMIDB (PhysioNet), left/right fist motor imagery" + (
        f", runs {'/'.join(runs)} ({len(files)} EDF files, SHA-256 in results.json)" if runs else "")
    proto = cfg.get("protocol", "loso")
    if proto == "loso":
        folds = f"leave-one-subject-out ({len(subjects)} folds; every subject scored once, never trained on)"
    elif proto.startswith("kfold:"):
        folds = (f"subject-wise {proto.split(':')[1]}-fold (subject groups drawn with fold seed "
                 f"{cfg.get('fold_seed', 0)}; every subject scored once by a model that never saw it)")
    else:
        folds = "none: trained on every subject, no held-out score"
    chans = pre.get("channels")
    ch = "all 64 channels" if chans is None else (
        "the 21 sensorimotor channels (FC/C/CP rows)" if len(chans) == 21 else f"{len(chans)} channels")
    rate = f"{pre['resample']:g} Hz" if pre.get("resample") else "160 Hz (native)"
    prep = (f"{ch}, band-pass {pre.get('fmin', '?')}-{pre.get('fmax', '?')} Hz, resampled to {rate}, window "
            f"{pre.get('tmin', 0)}-{pre.get('tmax', 4)} s after the cue, "
            + ("per-subject Euclidean alignment" if pre.get("ea", True) else "no Euclidean alignment"))
    alg = run.get("algorithm", cfg.get("algorithm", "?"))
    if alg == "ct":
        opt = (f"SGD lr {loc.get('lr')}, momentum {loc.get('momentum')}, weight decay {loc.get('weight_decay')}, "
               f"batch {cfg.get('ct_batch_size')} (centralised: one model on the pooled training subjects)")
        rounds = f"{cfg.get('rounds')} epochs"
    else:
        opt = (f"client SGD lr {loc.get('lr')}, momentum {loc.get('momentum')}, weight decay "
               f"{loc.get('weight_decay')}, client batch {loc.get('batch_size')}, {loc.get('local_epochs')} local "
               "epoch(s) per round")
        part = parse_partition(cfg.get("partition", "subject"))
        if part.kind == "subject":
            clients = "one client per training subject"
        elif part.kind == "dirichlet":
            clients = (f"Dirichlet({part.beta:g}) label skew: each training subject's trials split over {part.parts} "
                       "clients")
        else:
            clients = f"partition {part}: each training subject's trials split over several clients"
        rounds = f"{cfg.get('rounds')} rounds, {cfg.get('fraction')} of the clients per round ({clients})"
    over = cfg.get("strategy_overrides") or {}
    model = (f"{run.get('model', cfg.get('model'))}, {strat.get('bn_mode', '?')} BN, test batch "
             f"{cfg.get('test_batch', '?')}")
    algo = alg + (f" with overrides {over}" if over else "") + (
        f" (SAM rho {strat['sam_rho']}, FGSM-AT eps {strat['fat_eps']}, AWP gamma {strat['awp_gamma']})"
        if strat and any(strat.get(k) for k in ("sam_rho", "fat_eps", "awp_gamma")) else "")
    attacks = ", ".join(f"{a} eps {e}" for a, e in cfg.get("attacks", [])) or "none"
    n_seeds = run.get("per_seed") or {}
    seeds = ", ".join(sorted(n_seeds, key=int)) if n_seeds else ", ".join(map(str, cfg.get("seeds", [])))
    return {"data": data, "subjects": f"{len(subjects)}: {subject_ranges(subjects)}", "folds": folds,
            "algorithm": algo, "model": model, "preprocessing": prep, "optimiser": opt, "rounds": rounds,
            "seeds": seeds, "attacks (white-box, eps x per-channel std)": attacks}


def protocol_markdown(runs: list[dict]) -> str:
    """The report's opening: the protocol lines shared by every run, then what differs per run."""
    protos = [protocol_of(r) for r in runs]
    keys = list(protos[0])
    same = [k for k in keys if all(p.get(k) == protos[0][k] for p in protos)]
    lines = ["## Protocol", ""] + [f"- **{k}**: {protos[0][k]}" for k in same]
    differ = [k for k in keys if k not in same]
    if differ:
        lines += ["", "Per run (where runs differ):", ""]
        for r, p in zip(runs, protos):
            lines.append(f"- `{label_of(r)}`: " + "; ".join(f"{k}: {p[k]}" for k in differ))
    return "\n".join(lines)


def sample_std(values) -> float:
    """Sample standard deviation (ddof=1); 0.0 for fewer than two values."""
    v = np.asarray(list(values), dtype=float)
    return float(v.std(ddof=1)) if len(v) > 1 else 0.0


def mean_ci95(x: np.ndarray) -> tuple[float, float, float]:
    """Mean of ``x`` and its 95 % t-interval (lower, upper); NaN bounds for fewer than two values."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    half = float(stats.t.ppf(0.975, n - 1) * x.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    mean = float(x.mean())
    return mean, mean - half, mean + half


def paired_comparison(x: Mapping[str, float], y: Mapping[str, float], min_n: int = 3) -> dict | None:
    """Compare two per-subject scores (subject -> value) over the subjects both hold.

    Parameters
    ----------
    x, y
        Per-subject scores of the two models (e.g. each subject's BCA, mean over seeds).
    min_n
        Fewest common subjects to test; below it the comparison is ``None``.

    Returns
    -------
    dict or None
        ``n`` (common subjects), ``diff`` (mean of x - y), ``t_p`` (two-sided paired t-test), ``wilcoxon_p``
        (two-sided Wilcoxon signed-rank test, zero differences dropped) and ``higher`` (subjects with x > y).
        Identical scores give p = 1.0 for both tests.
    """
    common = sorted(set(x) & set(y))
    if len(common) < min_n:
        return None
    a = np.array([x[s] for s in common], dtype=float)
    b = np.array([y[s] for s in common], dtype=float)
    same = np.allclose(a, b)
    return {"n": len(common), "diff": float((a - b).mean()), "higher": int((a > b).sum()),
            "t_p": 1.0 if same else float(stats.ttest_rel(a, b).pvalue),
            "wilcoxon_p": 1.0 if same else float(stats.wilcoxon(a, b).pvalue)}


def paired_p(a: dict, b: dict, metric: str = "bca") -> float | None:
    """Paired t-test over subjects both runs hold (two-sided)."""
    c = paired_comparison({s: v[metric] for s, v in a["per_subject"].items()},
                          {s: v[metric] for s, v in b["per_subject"].items()})
    return None if c is None else c["t_p"]


def comparisons_markdown(runs: list[dict], refs: tuple[str, ...]) -> str:
    """Each run against each reference run on BCA: difference, paired t and Wilcoxon p, subjects higher."""
    ref_runs = reference_runs(runs, refs)
    lines = []
    for k in refs:
        ref = ref_runs.get(k)
        for r in runs if ref is not None else []:
            c = None if r is ref else paired_comparison({s: v["bca"] for s, v in r["per_subject"].items()},
                                                        {s: v["bca"] for s, v in ref["per_subject"].items()})
            if c is not None:
                diff = round(100 * c["diff"], 1) + 0.0  # + 0.0: a difference that rounds to zero prints +0.0
                lines.append(f"| {label_of(r)} − {label_of(ref)} | {c['n']} | {diff:+.1f} | "
                             f"{c['t_p']:.2g} | {c['wilcoxon_p']:.2g} | {c['higher']} of {c['n']} |")
    if not lines:
        return ""
    head = ("| comparison | subjects | difference (points) | p (paired t) | p (Wilcoxon) | higher on |\n"
            "|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(lines)


def reference_runs(runs: list[dict], refs: tuple[str, ...]) -> dict[str, dict]:
    """Algorithm name in ``refs`` -> its reference run: the run named like the algorithm (e.g. directory
    ``ct``), else its first plain run. Names that match no run are absent (the report warns about them)."""
    ref_runs: dict[str, dict] = {}
    for r in runs:
        plain = not r["config"].get("strategy_overrides") and r["config"]["preprocess"].get("ea", True)
        if r["algorithm"] in refs and (label_of(r) == r["algorithm"] or (plain and r["algorithm"] not in ref_runs)):
            ref_runs[r["algorithm"]] = r
    return ref_runs


def markdown_table(runs: list[dict], refs: tuple[str, ...] = ("ct", "fedavg"),
                   p_metrics: tuple[str, ...] = ("bca",)) -> str:
    """Accuracy (and robustness) table, with paired p-values (per metric in ``p_metrics``) against the plain runs
    of the algorithms in ``refs`` where present."""
    metrics = sorted({m for r in runs for m in r["summary"]}, key=lambda m: (m != "bca", m))
    ref_runs = reference_runs(runs, refs)
    head = ["algorithm", "subjects", "seeds"] + [f"{m} mean ± sd (%)" for m in metrics]
    head += ["bca sd over seeds"]
    head += [f"p vs {k}" + ("" if pm == "bca" else f" ({pm})") for pm in p_metrics for k in refs if k in ref_runs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        n_seeds = len(r.get("per_seed") or r["config"]["seeds"])  # seeds actually run
        row = [label_of(r), str(len(r["per_subject"])), str(n_seeds)]
        for m in metrics:
            s = r["summary"].get(m)
            sd = sample_std(v[m] for v in r["per_subject"].values() if m in v)
            row.append(f"{100 * s['mean']:.1f} ± {100 * sd:.1f}" if s else "-")
        seed_means = r["summary"]["bca"].get("per_seed", [])
        row.append(f"{100 * sample_std(seed_means):.1f}" if n_seeds > 1 and len(seed_means) > 1 else "-")
        for pm in p_metrics:
            for k in refs:
                if k in ref_runs:
                    ref = ref_runs[k]  # a metric only one of the two has (a classical run has no PGD): no test
                    p = None if ref is r or pm not in r["summary"] or pm not in ref["summary"] else paired_p(r, ref, pm)
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
        ax.set_title("BCA per held-out subject (dashed: chance, 50 %)", fontsize=10)
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(out / "per_subject_bca.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    if any(r["curve"] for r in runs):
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in runs:
            if r["curve"]:
                n = len(r["curve"])  # short runs: a marker on every point (one point is no line)
                ax.plot([p["round"] for p in r["curve"]], [100 * p["bca"] for p in r["curve"]], label=label_of(r),
                        marker="o" if n <= 30 else None, ms=4)
        ax.axhline(50, color="grey", lw=0.8, ls="--")
        ax.set_title("held-out BCA of the global model during training (mean over folds and seeds)", fontsize=10)
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


def write_report(runs: list[dict], out: Path, ref_names: tuple[str, ...], p_metrics: tuple[str, ...],
                 warn_refs: bool = True) -> tuple[str, list[str]]:
    """Write ``out/report.md`` (markdown table with mean ± std and paired p-values, comparisons, curves) and the
    PNG plots of ``runs`` (:func:`load_runs`); returns the results table and the warnings (``warn_refs``: a
    reference of ``ref_names`` that matches no run is a warning)."""
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(runs, ref_names, p_metrics)
    matched = reference_runs(runs, ref_names)
    warnings = [f"--refs {k}: no run of algorithm {k!r} among the runs given "
                f"({', '.join(sorted({r['algorithm'] for r in runs}))}); no p-value against it"
                for k in ref_names if k not in matched and warn_refs]
    pngs = plots(runs, out)
    notes = [("mean ± sd: mean over subjects of each subject's BCA (averaged over seeds first); sd is the sample "
             "standard deviation over subjects (ddof=1). sd over seeds: sample standard deviation of the per-seed "
             "means. p: two-sided paired t-test over the subjects both runs hold. Every score is on subjects the "
             "scoring model never trained on (see Folds).")]
    notes += [f"**Warning**: {w}." for w in warnings]
    comparisons = comparisons_markdown(runs, ref_names)
    if comparisons:
        comparisons = ("## Paired comparisons (BCA)\n\nEach run against each reference over the held-out subjects "
                       "both hold (each subject's BCA averaged over seeds first): mean difference, two-sided paired "
                       "t-test, two-sided Wilcoxon signed-rank test (zero differences dropped), and on how many "
                       "subjects the run is higher.\n\n" + comparisons + "\n\n")
    clipping = clipping_markdown(runs)
    if clipping:
        comparisons += ("## Server-side clipping\n\nHow often the server's adaptive norm clip (robust aggregation: each "
                        "update longer than k x the round's median update norm is scaled down to it) fired; jobs "
                        "written before 2026-11-28 do not count it.\n\n" + clipping + "\n\n")
    curves = curve_markdown(runs)
    if curves:
        curves = ("## Held-out BCA during training (%)\n\nThe global model on the held-out subjects at each "
                  "evaluated round, mean over folds and seeds (per seed in brackets).\n\n" + curves + "\n\n")
    md = ("# NeuroFed report\n\n" + protocol_markdown(runs) + "\n\n## Results\n\n" + table + "\n\n"
          + "\n\n".join(notes) + "\n\n" + comparisons + curves + "\n".join(f"![{p.stem}]({p.name})" for p in pngs) + "\n")
    (out / "report.md").write_text(md)
    return table, warnings
