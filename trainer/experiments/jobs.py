"""The finished jobs of saved runs: which model a job saved, and every run's jobs by fold (the members of an
ensemble, the teachers of a distillation). Reads files only: the experiment modules that train import it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from neurofed.trainer.errors import NeuroFedError


def job_checkpoint(job_path: Path, job: dict) -> Path:
    """The model a finished job saved (``--save-models``); a clear error when it saved none or several."""
    ckpts = job.get("checkpoints") or ([job["checkpoint"]] if "checkpoint" in job else [])
    if not ckpts:
        raise NeuroFedError(f"{job_path}: the job saved no model (the run was trained without --save-models); "
                            "train it again with --save-models into a new --out")
    if len(ckpts) > 1:
        raise NeuroFedError(f"{job_path}: one model per device profile; hierarchical runs are not supported here")
    ckpt = Path(ckpts[0])
    if not ckpt.exists():  # the run directory was moved: the model lies beside the job's JSON
        ckpt = job_path.with_suffix(".safetensors")
    if not ckpt.exists():
        raise NeuroFedError(f"{job_path}: its model {ckpts[0]} is missing (nor beside the job's JSON)")
    return ckpt



def fold_members(runs: Sequence[Path], seeds: Sequence[int] | None) -> dict[int, list[tuple[Path, dict]]]:
    """fold -> [(job path, job)] over every run and chosen seed; checks the members of a fold agree."""
    folds: dict[int, list[tuple[Path, dict]]] = {}
    for run in runs:
        jobs = sorted((run / "jobs").glob("seed*_fold*.json"))
        if not jobs:
            raise NeuroFedError(f"{run}: no finished jobs (jobs/seed*_fold*.json) to ensemble")
        for jp in jobs:
            job = json.loads(jp.read_text())
            if seeds is not None and int(job["seed"]) not in seeds:
                continue
            folds.setdefault(int(job["fold"]), []).append((jp, job))
    if not folds:
        raise NeuroFedError(f"no finished job of seeds {list(seeds or [])} in {', '.join(map(str, runs))}")
    for fold, members in folds.items():
        first = members[0][1]["test_subjects"]
        for jp, job in members[1:]:
            if job["test_subjects"] != first:
                raise NeuroFedError(f"fold {fold}: {jp} holds out {job['test_subjects']}, but {members[0][0]} holds "
                                    f"out {first}; the runs were split differently (fold seed or subjects)")
    return folds


__all__ = ["fold_members", "job_checkpoint"]
