"""Commands that trainer/ adds to ``neurofed``: simulate, algorithms, combine, data, report, classical, grid, sweep,
ensemble, and the data/training benchmarks.

Typer adapters only: options are parsed here (with :mod:`neurofed.trainer.options`) and the work is done by the lab's plain
functions (:mod:`neurofed.trainer.experiments`, :mod:`neurofed.trainer.report`, :mod:`neurofed.trainer.bench`).
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from neurofed.trainer import bench as trainer_bench
from neurofed.trainer.data import resolve_data_dir
from neurofed.trainer.data.eegmmidb import check_files, download
from neurofed.trainer.errors import DataError, NeuroFedError, run_cli
from neurofed.trainer.fl.strategies import ALGORITHMS, PARAMS, docs_tables
from neurofed.trainer.options import (
    algorithm_help,
    build_sim_config,
    console,
    parse_attacks,
    parse_int_list,
    parse_name_list,
    parse_subjects,
    preprocess_from_options,
    preset_help,
    print_results,
    with_strategy_options,
)

if TYPE_CHECKING:
    from neurofed.trainer.experiments.grid import Check, GridRun, Task

# The lab's modules (report: scipy.stats; experiments: sklearn, pyriemann, Ray) load inside the commands that use
# them: every `neurofed` process imports this module, and a coordinator or an export should not pay for them.


def simulate(
    algorithm: Annotated[str, typer.Option(help=algorithm_help())] = "fedbs",
    preset: Annotated[str, typer.Option(help=preset_help())] = "published",
    model: Annotated[str, typer.Option(
        help="eegnet, eegnet_crop (cropped decoding), shallow, deep, itnet (EEG-ITNet), fleeg_eegnet, fleeg_proj_eegnet, fleeg_fixmap_eegnet")] = "eegnet",
    subjects: Annotated[str, typer.Option(help="'all' or e.g. '1-10,12'")] = "all",
    protocol: Annotated[str, typer.Option(help="loso, kfold:K (subject groups), or none")] = "loso",
    test_subjects: Annotated[str | None, typer.Option(help="'none': no held-out subject; train on all and save the global checkpoint")] = None,
    rounds: Annotated[int | None, typer.Option(help="communication rounds (CT: epochs) [default: preset's]")] = None,
    fraction: Annotated[float | None, typer.Option(help="fraction of clients per round (floor) [default: preset's]")] = None,
    local_epochs: Annotated[int | None, typer.Option(help="local epochs per round [default: preset's]")] = None,
    batch_size: Annotated[int | None, typer.Option(help="client batch size [default: preset's]")] = None,
    ct_batch_size: Annotated[int | None, typer.Option(help="CT batch size [default: preset's]")] = None,
    lr: Annotated[float | None, typer.Option(help="SGD learning rate [default: preset's]")] = None,
    momentum: Annotated[float | None, typer.Option(help="[default: preset's]")] = None,
    weight_decay: Annotated[float | None, typer.Option(help="[default: preset's]")] = None,
    augment: Annotated[str | None, typer.Option(
        help="data augmentation in local training only, seeded: 'mi' (shift:0.05,scale:0.1,dropout:0.1,mixup:0.2) "
             "or NAME:VALUE,... with NAME in mirror (left/right channel reflection, label swapped), shift, scale, noise, "
             "dropout, mixup (neurofed.trainer.fl.augment) "
             "[default: off]")] = None,
    distill_from: Annotated[str | None, typer.Option(
        help="ensemble distillation: comma list of run directories trained with --save-models on the same subjects, "
             "folds and preprocessing; each client trains on soft targets mixing its labels with the mean softmax of "
             "every saved model of its fold (neurofed.trainer.fl.distill) [default: off]")] = None,
    distill_weight: Annotated[float, typer.Option(
        help="distillation: weight w of the teachers' probabilities in the soft targets (1 - w on the labels)")] = 0.5,
    seeds: Annotated[str, typer.Option(help="comma list of seeds")] = "0",
    channels: Annotated[str | None, typer.Option(help="all, sensorimotor21, or a comma list [default: preset's]")] = None,
    resample: Annotated[float | None, typer.Option(help="Hz; 0 keeps 160 Hz [default: preset's]")] = None,
    ea: Annotated[bool, typer.Option("--ea/--no-ea", help="per-subject Euclidean alignment")] = True,
    fmin: Annotated[float, typer.Option()] = 8.0,
    fmax: Annotated[float, typer.Option()] = 30.0,
    tmin: Annotated[float, typer.Option()] = 0.0,
    tmax: Annotated[float, typer.Option()] = 4.0,
    attack: Annotated[str | None, typer.Option(help="e.g. 'fgsm:0.03,pgd:0.03' (eps x per-channel std)")] = None,
    byzantine: Annotated[str | None, typer.Option(help="simulated attackers FRACTION:ATTACK[:FACTOR], ATTACK in scale, "
                                                       "signflip, labelflip, huge (e.g. 0.2:scale:10)")] = None,
    test_batch: Annotated[int, typer.Option(help="test batch size (batch-specific BN)")] = 8,
    eval_every: Annotated[int, typer.Option(help="evaluate the global model every N rounds (learning curve)")] = 10,
    workers: Annotated[int, typer.Option(help="parallel processes over folds/seeds")] = 1,
    threads: Annotated[int | None, typer.Option(help="torch threads per worker (default: $OMP_NUM_THREADS, else cores / workers)")] = None,
    fold_seed: Annotated[int, typer.Option(help="seed of the k-fold subject grouping")] = 0,
    folds: Annotated[str | None, typer.Option(help="run only these fold indices, e.g. '0,1' (a pilot)")] = None,
    save_models: Annotated[bool, typer.Option(
        help="also save each (fold, seed) job's trained global model beside its JSON (jobs/seedS_foldKK.safetensors, "
             "a few kB) so `neurofed sweep` can attack it later without training again")] = False,
    engine: Annotated[str, typer.Option(
        help="local training: vectorised (a round's clients trained together, equal to sequential to float "
             "tolerance, faster; falls back to sequential, saying so once, for what it does not know) or sequential "
             "(one client after the other, as an edge client trains)")] = "vectorised",
    mode: Annotated[str, typer.Option(
        help="sync (rounds of a selected cohort) or async (buffered asynchronous aggregation, FedBuff style: clients "
             "train when online, K updates per aggregation, staleness-weighted; --rounds counts aggregations)",
        rich_help_panel="Asynchronous mode")] = "sync",
    buffer_k: Annotated[int, typer.Option(help="async: accepted updates per aggregation (K)",
                                          rich_help_panel="Asynchronous mode")] = 10,
    max_staleness: Annotated[int, typer.Option(help="async: updates more versions old than this are rejected (stale)",
                                               rich_help_panel="Asynchronous mode")] = 10,
    online_fraction: Annotated[float, typer.Option(help="async: long-run fraction of time each client is online",
                                                   rich_help_panel="Asynchronous mode")] = 0.3,
    session_mean: Annotated[float, typer.Option(help="async: mean online session (exponential; gaps exponential with "
                                                     "mean session x (1-F)/F), in local-training times",
                                                rich_help_panel="Asynchronous mode")] = 10.0,
    train_time: Annotated[float, typer.Option(help="async: duration of one local training (simulated time units)",
                                              rich_help_panel="Asynchronous mode")] = 1.0,
    async_server_lr: Annotated[float, typer.Option(help="async: server step on the weighted mean update",
                                                   rich_help_panel="Asynchronous mode")] = 1.0,
    async_reveal: Annotated[int, typer.Option(help="async: trials newly recorded per session (0: the whole store "
                                                   "from the start)", rich_help_panel="Asynchronous mode")] = 0,
    async_window: Annotated[int, typer.Option(help="async: train on the newest N trials of the store (0: all)",
                                              rich_help_panel="Asynchronous mode")] = 0,
    partition: Annotated[str, typer.Option(help="clients of the training subjects: subject (one each), "
                                           "dirichlet:BETA[:K] (label skew within subjects, K clients each), "
                                           "missing-class; held-out subjects stay whole")] = "subject",
    data_dir: Annotated[str | None, typer.Option(
        help="EEGMMIDB folder (default: $NEUROFED_DATA, else ../shared/data, found where the jobs run; only a folder "
             "given here is written into the run's config.json)")] = None,
    out: Annotated[Path, typer.Option(help="run directory (re-running resumes it)")] = Path("runs/simulate"),
    profiles: Annotated[str | None, typer.Option(
        help="device profiles: 'lab64,research21,unicorn8' (seeded balanced split of the subjects) or "
             "'unicorn8:1-10;research21:11-20' (explicit); names of trainer/data/profiles/*.json or .json paths",
        rich_help_panel="Device profiles")] = None,
    profile_seed: Annotated[int, typer.Option(help="seed of the split of subjects over --profiles",
                                              rich_help_panel="Device profiles")] = 0,
    profile_channels: Annotated[str, typer.Option(
        help="own: each client its profile's channels (needs a hierarchical strategy); intersection: the "
             "channels every profile has; interpolate: every client's channels mapped onto the 21 sensorimotor "
             "channels by the fixed spherical-spline matrix", rich_help_panel="Device profiles")] = "own",
    only_profile: Annotated[str | None, typer.Option(
        help="train and evaluate only this profile's subjects (same folds)", rich_help_panel="Device profiles")] = None,
    noise_seed: Annotated[int, typer.Option(help="seed of the profiles' additive noise",
                                            rich_help_panel="Device profiles")] = 0,
    **strategy_params: object,
) -> None:
    """Leave-one-subject-out (or k-fold / no held-out) CT or federated training on real EEG.

    Defaults are the published protocol (--preset published); every option given explicitly overrides
    the preset. Strategy parameters (generated from the algorithm registry) override the algorithm's
    own settings for ablations and compositions, e.g. --algorithm fedbs --sam-rho 0.
    """

    opts = {k: v for k, v in locals().items() if k != "strategy_params"}
    cfg = build_sim_config({**opts, **strategy_params})
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} {task.fields[unit]}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console) as prog:
        task = prog.add_task(f"{algorithm} {cfg.protocol}", total=None, unit="jobs")
        rounds_task = prog.add_task("rounds", total=None, visible=workers <= 1, unit="rounds")

        def on_round(fold: int, seed: int, r: int, total: int, point: dict) -> None:
            if r == 1:  # a new job: its own time estimate
                prog.reset(rounds_task, total=total)
            bca = f" held-out BCA {100 * point['bca']:.1f}%" if "bca" in point else ""
            prog.update(rounds_task, completed=r, total=total,
                        description=f"fold {fold} seed {seed} round {r}/{total} loss {point['loss']:.3f}{bca}")

        def on_done(job: dict, n: int, total: int) -> None:
            prog.update(task, completed=n, total=total)
            bcas = [r["bca"] for r in job["per_subject"].values()]
            msg = f"fold {job['fold']} seed {job['seed']}: " + (
                f"BCA {100 * sum(bcas) / len(bcas):.1f}%" if bcas else "trained (no held-out subject)")
            prog.console.log(msg + f" ({job['seconds']:.0f} s)")

        from neurofed.trainer.experiments.simulate import run_simulation  # lazy (after locals() above)

        results = run_simulation(cfg, out, workers, on_done, threads, on_round)
    if results["per_subject"]:
        print_results(results)
    for c in results["checkpoints"]:
        console.print(f"global model checkpoint: {c}")
    console.print(f"results: {out / 'results.json'}")


def algorithms(markdown: Annotated[bool, typer.Option(help="print the docs' markdown tables")] = False) -> None:
    """The registered federated algorithms and their parameters (from trainer/fl/strategies.py)."""

    if markdown:
        print(docs_tables())
        return

    t = Table(title="algorithms (neurofed simulate --algorithm NAME; federation.toml [federation] strategy)")
    for c in ("name", "settings", "what it does"):
        t.add_column(c)
    for a in ALGORITHMS.values():
        t.add_row(a.name, ", ".join(f"{k}={v}" for k, v in a.settings.items()), a.summary)
    console.print(t)
    t = Table(title="strategy parameters (--name in simulate; [federation] strategy_overrides)")
    for c in ("name", "type", "off/default", "meaning"):
        t.add_column(c)
    for p in PARAMS.values():
        t.add_row(p.name, p.type.__name__, str(p.default), p.help)
    console.print(t)


def combine(
    checkpoints: Annotated[list[Path], typer.Argument(help="two or more .safetensors checkpoints (same input and "
                                                            "classes; e.g. several seeds or strategies)")],
    output: Annotated[Path, typer.Option("--output", "-o", help="ensemble checkpoint to write")] = Path(
        "ensemble.safetensors"),
) -> None:
    """One checkpoint that is the mean of the models' softmax outputs (the ensembles of `neurofed ensemble`).

    It exports (`neurofed export`, `--standalone`), evaluates and decodes live like any checkpoint.
    """
    from neurofed.trainer.checkpoint import combine_checkpoints  # lazy

    meta = combine_checkpoints(checkpoints, output)
    console.print(f"wrote {output}: {len(checkpoints)} members ({meta.strategy}), {meta.n_channels} ch x "
                  f"{meta.n_times} samples, classes {meta.classes}, bn_mode {meta.bn_mode}")


data_app = typer.Typer(help="Find, check and download EEG recordings.", no_args_is_help=True)


@data_app.command("info")
def data_info(data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA")] = None) -> None:
    """Where the data is, and every file checked: header vs size, annotations, left/right cues.

    Exits 2 naming each file with a problem (truncated, unreadable, missing, cues absent)."""

    d = resolve_data_dir(data_dir)
    with Progress(TextColumn("[bold]checking EDF files"), BarColumn(), TextColumn("{task.completed} files"),
                  console=console, transient=True) as prog:
        task = prog.add_task("check", total=None)
        report = check_files(d, on_file=lambda _: prog.advance(task))
    good = [s for s, r in report.items() if r["ok"]]
    cues = sum(f["cues"] for s in good for f in report[s]["files"].values())
    console.print(f"data folder: {d}\nsubjects with runs 4/8/12 complete and readable ({len(good)}, {cues} "
                  f"left/right cues): {', '.join(map(str, good))}")
    bad = {s: r for s, r in report.items() if not r["ok"]}
    for s, r in bad.items():
        for name, f in r["files"].items():
            for problem in f["problems"]:
                console.print(f"[red]S{s:03d}[/] {name}: {problem}")
    if bad:
        n = sum(1 for r in bad.values() for f in r["files"].values() if f["problems"])
        raise DataError(f"{n} file(s) of {len(bad)} subject(s) have problems (listed above): "
                        f"subjects {', '.join(map(str, bad))} are not usable as they are")


@data_app.command("download")
def data_download(
    subjects: Annotated[str, typer.Option(help="e.g. 1-10")] = "1",
    path: Annotated[str | None, typer.Option(help="MNE data folder (default ~/mne_data)")] = None,
) -> None:
    """Download EEGMMIDB runs 4/8/12 with MNE (needs the network; fails in seconds when offline)."""

    files = download(parse_subjects(subjects, None) if subjects != "all" else range(1, 110), path=path)
    console.print(f"{len(files)} files ready")


def report(
    run_dirs: Annotated[list[Path] | None, typer.Argument(
        help="run directories (each with results.json), or a study's raw results: studies/NAME (every run in it), "
             "studies/NAME/raw.jsonl.gz:GROUP/RUN (one run) or ...:GROUP (the runs under it)")] = None,
    out: Annotated[Path, typer.Option(help="folder for report.md and PNG plots")] = Path("runs/report"),
    seeds: Annotated[str | None, typer.Option(help="only these seeds, e.g. '0' or '0,1' (default: all a run has)")] = None,
    refs: Annotated[str | None, typer.Option(help="algorithms to give paired p-values against (their plain run); "
                                                 "default ct,fedavg where present; a name given here that matches no "
                                                 "run is a warning")] = None,
    p_metrics: Annotated[str, typer.Option(help="metrics to test, e.g. 'bca,pgd@0.03'")] = "bca",
    headline: Annotated[bool, typer.Option(
        "--headline", help="(re)write studies/headline.json from the studies' raw results (rows: "
        "studies/headline.toml) and the README's headline table from it; no run directories")] = False,
) -> None:
    """Render a markdown table (mean ± std, paired t-test p-values) and PNG plots from runs."""
    from neurofed.trainer import report as trainer_report  # lazy: scipy.stats
    if headline:
        if run_dirs:
            raise typer.BadParameter("--headline takes no run directories (its rows: studies/headline.toml)")
        from neurofed.trainer.experiments import studies  # lazy: scipy (keeps --help fast)

        doc = studies.write_headline(Path("studies"), Path("README.md"))
        typer.echo(studies.headline_markdown(doc))
        typer.echo("wrote studies/headline.json and the README's headline table")
        return
    if not run_dirs:
        raise typer.BadParameter("give run directories or a study (e.g. studies/table46), or --headline")
    wanted = None
    if seeds is not None:
        wanted = parse_int_list(seeds, "--seeds")
    try:
        runs = trainer_report.load_runs(run_dirs, wanted)
    except trainer_report.ReportError as exc:
        raise typer.BadParameter(str(exc)) from None
    known = {m for r in runs for m in r["summary"]}
    pms = tuple(parse_name_list(p_metrics))
    if unknown := [m for m in pms if m not in known]:
        raise typer.BadParameter(f"--p-metrics {','.join(unknown)}: no run has it (runs have {sorted(known)})")
    ref_names = tuple(parse_name_list(refs or "ct,fedavg"))
    table, warnings = trainer_report.write_report(runs, out, ref_names, pms, warn_refs=refs is not None)
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    typer.echo(table)
    typer.echo(f"report: {out / 'report.md'}")


def classical(
    method: Annotated[str, typer.Option(help="csp-lda (EA + CSP + LDA) or riemann (re-centred tangent space + LR)")]
    = "csp-lda",
    subjects: Annotated[str, typer.Option(help="'all' or e.g. '1-19,24-33,42'")] = "all",
    protocol: Annotated[str, typer.Option(help="loso or kfold:K (the same grouping as neurofed simulate)")]
    = "kfold:5",
    seeds: Annotated[str, typer.Option(help="comma list of seeds (random_state of the classifier)")] = "0",
    fold_seed: Annotated[int, typer.Option(help="seed of the k-fold subject grouping")] = 0,
    n_components: Annotated[int, typer.Option(help="CSP components (csp-lda)")] = 6,
    attack: Annotated[str | None, typer.Option(help="black-box attacks, e.g. 'square:0.05,hsj:0.05' (eps x std)")]
    = None,
    channels: Annotated[str, typer.Option(help="all, sensorimotor21, or a comma list")] = "sensorimotor21",
    resample: Annotated[float | None, typer.Option(help="Hz; omit to keep 160 Hz")] = 80.0,
    fmin: Annotated[float, typer.Option()] = 8.0,
    fmax: Annotated[float, typer.Option()] = 30.0,
    tmin: Annotated[float, typer.Option()] = 0.0,
    tmax: Annotated[float, typer.Option()] = 4.0,
    data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA", help="EEGMMIDB folder")] = None,
    out: Annotated[Path, typer.Option(help="run directory (results.json for neurofed report)")]
    = Path("runs/classical"),
) -> None:
    """Classical reference (EA + CSP + LDA, or Riemannian tangent space) on NeuroFed's folds and epochs."""
    from neurofed.trainer.experiments.classical import (  # lazy
        METHOD_EA,
        METHODS,
        ClassicalConfig,
        run_classical,
    )
    if method not in METHODS:
        raise typer.BadParameter(f"--method {method!r}: use one of {', '.join(METHODS)}")
    seed_list = parse_int_list(seeds, "--seeds")
    pre = preprocess_from_options(channels, resample, METHOD_EA[method], fmin, fmax, tmin, tmax)
    cfg = ClassicalConfig(method=method, subjects=parse_subjects(subjects, data_dir), protocol=protocol,
                          seeds=seed_list, preprocess=pre.to_dict(), fold_seed=fold_seed,
                          n_components=n_components, data_dir=data_dir, attacks=parse_attacks(attack))
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} jobs"),
                  TimeElapsedColumn(), console=console) as prog:
        task = prog.add_task(f"{method} {protocol}", total=None)

        def on_done(job: dict, n: int, total: int) -> None:
            prog.update(task, completed=n, total=total)
            bcas = [r["bca"] for r in job["per_subject"].values()]
            prog.console.log(f"fold {job['fold']} seed {job['seed']}: BCA {100 * np.mean(bcas):.1f}% "
                             f"({job['seconds']:.1f} s)")

        results = run_classical(cfg, out, on_done)
    print_results(results)
    console.print(f"results: {out / 'results.json'}")


def ensemble(
    runs: Annotated[list[Path], typer.Argument(help="run directories trained with --save-models")],
    out: Annotated[Path, typer.Option(help="folder for results.json (readable by `neurofed report`)")],
    seeds: Annotated[str | None, typer.Option(help="seeds whose models are members, e.g. 0,1,2 (default: all)")]
    = None,
    test_batch: Annotated[int | None, typer.Option(help="trials per test batch (default: the runs', 8); batch-"
                                                        "specific BN normalises over the batch")] = None,
) -> None:
    """Held-out BCA of the average of saved models (per fold: every run x seed), against its members alone."""
    from scipy import stats  # lazy: scipy.stats (keeps --help fast)

    from neurofed.trainer.experiments.ensemble import ensemble_runs  # lazy
    from neurofed.trainer.experiments.sweep import write_json  # lazy

    console = Console(soft_wrap=True)
    chosen = parse_int_list(seeds, "--seeds") if seeds else None
    with Progress(TextColumn("[bold]ensemble"), BarColumn(), TextColumn("{task.completed}/{task.total} folds"),
                  console=console) as prog:
        task = prog.add_task("folds", total=None)
        res = ensemble_runs(runs, chosen, lambda n, t: prog.update(task, completed=n, total=t), test_batch)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", res)
    ps = res["per_subject"]
    ens = 100 * np.array([r["bca"] for r in ps.values()])
    mem = 100 * np.array([r["member_bca"] for r in ps.values()])
    p = stats.ttest_rel(ens, mem).pvalue if len(ens) > 1 and np.any(ens != mem) else float("nan")
    console.print(f"{len(ps)} subjects, {len(res['ensemble']['members'])} members: ensemble BCA "
                  f"{ens.mean():.1f} ± {ens.std(ddof=1) if len(ens) > 1 else 0.0:.1f} %, members alone "
                  f"{mem.mean():.1f} %; gain {ens.mean() - mem.mean():+.1f} points (paired t p "
                  + ("-" if np.isnan(p) else f"{p:.2g}") + ")")
    console.print(f"results: {out / 'results.json'}")


def sweep(
    runs: Annotated[list[Path], typer.Argument(help="run directories trained with --save-models")],
    attack: Annotated[str, typer.Option(help="NAME:EPS list, e.g. 'fgsm:0.01,fgsm:0.03,fgsm:0.05,square:0.05' "
                                             "(eps x each trial's channel std)")],
    plot: Annotated[Path | None, typer.Option(help="PNG: BCA against eps, one panel per attack")] = None,
    names: Annotated[str | None, typer.Option(help="column names, comma-separated (default: the folders' names)")]
    = None,
    seeds: Annotated[str | None, typer.Option(help="only the jobs of these seeds, e.g. 0 (default: all)")] = None,
    workers: Annotated[int, typer.Option(help="jobs attacked at once (processes, one torch thread each)")] = 1,
) -> None:
    """Attack the saved models of runs at several budgets (no training); table and plot of BCA against eps.

    The first run is the reference of the paired t-tests. Results are kept per job (resumable)."""
    from neurofed.trainer.experiments.sweep import run_jobs, sweep_plot, sweep_runs, sweep_table  # lazy
    console = Console()
    attacks = [(a, float(e)) for a, e in parse_attacks(attack)]
    if not attacks:
        raise typer.BadParameter("give at least one NAME:EPS", param_hint="--attack")
    labels = names.split(",") if names else [r.name for r in runs]
    if len(labels) != len(runs):
        raise typer.BadParameter(f"{len(labels)} names for {len(runs)} runs", param_hint="--names")
    chosen = parse_int_list(seeds, "--seeds") if seeds else None
    counts = {str(r): len(run_jobs(r, chosen)) for r in runs}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} jobs"),
                  console=console) as prog:
        tasks: dict[str, list] = {}
        for label, r in zip(labels, runs):
            tasks.setdefault(str(r), []).append(prog.add_task(label, total=counts[str(r)]))

        def advance(r: Path, _jp: Path) -> None:
            for t in tasks[str(r)]:
                prog.advance(t)

        by_run = sweep_runs(runs, attacks, advance, chosen, max(1, workers))
    results = {label: by_run[str(r)] for label, r in zip(labels, runs)}
    console.print(sweep_table(results))
    if plot:
        sweep_plot(results, plot)
        console.print(f"plot: {plot}")


def _progress() -> Progress:
    """The grid's progress bar (description, bar, n/total, elapsed, remaining) on the CLI's console."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=console)


@contextlib.contextmanager
def _job_rounds(prog: Progress, runs: list[GridRun], every: float = 1.0) -> Iterator[None]:
    """While the block runs, one progress line per running job (its round, loss and time left), read from the
    files the jobs write (:func:`neurofed.trainer.experiments.grid.running_jobs`)."""
    from neurofed.trainer.experiments.grid import running_jobs  # lazy
    stop = threading.Event()
    shown: dict[str, TaskID] = {}

    def poll() -> None:
        while not stop.wait(every):
            now = running_jobs(runs)
            for key, info in now.items():
                desc = f"  {key} loss {info['loss']:.3f}"
                if key not in shown:
                    shown[key] = prog.add_task(desc, total=info["rounds"])
                prog.update(shown[key], completed=info["round"], total=info["rounds"], description=desc)
            for key in [k for k in shown if k not in now]:
                prog.remove_task(shown.pop(key))

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()
        for tid in shown.values():
            prog.remove_task(tid)


def grid(
    spec: Annotated[Path, typer.Argument(help="grid spec: a study's spec.toml, or lines 'NAME <neurofed simulate "
                                              "options>' (.txt)")],
    group: Annotated[str | None, typer.Option(help="a .toml spec: only this grid; a .txt spec: the results sub-folder "
                                                   "(default: the spec's name)")] = None,
    results: Annotated[Path | None, typer.Option(help="results root, or a study's raw.jsonl.gz (unpacked into "
                                                 "runs/studies/results, finished jobs added back into it); default: "
                                                 "the raw.jsonl.gz beside the spec if there is one or the spec is a study's "
                                                 "(studies/NAME/spec.toml: the file is created), else runs/grid")]
    = None,
    only: Annotated[str | None, typer.Option(help="only these runs, e.g. 'fedbs,safe' (several grids: 'table46/safe')")]
    = None,
    backend: Annotated[str, typer.Option(help="auto (Ray if installed), ray, or pool")] = "auto",
    address: Annotated[str | None, typer.Option(help="Ray cluster address, e.g. 10.0.0.1:6379 (default: local Ray)")]
    = None,
    workers: Annotated[int, typer.Option(help="local CPUs (Ray) or processes (pool) to use")] = 1,
    reproduce: Annotated[bool, typer.Option(
        "--reproduce", help="re-run finished jobs in --scratch, check each against the committed job subject by "
        "subject, and place its saved models beside it when equal")] = False,
    seeds: Annotated[str | None, typer.Option(help="only these seeds' jobs, e.g. '0' or '0,1' (a run's results.json "
                                              "waits for all its spec seeds)")] = None,
    scratch: Annotated[Path | None, typer.Option(help="with --reproduce: where the re-runs go (default: a new "
                                                      "temporary folder, kept)")] = None,
    match: Annotated[str | None, typer.Option(help="with --reproduce: also place a model when only these "
                                              "per-subject metrics equal the committed job's, e.g. 'bca' (attacked "
                                              "numbers can move by a trial between CPUs); the rest are listed")]
    = None,
) -> None:
    """Run a grid of simulate runs as one task per (run, seed, fold); re-running resumes it.

    A study's spec (studies/NAME/spec.toml) reads and extends the study's committed raw.jsonl.gz: its jobs are
    unpacked into runs/studies/results first, so finished jobs are skipped (and --reproduce checks re-runs against
    them); jobs finished by this run are added back into the raw file (a new study's first run creates it)."""
    from neurofed.trainer.experiments import raw as study_raw  # lazy
    from neurofed.trainer.experiments.grid import parse_spec, run_grid, select_seeds  # lazy: Ray
    raw_file = None
    if results is None:
        beside = spec.parent / study_raw.RAW_NAME
        in_study = spec.name == "spec.toml" and spec.resolve().parent.parent == study_raw.STUDIES.resolve()
        results = beside if beside.is_file() or in_study else Path("runs/grid")
    if study_raw.is_raw(results):
        raw_file, _ = study_raw.split_ref(results)
        results = study_raw.WORK / "results"
    runs = parse_spec(spec, results, group, parse_name_list(only) or None)  # a bad spec fails before any unpacking
    if raw_file is not None and raw_file.is_file():
        # --reproduce compares against the committed jobs: unpack them over any local copy
        study_raw.unpack(raw_file, results, overwrite=reproduce)
        console.print(f"{raw_file}: unpacked into {results}")
    if (scratch or match) and not reproduce:
        raise NeuroFedError("--scratch and --match go with --reproduce")
    chosen = parse_int_list(seeds, "--seeds") if seeds else None
    if reproduce:
        # each chosen seed must be one of every run's spec seeds (reproduce_grid's select_seeds says which is not)
        _reproduce_cli(spec, runs, scratch, backend, address, workers, parse_name_list(match) or None, chosen)
        return
    if chosen:
        select_seeds(runs, chosen)  # the same check; run_grid then filters the plan by seed
    with _progress() as prog:
        bar = prog.add_task(f"grid {spec.name}", total=None)

        def on_event(task: Task, result: dict | None, tb: str | None, n: int, total: int) -> None:
            prog.update(bar, completed=n, total=total)
            if tb is not None:
                prog.console.print(f"[red]FAILED[/red] {task.run} seed {task.seed} fold {task.fold}\n{tb}")
            else:
                bcas = [r["bca"] for r in result["per_subject"].values()]
                msg = f"BCA {100 * sum(bcas) / len(bcas):.1f}%" if bcas else "trained"
                prog.console.log(f"{task.run} seed {task.seed} fold {task.fold}: {msg} ({result['seconds']:.0f} s)")

        try:
            with _job_rounds(prog, runs):
                out = run_grid(runs, backend, address, workers, on_event, seeds=chosen)
        finally:
            if raw_file is not None:  # what finished (even when some jobs failed) goes back into the study
                n = study_raw.add_runs(raw_file, results, [r.out for r in runs])
                console.print(f"{raw_file}: {n} file(s) added or updated")
    by_name = {r.name: r for r in runs}
    for name in out["finished"]:
        console.print(f"{name}: {by_name[name].out / 'results.json'}")
    if out["failed"]:
        raise NeuroFedError(f"{len(out['failed'])} job(s) failed (tracebacks above); re-run to retry only those")


def _reproduce_cli(spec: Path, runs: list[GridRun], scratch: Path | None, backend: str,
                   address: str | None, workers: int, match: list[str] | None = None,
                   seeds: list[int] | None = None) -> None:
    from neurofed.trainer.experiments.grid import reproduce_grid  # lazy: Ray
    scratch = scratch or Path(tempfile.mkdtemp(prefix="neurofed-reproduce-"))
    console.print(f"re-running in {scratch} (kept)")
    with _progress() as prog:
        bar = prog.add_task(f"reproduce {spec.name}", total=None)

        def on_check(c: Check, n: int, total: int) -> None:
            prog.update(bar, completed=n, total=total)
            head = f"{c.run} seed {c.seed} fold {c.fold}: "
            placed = f", model placed ({len(c.placed)} file(s))" if c.placed else ""
            if c.status == "equal":
                prog.console.log(head + "reproduces" + placed)
            elif c.status == "matches":
                shown = "; ".join(c.details[:3]) + ("; ..." if len(c.details) > 3 else "")
                prog.console.log(f"[yellow]{head}{', '.join(match or [])} equal{placed}[/yellow]; differs: {shown}")
            else:
                shown = "; ".join(c.details[:3]) + ("; ..." if len(c.details) > 3 else "")
                prog.console.log(f"[red]{head}{c.status}[/red]: {shown}")

        checks = reproduce_grid(runs, scratch, backend, address, workers, on_check, match=match, seeds=seeds)
    counts = {s: sum(c.status == s for c in checks) for s in ("equal", "matches", "differs", "failed")}
    console.print(", ".join(f"{v} {k}" for k, v in counts.items() if v) or "nothing to re-run")
    if counts["differs"] or counts["failed"]:
        raise NeuroFedError(f"{counts['differs']} job(s) differ from the committed ones and {counts['failed']} "
                            f"failed (above); the committed jobs are unchanged, the re-runs are in {scratch}")


def bench_data(
    subjects: Annotated[str, typer.Option(help="subjects to time")] = "1-5",
    channels: Annotated[str, typer.Option()] = "sensorimotor21",
    resample: Annotated[float | None, typer.Option()] = 80.0,
    data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA")] = None,
    out_dir: Annotated[Path, typer.Option()] = trainer_bench.BENCH_DIR,
) -> None:
    """EDF load + preprocess time per subject, cold (empty cache) vs cached."""
    trainer_bench.bench_data(subjects, channels, resample, data_dir, out_dir)


def bench_train(
    threads: Annotated[int, typer.Option(help="torch threads")] = 1,
    batch_size: Annotated[int, typer.Option()] = 32,
    steps: Annotated[int, typer.Option()] = 30,
    models: Annotated[str, typer.Option(help="comma list of eegnet, shallow, deep")] = "eegnet,shallow,deep",
    out_dir: Annotated[Path, typer.Option()] = trainer_bench.BENCH_DIR,
) -> None:
    """Training throughput (trials/s) per model and step cost of SAM and SAFE relative to SGD.

    Medians of wall time and of the calling thread's CPU time (``time.thread_time``; with one torch
    thread all the work runs there), so the ratios can be read on a machine other jobs share.
    """
    trainer_bench.bench_train(threads, batch_size, steps, models, out_dir)


def bench_simulate(
    algorithms: Annotated[str, typer.Option(help="comma list of registered algorithms")] = "fedbs,safe",
    subjects: Annotated[str, typer.Option(help="'all' or e.g. '1-10'; the clients: fold 0 of kfold:5 held out")] = "all",
    rounds: Annotated[int, typer.Option(help="rounds of the timed federation (after one warm-up round)")] = 1,
    repeats: Annotated[int, typer.Option(help="timed federations per engine, interleaved with the other's")] = 2,
    fraction: Annotated[float, typer.Option(help="fraction of clients per round")] = 0.5,
    model: Annotated[str, typer.Option()] = "eegnet",
    threads: Annotated[int, typer.Option(help="torch threads")] = 1,
    data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA")] = None,
    out_dir: Annotated[Path, typer.Option()] = trainer_bench.BENCH_DIR,
) -> None:
    """The same short federation on both engines (sequential, vectorised): rounds/s, passes/s, their ratio, the
    pure-compute floor, and how far the two results are apart (docs/bench/simulate.json)."""
    trainer_bench.bench_simulate(algorithms, subjects, rounds, fraction, model, threads, data_dir, out_dir,
                                 repeats=repeats)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add trainer commands and benchmarks."""
    app.command("simulate")(with_strategy_options(simulate))
    app.command("algorithms")(algorithms)
    app.command("combine")(combine)
    app.add_typer(data_app, name="data")
    app.command("report")(report)
    app.command("classical")(classical)
    app.command("grid")(grid)
    app.command("sweep")(sweep)
    app.command("ensemble")(ensemble)
    bench.command("data")(bench_data)
    bench.command("train")(bench_train)
    bench.command("simulate")(bench_simulate)


def _standalone() -> None:
    """``python -m neurofed.trainer.cli``: the trainer's commands alone (no broker/export imports)."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
    bench = typer.Typer(no_args_is_help=True)
    app.add_typer(bench, name="bench")
    register(app, bench)

    run_cli(app)


if __name__ == "__main__":
    _standalone()
