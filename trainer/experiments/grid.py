"""``neurofed grid``: a grid of ``neurofed simulate`` runs, one task per (run, seed, fold), on Ray or a process pool.

A grid spec is the line format ``experiments/*.txt`` already use: ``NAME <neurofed simulate options>``
(``#`` comments). Each run goes to ``<results>/<group>/<NAME>/`` exactly as ``neurofed simulate --out``
would write it; finished (seed, fold) jobs (their ``jobs/*.json``) are skipped, so re-running a grid
resumes it, and a run's ``results.json`` is written as soon as all its jobs are done.

Backends: Ray (``pip install 'neurofed[grid]'``; a local Ray by default, ``--address`` joins a cluster)
with ``num_cpus=1`` and one torch thread per task; without Ray, a local process pool. A failed job is
reported with its traceback, the others go on, and the command exits non-zero.
"""

from __future__ import annotations

import logging
import shlex
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

from trainer.errors import NeuroFedError
from trainer.experiments.simulate import SimConfig, _job, plan_jobs, write_results

logger = logging.getLogger("neurofed.trainer")


@dataclass
class GridRun:
    """One line of a grid spec: a named ``neurofed simulate`` configuration and its run directory."""

    name: str
    cfg: SimConfig
    out: Path


@dataclass
class Task:
    """One (run, seed, fold) job."""

    run: str
    fold: int
    test_subjects: list[int]
    seed: int
    path: str


def parse_spec(spec: Path, results: Path, group: str | None = None,
               only: list[str] | None = None) -> list[GridRun]:
    """Read a grid spec into runs (options parsed exactly as ``neurofed simulate`` parses them).

    Raises
    ------
    NeuroFedError
        Unknown option or bad value, naming the spec line.
    """
    import typer.main

    from trainer.cli import build_sim_config, simulate, with_strategy_options

    if not spec.is_file():
        raise NeuroFedError(f"{spec}: grid spec not found")
    app = typer.Typer()
    app.command()(with_strategy_options(simulate))
    cmd = typer.main.get_command(app)
    group = group or spec.stem
    runs = []
    for n, line in enumerate(spec.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, opts = line.strip().partition(" ")
        if only and name not in only:
            continue
        try:
            args = shlex.split(opts)
            if "--out" in args or any(a.startswith("--out=") for a in args):
                raise NeuroFedError("--out is set by the grid (<results>/<group>/<NAME>)")
            with cmd.make_context("simulate", args) as ctx:
                cfg = build_sim_config(ctx.params)
        except (typer.TyperException, ValueError, NeuroFedError) as exc:  # TyperException: click's usage errors
            msg = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            raise NeuroFedError(f"{spec}:{n} ({name}): {msg}") from None
        runs.append(GridRun(name, cfg, results / group / name))
    if len({r.name for r in runs}) != len(runs):
        raise NeuroFedError(f"{spec}: run names must be unique")
    return runs


def plan(runs: list[GridRun]) -> tuple[list[Task], dict[str, list[dict]]]:
    """Tasks still to run and, per run, its finished jobs (read from ``jobs/*.json``)."""
    tasks, done = [], {}
    for r in runs:
        todo, finished = plan_jobs(r.cfg, r.out)
        done[r.name] = finished
        tasks += [Task(r.name, k, fold, seed, p) for k, fold, seed, p in todo]
    tasks.sort(key=lambda t: t.seed)  # seed-major (stable): a grid stopped early leaves whole seeds, not whole runs
    return tasks, done


def run_task(cfg_dict: dict, task: Task, job_fn: Callable[..., dict] = _job) -> tuple[Task, dict | None, str | None]:
    """Run one job with one torch thread; never raises: returns (task, result, traceback or None)."""
    try:
        return task, job_fn(cfg_dict, task.fold, task.test_subjects, task.seed, task.path, 1), None
    except Exception:  # noqa: BLE001 - a failed job is reported with its traceback, the grid goes on
        return task, None, traceback.format_exc()


def _ray_results(runs: dict[str, GridRun], tasks: list[Task], address: str | None, workers: int,
                 job_fn: Callable[..., dict]) -> Iterator[tuple[Task, dict | None, str | None]]:
    import ray

    env = {"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=False)
    else:
        ray.init(num_cpus=workers, runtime_env=env, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_task)
        pending = [remote.remote(asdict(runs[t.run].cfg), t, job_fn) for t in tasks]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                yield ray.get(ready[0])
            except Exception:  # noqa: BLE001 - a worker lost (node died): report, keep the grid going
                yield Task("?", -1, [], -1, ""), None, traceback.format_exc()
    finally:
        ray.shutdown()


def _pool_results(runs: dict[str, GridRun], tasks: list[Task], workers: int,
                  job_fn: Callable[..., dict]) -> Iterator[tuple[Task, dict | None, str | None]]:
    if workers <= 1:
        for t in tasks:
            yield run_task(asdict(runs[t.run].cfg), t, job_fn)
        return
    from concurrent.futures import as_completed

    with ProcessPoolExecutor(workers) as ex:
        futs: list[Future] = [ex.submit(run_task, asdict(runs[t.run].cfg), t, job_fn) for t in tasks]
        for f in as_completed(futs):
            yield f.result()


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def run_grid(
    runs: list[GridRun], backend: str = "auto", address: str | None = None, workers: int = 1,
    on_event: Callable[[Task, dict | None, str | None, int, int], None] | None = None,
    job_fn: Callable[..., dict] = _job,
) -> dict[str, list[str]]:
    """Run every unfinished (run, seed, fold) job; write each run's results.json once all its jobs are done.

    Parameters
    ----------
    backend : str
        ``ray``, ``pool`` (local processes; ``workers`` 1 = in this process) or ``auto`` (Ray if installed).
    address : str or None
        Ray cluster address (``ray start --head`` prints it); None starts a local Ray with ``workers`` CPUs.
    on_event : callable
        Called after each job with (task, result or None, traceback or None, finished, total).
    job_fn : callable
        The job (tests inject a stand-in); :func:`trainer.experiments.simulate._job` by default.

    Returns
    -------
    dict
        ``{"finished": [run names with results.json], "failed": [tracebacks]}``.
    """
    by_name = {r.name: r for r in runs}
    tasks, done = plan(runs)
    if backend == "auto":
        backend = "ray" if ray_available() else "pool"
    if backend not in ("ray", "pool"):
        raise NeuroFedError(f"--backend {backend!r}: use auto, ray or pool")
    if backend == "ray" and not ray_available():
        raise NeuroFedError("--backend ray needs Ray: pip install 'neurofed[grid]'")
    failed: list[str] = []
    finished: list[str] = []
    remaining = {name: sum(t.run == name for t in tasks) for name in by_name}
    for name, left in remaining.items():  # runs already complete: a re-run only re-summarises them
        if left == 0:
            write_results(by_name[name].cfg, by_name[name].out, done[name])
            finished.append(name)
    results = (_ray_results(by_name, tasks, address, workers, job_fn) if backend == "ray"
               else _pool_results(by_name, tasks, workers, job_fn))
    for n, (task, result, tb) in enumerate(results, 1):
        if tb is not None:
            failed.append(f"{task.run} seed {task.seed} fold {task.fold}:\n{tb}")
        else:
            done[task.run].append(result)
            remaining[task.run] -= 1
            if remaining[task.run] == 0:
                write_results(by_name[task.run].cfg, by_name[task.run].out, done[task.run])
                finished.append(task.run)
        if on_event:
            on_event(task, result, tb, n, len(tasks))
    return {"finished": finished, "failed": failed}


def grid(
    spec: Annotated[Path, typer.Argument(help="grid spec: lines 'NAME <neurofed simulate options>'")],
    group: Annotated[str | None, typer.Option(help="results sub-folder (default: the spec's name)")] = None,
    results: Annotated[Path, typer.Option(help="results root")] = Path("experiments/results"),
    only: Annotated[str | None, typer.Option(help="only these runs, e.g. 'fedbs,safe'")] = None,
    backend: Annotated[str, typer.Option(help="auto (Ray if installed), ray, or pool")] = "auto",
    address: Annotated[str | None, typer.Option(help="Ray cluster address, e.g. 10.0.0.1:6379 (default: local Ray)")]
    = None,
    workers: Annotated[int, typer.Option(help="local CPUs (Ray) or processes (pool) to use")] = 1,
) -> None:
    """Run a grid of simulate runs as one task per (run, seed, fold); re-running resumes it."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from trainer.cli import console

    runs = parse_spec(spec, results, group, [x.strip() for x in only.split(",")] if only else None)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console) as prog:
        bar = prog.add_task(f"grid {spec.name}", total=None)

        def on_event(task: Task, result: dict | None, tb: str | None, n: int, total: int) -> None:
            prog.update(bar, completed=n, total=total)
            if tb is not None:
                prog.console.print(f"[red]FAILED[/red] {task.run} seed {task.seed} fold {task.fold}\n{tb}")
            else:
                bcas = [r["bca"] for r in result["per_subject"].values()]
                msg = f"BCA {100 * sum(bcas) / len(bcas):.1f}%" if bcas else "trained"
                prog.console.log(f"{task.run} seed {task.seed} fold {task.fold}: {msg} ({result['seconds']:.0f} s)")

        out = run_grid(runs, backend, address, workers, on_event)
    for name in out["finished"]:
        console.print(f"{name}: {results / (group or spec.stem) / name / 'results.json'}")
    if out["failed"]:
        raise NeuroFedError(f"{len(out['failed'])} job(s) failed (tracebacks above); re-run to retry only those")
