"""Commands that trainer/ adds to ``neurofed``: simulate, report, data, and data/training benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from neurofed.trainer.data.eegmmidb import parse_subjects  # re-exported: CLIs and scripts use it
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console()


def parse_int_list(value: str, option: str) -> list[int]:
    """``"0,1, 2"`` -> [0, 1, 2]; a clear error naming ``option`` for anything but comma-separated integers.

    Parameters
    ----------
    value : str
        The option's text as typed.
    option : str
        The option's name (``--seeds``), shown in the error.

    Returns
    -------
    list of int
        The integers in the order given (empty for an empty string).
    """
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{option} {value!r}: expected comma-separated integers, e.g. '2' or '0,1'") from None


def parse_name_list(value: str | None) -> list[str]:
    """``"fedbs, safe,"`` -> ["fedbs", "safe"]: a comma-separated option's names, blanks dropped (None -> [])."""
    return [x.strip() for x in (value or "").split(",") if x.strip()]


def parse_attacks(spec: str | None) -> list[list]:
    """``pgd:0.03,fgsm:0.01`` -> [["pgd", 0.03], ["fgsm", 0.01]] (names: :data:`neurofed.trainer.attacks.ATTACKS`)."""
    from neurofed.trainer.attacks import ATTACKS

    if not spec:
        return []
    out = []
    for part in spec.split(","):
        name, _, eps = part.partition(":")
        if name not in ATTACKS or not eps:
            raise typer.BadParameter(f"attack {part!r}: use NAME:EPS with NAME one of {', '.join(ATTACKS)}")
        out.append([name, float(eps)])
    return out


def preprocess_from_options(channels: str, resample: float | None, ea: bool, fmin: float, fmax: float,
                            tmin: float, tmax: float):
    from neurofed.trainer.data import PreprocessConfig

    return PreprocessConfig.from_preset(channels, resample=resample, ea=ea, fmin=fmin, fmax=fmax, tmin=tmin, tmax=tmax)


def print_results(results: dict) -> None:
    """Per-subject table and summary."""
    metrics = list(results["summary"])
    t = Table(title=f"{results['algorithm']} / {results['model']}: balanced accuracy per held-out subject")
    t.add_column("subject")
    for m in metrics:
        t.add_column(m, justify="right")
    for s, row in results["per_subject"].items():
        t.add_row(s, *[f"{100 * row[m]:.1f}" for m in metrics])
    t.add_row("mean ± std", *[f"{100 * results['summary'][m]['mean']:.1f} ± {100 * results['summary'][m]['std_subjects']:.1f}"
                              for m in metrics], style="bold")
    console.print(t)
    if results.get("per_profile"):
        console.print("held-out BCA per device profile: " + ", ".join(
            f"{p} {100 * r['bca']:.1f}% (n={r['n']})" for p, r in results["per_profile"].items()))


def _algorithm_help() -> str:
    from neurofed.trainer.fl.strategies import ALGORITHMS

    return "; ".join(f"{a.name}: {a.summary}" for a in ALGORITHMS.values())


def _preset_help() -> str:
    from neurofed.trainer.presets import PRESETS

    return " | ".join(f"{p.name}: {p.summary}" + (f" (NOTE: {p.caveat})" if p.caveat else "") for p in PRESETS.values())


def build_sim_config(opts: dict):
    """The :class:`~neurofed.trainer.experiments.simulate.SimConfig` of ``neurofed simulate``'s option values (by
    parameter name, strategy parameters included; ``neurofed grid`` parses spec lines into the same values),
    validated. Unset training options take the preset's values (``--preset``, default ``published``)."""
    from neurofed.trainer.errors import NeuroFedError
    from neurofed.trainer.experiments.partition import parse_partition
    from neurofed.trainer.experiments.simulate import SimConfig
    from neurofed.trainer.fl.local import LocalConfig
    from neurofed.trainer.fl.strategies import PARAMS
    from neurofed.trainer.presets import get_preset

    o = opts
    try:
        pre_set = get_preset(o["preset"])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--preset") from None
    if pre_set.caveat:
        console.print(f"[yellow]preset {pre_set.name}: {pre_set.caveat}[/yellow]")

    def pick(v, d):
        return d if v is None else v

    resample = pick(o["resample"], pre_set.resample)
    profiles, channels = o["profiles"], o["channels"]
    if profiles and channels is not None:
        raise typer.BadParameter("--channels does not combine with --profiles (each profile has its channels; "
                                 "use --profile-channels intersection)", param_hint="--channels")
    pre = preprocess_from_options("all" if profiles else pick(channels, pre_set.channels), resample or None, o["ea"],
                                  o["fmin"], o["fmax"], o["tmin"], o["tmax"])
    if profiles and pre.resample is None:
        raise typer.BadParameter("--profiles needs --resample (the model's rate, where all devices meet)")
    protocol = o["protocol"]
    if o["test_subjects"] is not None:
        if o["test_subjects"].lower() != "none":
            raise typer.BadParameter("--test-subjects takes only 'none' (use --protocol for held-out subjects)")
        protocol = "none"
    p = pre_set.local
    local = LocalConfig(pick(o["lr"], p.lr), pick(o["momentum"], p.momentum), pick(o["weight_decay"], p.weight_decay),
                        pick(o["batch_size"], p.batch_size), pick(o["local_epochs"], p.local_epochs))
    subject_ids = parse_subjects(o["subjects"], o["data_dir"])
    assignment: dict[str, str] = {}
    only_profile = o["only_profile"]
    if profiles:
        from neurofed.trainer.data.profiles import parse_assignment

        try:
            assignment = {str(k): v for k, v in parse_assignment(profiles, subject_ids, o["profile_seed"]).items()}
        except NeuroFedError as exc:
            raise typer.BadParameter(str(exc), param_hint="--profiles") from None
        if only_profile and only_profile not in assignment.values():
            raise typer.BadParameter(f"no subject has profile {only_profile!r}", param_hint="--only-profile")
    elif only_profile:
        raise typer.BadParameter("--only-profile needs --profiles", param_hint="--only-profile")
    if o["profile_channels"] not in ("own", "intersection", "interpolate"):
        raise typer.BadParameter("use own, intersection or interpolate", param_hint="--profile-channels")
    try:
        parse_partition(o["partition"])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--partition") from None
    folds = o["folds"]
    cfg = SimConfig(
        algorithm=o["algorithm"], model=o["model"], subjects=subject_ids, protocol=protocol,
        rounds=pick(o["rounds"], pre_set.rounds), fraction=pick(o["fraction"], pre_set.fraction),
        seeds=parse_int_list(o["seeds"], "--seeds"), local=local.to_dict(),
        ct_batch_size=pick(o["ct_batch_size"], pre_set.ct_batch_size), preprocess=pre.to_dict(),
        test_batch=o["test_batch"], eval_every=o["eval_every"], attacks=parse_attacks(o["attack"]),
        byzantine=o["byzantine"], strategy_overrides={k: o[k] for k in PARAMS if o.get(k) is not None},
        data_dir=o["data_dir"], fold_seed=o["fold_seed"], profiles=assignment,
        profile_channels=o["profile_channels"], only_profile=only_profile, noise_seed=o["noise_seed"],
        folds=sorted(set(parse_int_list(folds, "--folds"))) if folds else [],
        partition=o["partition"], save_models=bool(o.get("save_models", False)),
    )
    try:
        st = cfg.strategy()  # validate overrides before any work
        st.model_kwargs(cfg.model)  # e.g. --local-bn-mode needs fleeg_eegnet
        if not st.centralised:
            st.check_participation(cfg.fraction)  # GA needs every client in every round
        if o["byzantine"]:
            from neurofed.trainer.fl.byzantine import Byzantine

            Byzantine.parse(o["byzantine"])
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return cfg


def simulate(
    algorithm: Annotated[str, typer.Option(help=_algorithm_help())] = "fedbs",
    preset: Annotated[str, typer.Option(help=_preset_help())] = "published",
    model: Annotated[str, typer.Option(
        help="eegnet, shallow, deep, fleeg_eegnet, fleeg_proj_eegnet, fleeg_fixmap_eegnet")] = "eegnet",
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
    threads: Annotated[int | None, typer.Option(help="torch threads per worker (default: cores / workers)")] = None,
    fold_seed: Annotated[int, typer.Option(help="seed of the k-fold subject grouping")] = 0,
    folds: Annotated[str | None, typer.Option(help="run only these fold indices, e.g. '0,1' (a pilot)")] = None,
    save_models: Annotated[bool, typer.Option(
        help="also save each (fold, seed) job's trained global model beside its JSON (jobs/seedS_foldKK.safetensors, "
             "a few kB) so `neurofed sweep` can attack it later without training again")] = False,
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
    from neurofed.trainer.experiments.simulate import run_simulation

    opts = {k: v for k, v in locals().items() if k != "strategy_params"}
    cfg = build_sim_config({**opts, **strategy_params})
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} jobs"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console) as prog:
        task = prog.add_task(f"{algorithm} {cfg.protocol}", total=None)

        def on_done(job: dict, n: int, total: int) -> None:
            prog.update(task, completed=n, total=total)
            bcas = [r["bca"] for r in job["per_subject"].values()]
            msg = f"fold {job['fold']} seed {job['seed']}: " + (
                f"BCA {100 * sum(bcas) / len(bcas):.1f}%" if bcas else "trained (no held-out subject)")
            prog.console.log(msg + f" ({job['seconds']:.0f} s)")

        results = run_simulation(cfg, out, workers, on_done, threads)
    if results["per_subject"]:
        print_results(results)
    for c in results["checkpoints"]:
        console.print(f"global model checkpoint: {c}")
    console.print(f"results: {out / 'results.json'}")


def with_strategy_options(func):
    """Give ``func`` (which takes ``**strategy_params``) one CLI option per registered strategy parameter.

    The options come from :data:`neurofed.trainer.fl.strategies.PARAMS`, so a new algorithm's parameters appear in
    ``neurofed simulate --help`` without touching this file. Each defaults to None (= the algorithm's value).
    """
    import inspect
    import typing

    from neurofed.trainer.fl.strategies import PARAMS

    if getattr(func, "_strategy_options", False):  # already given its options (idempotent)
        return func
    sig = inspect.signature(func)
    hints = typing.get_type_hints(func, include_extras=True)  # keep typer's Annotated options
    fixed = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
             if p.kind != inspect.Parameter.VAR_KEYWORD]
    extra = []
    for prm in PARAMS.values():
        decl = prm.flag or f"--{prm.name.replace('_', '-')}"
        choices = f" ({', '.join(str(c) for c in prm.choices if c != '')})" if prm.choices else ""
        opt = typer.Option(decl, help=f"{prm.help}{choices}", rich_help_panel="Strategy parameters (override the algorithm's)")
        extra.append(inspect.Parameter(prm.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                       annotation=Annotated[prm.type | None, opt]))
    func.__signature__ = sig.replace(parameters=[*fixed, *extra])
    func._strategy_options = True
    return func


def algorithms(markdown: Annotated[bool, typer.Option(help="print the docs' markdown tables")] = False) -> None:
    """The registered federated algorithms and their parameters (from trainer/fl/strategies.py)."""
    from neurofed.trainer.fl.strategies import docs_tables

    if markdown:
        print(docs_tables())
        return
    from neurofed.trainer.fl.strategies import ALGORITHMS, PARAMS

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
    from neurofed.trainer.checkpoint import combine_checkpoints

    meta = combine_checkpoints(checkpoints, output)
    console.print(f"wrote {output}: {len(checkpoints)} members ({meta.strategy}), {meta.n_channels} ch x "
                  f"{meta.n_times} samples, classes {meta.classes}, bn_mode {meta.bn_mode}")


data_app = typer.Typer(help="Find, check and download EEG recordings.", no_args_is_help=True)


@data_app.command("info")
def data_info(data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA")] = None) -> None:
    """Where the data is, and every file checked: header vs size, annotations, left/right cues.

    Exits 2 naming each file with a problem (truncated, unreadable, missing, cues absent)."""
    from neurofed.trainer.data import resolve_data_dir
    from neurofed.trainer.data.eegmmidb import check_files
    from neurofed.trainer.errors import DataError

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
    from neurofed.trainer.data.eegmmidb import download

    files = download(parse_subjects(subjects, None) if subjects != "all" else range(1, 110), path=path)
    console.print(f"{len(files)} files ready")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add trainer commands and benchmarks."""
    app.command("simulate")(with_strategy_options(simulate))
    app.command("algorithms")(algorithms)
    app.command("combine")(combine)
    app.add_typer(data_app, name="data")
    from neurofed.trainer import bench as trainer_bench
    from neurofed.trainer import report as trainer_report

    app.command("report")(trainer_report.report)
    from neurofed.trainer.experiments import classical as trainer_classical

    app.command("classical")(trainer_classical.classical)
    from neurofed.trainer.experiments import grid as trainer_grid

    app.command("grid")(trainer_grid.grid)
    from neurofed.trainer.experiments import sweep as trainer_sweep

    app.command("sweep")(trainer_sweep.sweep)
    from neurofed.trainer.experiments import ensemble as trainer_ensemble

    app.command("ensemble")(trainer_ensemble.ensemble)
    trainer_bench.register(bench)


def _standalone() -> None:
    """``python -m neurofed.trainer.cli``: the trainer's commands alone (no broker/export imports)."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
    bench = typer.Typer(no_args_is_help=True)
    app.add_typer(bench, name="bench")
    register(app, bench)
    from neurofed.trainer.errors import run_cli

    run_cli(app)


if __name__ == "__main__":
    _standalone()
