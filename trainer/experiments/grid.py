"""``neurofed grid``: a grid of ``neurofed simulate`` runs, one task per (run, seed, fold), on Ray or a process pool.

A grid spec is either the line format ``NAME <neurofed simulate options>`` (``.txt``, ``#`` comments) or a
study's ``spec.toml`` (one table per grid, see :func:`spec_entries`). Each run goes to
``<results>/<group>/<NAME>/`` exactly as ``neurofed simulate --out``
would write it; finished (seed, fold) jobs (their ``jobs/*.json``) are skipped, so re-running a grid
resumes it, and a run's ``results.json`` is written as soon as all its jobs are done. ``--seeds`` runs only those
seeds' jobs (e.g. the first seed of a costly run first); a run's ``results.json`` still waits for all its spec seeds.

Backends: Ray (``pip install 'neurofed[grid]'``; a local Ray by default, ``--address`` joins a cluster)
with ``num_cpus=1`` and one torch thread per task; without Ray, a local process pool. A failed job is
reported with its traceback, the others go on, and the command exits non-zero.

``--reproduce`` re-runs a grid's finished jobs (``--seeds`` picks which) in a scratch folder and checks each against
the committed job, subject by subject: a reproducibility check, and the way to get a run's saved models back on a
machine that has only its JSONs (models are not kept in git) -- when a job reproduces, its models are placed beside
the committed job; when it does not, the committed job is left untouched and the differences are reported.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
import tomllib
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neurofed.trainer.atomic import atomic_write_bytes
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments.simulate import (
    SimConfig,
    _job,
    job_paths,
    plan_jobs,
    run_differences,
    write_results,
)
from neurofed.trainer.experiments.spec import SpecError, options_of_line, parse_options

if TYPE_CHECKING:
    pass

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


def spec_entries(spec: Path, group: str | None = None) -> list[tuple[str, str, dict[str, Any], str]]:
    """The runs a grid spec declares: (group, run name, option values by field name, where) per run.

    Two formats, read alike:

    * ``.txt``: lines ``NAME <neurofed simulate options>`` (``#`` comments); the group is ``group`` or the
      file's stem.
    * ``.toml`` (the studies' specs): one table per grid, named by its group (the results sub-folder), with
      ``common`` options shared by its runs and one ``runs.NAME`` table of options per run (the field names of
      :class:`neurofed.trainer.experiments.spec.SimOptions`, e.g. ``algorithm = "safe"``, ``rounds = 50``,
      ``seeds = "0,1,2"``); a run's own options override ``common``. ``group`` picks one grid of the file.

    Raises
    ------
    NeuroFedError
        Missing file, unreadable TOML, an unknown ``group``, or a malformed line, naming the spec.
    """
    if not spec.is_file():
        raise NeuroFedError(f"{spec}: grid spec not found")
    out: list[tuple[str, str, dict[str, Any], str]] = []
    if spec.suffix == ".toml":
        try:
            doc = tomllib.loads(spec.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise NeuroFedError(f"{spec}: not a TOML grid spec ({exc})") from None
        grids = {k: v for k, v in doc.items() if isinstance(v, dict)}
        if group is not None:
            if group not in grids:
                raise NeuroFedError(f"{spec}: no grid {group!r} (it has: {', '.join(grids) or 'none'})")
            grids = {group: grids[group]}
        for g, table in grids.items():
            common = table.get("common", {})
            runs = table.get("runs", {})
            if not isinstance(runs, dict) or not isinstance(common, dict) or set(table) - {"common", "runs"}:
                raise NeuroFedError(f"{spec} [{g}]: a grid holds only 'common' and 'runs.NAME' tables")
            for name, opts in runs.items():
                if not isinstance(opts, dict):
                    raise NeuroFedError(f"{spec} [{g}.runs.{name}]: expected a table of options")
                out.append((g, name, {**common, **opts}, f"{spec} [{g}.runs.{name}]"))
        return out
    group = group or spec.stem
    for n, line in enumerate(spec.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, opts = line.strip().partition(" ")
        try:
            values = options_of_line(opts)
        except SpecError as exc:
            raise NeuroFedError(f"{spec}:{n} ({name}): {exc}") from None
        out.append((group, name, values, f"{spec}:{n} ({name})"))
    return out


def parse_spec(spec: Path, results: Path, group: str | None = None,
               only: list[str] | None = None) -> list[GridRun]:
    """Read a grid spec (``.txt`` lines or ``.toml``, see :func:`spec_entries`) into runs: each run's options are
    validated by the schema of ``neurofed simulate``'s options
    (:class:`neurofed.trainer.experiments.spec.SimOptions`), exactly as ``neurofed simulate`` reads them. A run
    goes to ``results/<group>/<NAME>``; when a spec holds several grids, runs are named ``<group>/<NAME>``
    (``only`` takes either form).

    Raises
    ------
    NeuroFedError
        Unknown option or bad value, naming the spec line.
    """
    entries = spec_entries(spec, group)
    several = len({g for g, *_ in entries}) > 1
    runs = []
    for g, name, values, where in entries:
        full = f"{g}/{name}" if several else name
        if only and name not in only and full not in only:
            continue
        try:
            if "out" in values:
                raise NeuroFedError("--out is set by the grid (<results>/<group>/<NAME>)")
            cfg = parse_options(values).to_sim_config(warn=logger.warning)
        except (SpecError, NeuroFedError) as exc:
            raise NeuroFedError(f"{where}: {exc}") from None
        runs.append(GridRun(full, cfg, results / g / name))
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


#: beside a running job's JSON: its last finished round (``round``, ``rounds``, ``loss``, ``started``, ``now``)
PROGRESS_SUFFIX = ".progress"


def progress_path(job_path: str | Path) -> Path:
    """Where a running job reports its rounds (removed when the job ends)."""
    p = Path(job_path)
    return p.with_suffix(PROGRESS_SUFFIX)


def _round_writer(job_path: str) -> Callable[[int, int, int, int, dict], None]:
    started = time.time()
    where = progress_path(job_path)

    def on_round(fold: int, seed: int, r: int, total: int, point: dict) -> None:
        info = {"round": r, "rounds": total, "loss": point["loss"], "started": started, "now": time.time()}
        atomic_write_bytes(where, json.dumps(info).encode())

    return on_round


def run_task(cfg_dict: dict, task: Task, job_fn: Callable[..., dict] = _job) -> tuple[Task, dict | None, str | None]:
    """Run one job with one torch thread; never raises: returns (task, result, traceback or None).

    The simulation's job reports each round in a file beside its JSON (:func:`progress_path`), which the grid's
    progress display reads (any backend whose workers share this file system: the pool, a local Ray)."""
    try:
        kw = {"on_round": _round_writer(task.path)} if job_fn is _job else {}
        return task, job_fn(cfg_dict, task.fold, task.test_subjects, task.seed, task.path, 1, **kw), None
    except Exception:  # noqa: BLE001 - a failed job is reported with its traceback, the grid goes on
        return task, None, traceback.format_exc()
    finally:
        progress_path(task.path).unlink(missing_ok=True)


def running_jobs(runs: Sequence[GridRun]) -> dict[str, dict]:
    """The progress files of the jobs running now: ``{"<run> <job>": {"round", "rounds", "loss", ...}}``."""
    out = {}
    for r in runs:
        for p in sorted((r.out / "jobs").glob("*" + PROGRESS_SUFFIX)):
            try:
                out[f"{r.name} {p.name[: -len(PROGRESS_SUFFIX)]}"] = json.loads(p.read_text())
            except (OSError, ValueError):  # finished and removed, or being replaced: next poll
                continue
    return out


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
    job_fn: Callable[..., dict] = _job, planned: tuple[list[Task], dict[str, list[dict]]] | None = None,
    seeds: Sequence[int] | None = None,
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
        The job (tests inject a stand-in); :func:`neurofed.trainer.experiments.simulate._job` by default.
    planned : tuple or None
        ``plan(runs)`` when the caller has already made it (planned once, run as planned).
    seeds : sequence of int or None
        Run only these seeds' jobs; a run's ``results.json`` is still written only once every job of its
        spec (all its seeds) is finished.

    Returns
    -------
    dict
        ``{"finished": [run names with results.json], "failed": [tracebacks]}``.
    """
    by_name = {r.name: r for r in runs}
    tasks, done = planned or plan(runs)
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
    if seeds is not None:
        tasks = [t for t in tasks if t.seed in seeds]  # `remaining` still counts the other seeds' jobs
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


def compare_jobs(new: dict, old: dict, tol: float = 1e-9, keys: Sequence[str] | None = None) -> list[str]:
    """What differs between two runs of one (run, seed, fold) job: held-out subjects and their numbers.

    Every numeric entry of ``per_subject`` (benign BCA and each attack's) is compared within ``tol``; with ``keys``
    only those entries (e.g. ``["bca"]``).

    Returns
    -------
    list of str
        One line per difference (empty when the job reproduces), e.g. ``"S031 bca 0.7813 vs 0.7594"``.
    """
    a, b = new.get("per_subject", {}), old.get("per_subject", {})
    if sorted(a) != sorted(b):
        return [f"held-out subjects differ: {sorted(set(a) ^ set(b))}"]
    out = []
    for s in sorted(a):
        for k in sorted(set(a[s]) | set(b[s])) if keys is None else keys:
            x, y = a[s].get(k), b[s].get(k)
            if not (isinstance(x, (int, float)) and isinstance(y, (int, float)) and abs(x - y) <= tol):
                out.append(f"{s} {k} {x if not isinstance(x, float) else round(x, 4)} vs "
                           f"{y if not isinstance(y, float) else round(y, 4)}")
    return out


def select_seeds(runs: list[GridRun], seeds: list[int]) -> list[GridRun]:
    """The runs restricted to ``seeds``.

    Raises
    ------
    NeuroFedError
        A seed that is not among some run's spec seeds.
    """
    out = []
    for r in runs:
        missing = [s for s in seeds if s not in r.cfg.seeds]
        if missing:
            raise NeuroFedError(f"{r.name}: seed(s) {missing} are not in its spec line's --seeds {r.cfg.seeds}")
        out.append(GridRun(r.name, dataclasses.replace(r.cfg, seeds=list(seeds)), r.out))
    return out


def committed_metrics(runs: list[GridRun]) -> set[str]:
    """The per-subject metric names (``bca``, ``fgsm@0.03``, ...) held by the runs' committed job JSONs."""
    names: set[str] = set()
    for r in runs:
        for *_, p in job_paths(r.cfg, r.out):
            if p.is_file():
                for entry in json.loads(p.read_text()).get("per_subject", {}).values():
                    names |= set(entry)
    return names


@dataclass
class Check:
    """One re-run job against its committed twin."""

    run: str
    seed: int
    fold: int
    status: str  # "equal", "matches" (the --match metrics equal, others differ), "differs" or "failed"
    details: list[str]
    placed: list[str]  # model files copied beside the committed job


def check_job(run: GridRun, result: dict, match: Sequence[str] | None = None) -> Check:
    """Compare a re-run job with the committed one in ``run.out``; place its models there when equal.

    With ``match`` (metric names, e.g. ``["bca"]``) the models are also placed when only other metrics differ:
    status ``"matches"``, the other differences in ``details``. The committed job JSON is never changed.
    """
    name = f"seed{result['seed']}_fold{result['fold']:02d}"
    committed = run.out / "jobs" / f"{name}.json"
    old = json.loads(committed.read_text())
    diffs = compare_jobs(result, old)
    status = "equal"
    if diffs:
        if not match or compare_jobs(result, old, keys=match):
            return Check(run.name, result["seed"], result["fold"], "differs", diffs, [])
        status = "matches"
    placed = []
    for ckpt in result.get("checkpoints", []):
        dest = committed.parent / Path(ckpt).name
        shutil.copyfile(ckpt, dest)
        placed.append(str(dest))
    return Check(run.name, result["seed"], result["fold"], status, diffs, placed)


def reproduce_grid(
    runs: list[GridRun], scratch: Path, backend: str = "auto", address: str | None = None, workers: int = 1,
    on_check: Callable[[Check, int, int], None] | None = None, job_fn: Callable[..., dict] = _job,
    match: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
) -> list[Check]:
    """Re-run ``runs``' jobs in ``scratch`` and check each against the committed job (see :func:`check_job`;
    ``match`` is passed on to it); with ``seeds`` only those seeds' jobs (each one of every run's spec seeds).

    ``scratch`` is resumable like any grid root: jobs already finished there are checked without re-running. Its
    twin runs keep their spec's seeds, so one scratch folder serves one seed now and another later.

    Raises
    ------
    NeuroFedError
        A committed run folder holds a configuration other than its spec line's (nothing to reproduce), or a
        ``match`` name no committed job holds (a typo would otherwise report every job as differing).
    """
    chosen = select_seeds(runs, list(seeds)) if seeds is not None else runs  # raises on a seed not in a spec
    twins = {}
    for r, c in zip(runs, chosen):
        cfg_path = r.out / "config.json"
        engine = r.cfg.engine
        if cfg_path.is_file():
            spec_cfg = json.loads(json.dumps(dataclasses.asdict(r.cfg)))
            old = json.loads(cfg_path.read_text())
            spec_cfg["seeds"] = old.get("seeds", spec_cfg["seeds"])  # --seeds picks some of the run's seeds
            diffs = run_differences(old, spec_cfg)
            if diffs:
                raise NeuroFedError(f"{r.out} was run with another configuration than {r.name}'s spec line "
                                    f"({'; '.join(diffs[:3])}): nothing to reproduce")
            # the committed jobs' engine (runs before engines existed: sequential): bit-for-bit needs the same one
            engine = old.get("engine", "sequential")
        unfinished = [p.name for *_, p in job_paths(c.cfg, r.out) if not p.is_file()]
        if unfinished:
            raise NeuroFedError(f"{r.name}: {len(unfinished)} job(s) not finished in {r.out} (e.g. {unfinished[0]}): "
                                "nothing to reproduce there; run the grid without --reproduce to finish them")
        twins[r.name] = GridRun(r.name, dataclasses.replace(r.cfg, engine=engine), scratch / r.out.parent.name / r.out.name)
    if match and (unknown := sorted(set(match) - (known := committed_metrics(chosen)))):
        raise NeuroFedError(f"--match {','.join(unknown)}: no committed job has that metric (they hold: "
                            f"{', '.join(sorted(known))})")
    checks: list[Check] = []
    planned = tasks, done = plan(list(twins.values()))
    wanted = {s for c in chosen for s in c.cfg.seeds}
    finished = {name: [j for j in v if j["seed"] in wanted] for name, v in done.items()}  # scratch jobs to check
    total = sum(t.seed in wanted for t in tasks) + sum(map(len, finished.values()))

    def record(c: Check) -> None:
        checks.append(c)
        if on_check:
            on_check(c, len(checks), total)

    by_name = {r.name: r for r in runs}
    for name, jobs in finished.items():
        for result in sorted(jobs, key=lambda j: (j["seed"], j["fold"])):
            record(check_job(by_name[name], result, match))

    def on_event(task: Task, result: dict | None, tb: str | None, n: int, _total: int) -> None:
        if tb is not None:
            record(Check(task.run, task.seed, task.fold, "failed", [tb], []))
        else:
            record(check_job(by_name[task.run], result, match))

    run_grid(list(twins.values()), backend, address, workers, on_event, job_fn, planned, seeds=sorted(wanted))
    return checks


