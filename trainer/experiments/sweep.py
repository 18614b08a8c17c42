"""``neurofed sweep``: attacks at several budgets on the models a run saved, without training again.

A run trained with ``--save-models`` keeps each (fold, seed) job's global model beside its JSON
(``jobs/seedS_foldKK.safetensors``). A sweep loads each of them, reloads that job's held-out subjects with the
run's own preprocessing, and measures BCA under every ``attack@eps`` asked for (SAFE's Figs. 4-7: BCA against
the budget, one curve per method), with the job's seed, so an attack the job already ran inline gives the same
number. Results are kept per job (``sweep/seedS_foldKK.json``): a sweep re-run computes only what is missing,
and a wider budget list adds to it. ``sweep.json`` holds the per-subject means over seeds and the summary of every
budget all the jobs hold (not only the last command's); a sweep of
only some of the run's seeds (``--seeds``) writes ``sweep_seeds0.json`` (``sweep_seeds0_1.json``, ...) instead, so it
never replaces the summary of all seeds.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from neurofed.trainer.atomic import atomic_write_bytes
from neurofed.trainer.data import PreprocessConfig
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments.jobs import job_checkpoint

logger = logging.getLogger("neurofed.trainer")


def _key(attack: str, eps: float) -> str:
    return f"{attack}@{eps:g}"


def _pair(key: str) -> tuple[str, float]:
    """``(attack, eps)`` of an ``attack@eps`` key (the inverse of :func:`_key`)."""
    attack, eps = key.split("@")
    return attack, float(eps)


def write_json(path: Path, obj: dict) -> None:
    """``obj`` as indented JSON, written atomically."""
    atomic_write_bytes(path, json.dumps(obj, indent=1).encode())


def run_config(run_dir: Path):
    """The :class:`~neurofed.trainer.experiments.simulate.SimConfig` a run directory was trained with."""
    from neurofed.trainer.experiments.simulate import SimConfig  # lazy: torch (loaded only when used)

    cfg_path = run_dir / "config.json"
    if not cfg_path.exists():
        raise NeuroFedError(f"{run_dir}: no config.json; not a `neurofed simulate` / `neurofed grid` run directory")
    return SimConfig(**json.loads(cfg_path.read_text()))


def held_out_subjects(cfg, job: dict) -> list:
    """The job's held-out subjects, loaded with the run's own preprocessing."""
    from neurofed.trainer.experiments.simulate import load_fold_subjects  # lazy: torch

    return load_fold_subjects(cfg, [int(s[1:]) for s in job["test_subjects"]],
                              PreprocessConfig.from_dict(cfg.preprocess))


def sweep_job(run_dir: Path, job_path: Path, attacks: Sequence[tuple[str, float]], cfg=None) -> dict:
    """Attack one job's saved model on its held-out subjects; returns (and keeps) ``{"per_subject": ...}``.

    Only the ``attack@eps`` keys not already in ``run_dir/sweep/<job>.json`` are computed, and the saved model is
    needed only then: kept results (committed to git, where models are not) are read on a machine without the
    models. ``cfg``: the run's :class:`~neurofed.trainer.experiments.simulate.SimConfig` (read from ``run_dir/config.json``
    when not given).
    """
    from neurofed.trainer.checkpoint import load_checkpoint  # lazy: torch (loaded only when used)
    from neurofed.trainer.experiments.runner import (  # lazy: torch (loaded only when used)
        EvalSpec,
        evaluate_subjects,
    )

    job = json.loads(job_path.read_text())
    out_path = run_dir / "sweep" / job_path.name
    kept = json.loads(out_path.read_text()) if out_path.exists() else {"per_subject": {}}
    have = set.intersection(*(set(r) for r in kept["per_subject"].values())) if kept["per_subject"] else set()
    todo = [(a, e) for a, e in attacks if _key(a, e) not in have]
    if not todo and "bca" in have:
        return kept
    ckpt = job_checkpoint(job_path, job)
    cfg = cfg or run_config(run_dir)
    model, _ = load_checkpoint(ckpt)
    test = held_out_subjects(cfg, job)
    rows = evaluate_subjects(model, EvalSpec(test=test, test_batch=cfg.test_batch, attacks=todo), int(job["seed"]))
    for s, row in rows.items():
        benign = kept["per_subject"].get(s, {}).get("bca")
        if benign is not None and abs(benign - row["bca"]) > 1e-12:
            raise NeuroFedError(f"{job_path}: {s}'s benign BCA {row['bca']:.4f} differs from the sweep's earlier "
                                f"{benign:.4f}; the model or the data changed (delete {out_path} to start again)")
        kept["per_subject"][s] = {**kept["per_subject"].get(s, {}), **row}
    kept.update(seed=job["seed"], fold=job["fold"], checkpoint=str(ckpt))
    out_path.parent.mkdir(exist_ok=True)
    write_json(out_path, kept)
    return kept


def _sweep_job_1thread(run_dir: Path, job_path: Path, attacks: Sequence[tuple[str, float]]) -> dict:
    """:func:`sweep_job` with one torch thread (a pool worker: one job per core)."""
    import torch

    torch.set_num_threads(1)
    return sweep_job(run_dir, job_path, attacks)


def run_jobs(run_dir: Path, seeds: Sequence[int] | None = None) -> list[Path]:
    """The finished jobs of a run (``jobs/seed*_fold*.json``), only those of ``seeds`` when given."""
    jobs = sorted((run_dir / "jobs").glob("seed*_fold*.json"))
    if not jobs:
        raise NeuroFedError(f"{run_dir}: no finished jobs (jobs/seed*_fold*.json) to sweep")
    if seeds is not None:
        jobs = [jp for jp in jobs if job_seed(jp) in seeds]
        if not jobs:
            raise NeuroFedError(f"{run_dir}: no finished job of seeds {list(seeds)}")
    return jobs


def sweep_runs(runs: Sequence[str | os.PathLike], attacks: Sequence[tuple[str, float]],
               on_job: Callable[[Path, Path], None] | None = None, seeds: Sequence[int] | None = None,
               workers: int = 1) -> dict[str, dict]:
    """Sweep every finished job (of ``seeds``) of every run, ``workers`` jobs at a time (processes, one torch
    thread each); write each run's ``sweep.json`` and return each run's summary of ``attacks`` (keyed by run path,
    see :func:`_summarise`). Results per job are the same
    whatever ``workers`` is: each job attacks with its own seed."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    cfgs = {Path(r): run_config(Path(r)) for r in runs}
    # (run, job) pairs in order; a run given twice is swept once
    todo = list(dict.fromkeys((Path(r), jp) for r in runs for jp in run_jobs(Path(r), seeds)))
    done: dict[tuple[Path, Path], dict] = {}
    if workers <= 1:
        for r, jp in todo:
            done[(r, jp)] = sweep_job(r, jp, attacks, cfgs[r])
            if on_job:
                on_job(r, jp)
    else:
        with ProcessPoolExecutor(workers) as ex:
            futs = {ex.submit(_sweep_job_1thread, r, jp, attacks): (r, jp) for r, jp in todo}
            for f in as_completed(futs):
                done[futs[f]] = f.result()
                if on_job:
                    on_job(*futs[f])
    return {str(r): _summarise(r, attacks, [done[(q, jp)] for q, jp in todo if q == r], seeds) for r in dict.fromkeys(
        q for q, _ in todo)}


def job_seed(job: Path) -> int:
    """The seed of a job file ``seedS_foldKK.json``."""
    return int(job.name[4:].split("_")[0])


def sweep_file(run: Path, seeds: Sequence[int] | None = None) -> Path:
    """Where a sweep's summary goes: ``sweep.json`` when it covers every seed the run finished, else
    ``sweep_seeds0_1.json`` (a partial sweep never replaces the summary of all seeds)."""
    if seeds is None or set(seeds) >= {job_seed(jp) for jp in run_jobs(run)}:
        return run / "sweep.json"
    return run / f"sweep_seeds{'_'.join(str(s) for s in sorted(set(seeds)))}.json"


def _summarise(run: Path, attacks: Sequence[tuple[str, float]], results: list[dict],
               seeds: Sequence[int] | None = None) -> dict:
    """Write ``run/sweep.json`` (:func:`sweep_file`) and return this sweep's summary of ``attacks``.

    The file summarises every ``attack@eps`` that all the swept jobs hold, not only this command's (a sweep of
    AutoAttack after one of FGSM keeps FGSM in the summary); the returned dict has this command's attacks only.
    """
    asked = [_key(a, e) for a, e in attacks]
    rows = [row for res in results for row in res["per_subject"].values()]
    held = set.intersection(*(set(r) for r in rows)) if rows else set()
    kept = sorted((k for k in held if "@" in k and k not in asked), key=_pair)
    write_json(sweep_file(run, seeds), _summary(run, asked + kept, results))
    return _summary(run, asked, results)


def _summary(run: Path, keys: list[str], results: list[dict]) -> dict:
    """Per-subject means over seeds and the summary of the ``attack@eps`` ``keys`` (and benign BCA)."""
    from neurofed.trainer.attacks import attack_budgets  # lazy: torch (loaded only when used)
    from neurofed.trainer.experiments.simulate import aggregate_seeds  # lazy: torch (loaded only when used)

    per_seed: dict[int, dict[str, dict]] = {}
    for res in results:
        per_seed.setdefault(int(res["seed"]), {}).update(res["per_subject"])
    per_seed = {sd: {s: {k: row[k] for k in ["bca", *keys]} for s, row in ps.items()} for sd, ps in per_seed.items()}
    per_subject, summary = aggregate_seeds(per_seed)
    pairs = [list(_pair(k)) for k in keys]
    return {"run": str(run), "attacks": pairs, "summary": summary, "per_subject": per_subject,
            "seeds": sorted(per_seed), "jobs": len(results),
            "attack_budgets": attack_budgets(list(dict.fromkeys(a for a, _ in pairs)))}


def sweep_run(run_dir: str | os.PathLike, attacks: Sequence[tuple[str, float]],
              on_job: Callable[[Path, int, int], None] | None = None, seeds: Sequence[int] | None = None) -> dict:
    """Sweep every finished job (of ``seeds``) of ``run_dir``, one at a time; write ``run_dir/sweep.json`` and return
    the summary of ``attacks`` (:func:`_summarise`)."""
    run = Path(run_dir)
    run_config(run)  # a folder that is not a run: said first
    total = len(run_jobs(run, seeds))
    count = iter(range(1, total + 1))
    return sweep_runs([run], attacks, (lambda _r, jp: on_job(jp, next(count), total)) if on_job else None,
                      seeds)[str(run)]


def sweep_table(results: dict[str, dict]) -> str:
    """Markdown: one row per ``attack@eps``, one column per run (mean ± sd over subjects, % of benign),
    and the paired t-test p of each run against the first on the same subjects."""
    from scipy import stats

    names = list(results)
    keys = list(next(iter(results.values()))["summary"])
    head = "| attack@eps (x channel std) | " + " | ".join(names) + " |"
    if len(names) > 1:
        head += " " + " | ".join(f"p {n} vs {names[0]}" for n in names[1:]) + " |"
    lines = [head, "|" + "---|" * (1 + len(names) + max(0, len(names) - 1))]
    for k in keys:
        cells = []
        for n in names:
            ps = results[n]["per_subject"]
            v = 100 * np.array([row[k] for row in ps.values()])
            benign = 100 * np.mean([row["bca"] for row in ps.values()])
            cells.append(f"{v.mean():.1f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.1f}"
                         + ("" if k == "bca" else f" ({v.mean() / benign:.0%})"))
        ref = results[names[0]]["per_subject"]
        for n in names[1:]:
            ps = results[n]["per_subject"]
            subs = sorted(set(ref) & set(ps))
            a, b = np.array([ps[s][k] for s in subs]), np.array([ref[s][k] for s in subs])
            cells.append(f"{stats.ttest_rel(a, b).pvalue:.2g}" if len(subs) > 1 and np.any(a != b) else "-")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sweep_plot(results: dict[str, dict], path: str | os.PathLike) -> None:
    """One panel per attack: mean BCA over subjects against eps (eps 0 = benign), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attacks = sorted({a for r in results.values() for a, _ in r["attacks"]})
    fig, axes = plt.subplots(1, len(attacks), figsize=(3.6 * len(attacks), 3.2), squeeze=False, sharey=True)
    for ax, attack in zip(axes[0], attacks):
        for name, r in results.items():
            eps = sorted({float(e) for a, e in r["attacks"] if a == attack})
            means = [r["summary"]["bca"]["mean"]] + [r["summary"][_key(attack, e)]["mean"] for e in eps]
            ax.plot([0.0, *eps], [100 * m for m in means], marker="o", label=name)
        ax.axhline(50, color="grey", lw=0.8, ls=":")
        ax.set_title(attack)
        ax.set_xlabel("eps (x channel std)")
    axes[0][0].set_ylabel("BCA (%)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)  # --plot docs/results/NEW/plot.png: the folder is made
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["held_out_subjects", "job_checkpoint", "job_seed", "run_config", "run_jobs", "sweep_file",
           "sweep_job", "sweep_plot", "sweep_run", "sweep_runs", "sweep_table", "write_json"]
