"""Commands that trainer/ adds to ``neurofed``: simulate, report, data, and data/training benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console()


def parse_subjects(spec: str | None, data_dir: str | None) -> list[int]:
    """``all`` / None -> every subject in the data folder; else ``1,2,5-9``."""
    from trainer.data import list_subjects
    from trainer.errors import NeuroFedError

    if spec in (None, "", "all"):
        return list_subjects(data_dir)
    out: list[int] = []
    try:
        for part in spec.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                out += list(range(int(a), int(b) + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise NeuroFedError(f"--subjects {spec!r}: use e.g. 1-6 or 1,2,5") from None
    return sorted(set(out))


def parse_attacks(spec: str | None) -> list[list]:
    """``pgd:0.03,fgsm:0.01`` -> [["pgd", 0.03], ["fgsm", 0.01]] (names: :data:`trainer.attacks.ATTACKS`)."""
    from trainer.attacks import ATTACKS

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
    from trainer.data import PreprocessConfig

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


def build_sim_config(opts: dict):
    """The :class:`~trainer.experiments.simulate.SimConfig` of ``neurofed simulate``'s option values
    (by parameter name; ``neurofed grid`` parses spec lines into the same values), validated."""
    from trainer.experiments.simulate import SimConfig
    from trainer.fl.local import LocalConfig

    o = opts
    pre = preprocess_from_options(o["channels"], o["resample"], o["ea"], o["fmin"], o["fmax"], o["tmin"], o["tmax"])
    protocol = o["protocol"]
    if o["test_subjects"] is not None:
        if o["test_subjects"].lower() != "none":
            raise typer.BadParameter("--test-subjects takes only 'none' (use --protocol for held-out subjects)")
        protocol = "none"
    overrides = {k: o[k] for k in ("bn_mode", "bn_sync", "sam_rho", "fat_eps", "awp_gamma", "prox_mu", "moon_mu",
                                   "local_bn")}
    cfg = SimConfig(
        algorithm=o["algorithm"], model=o["model"], subjects=parse_subjects(o["subjects"], o["data_dir"]),
        protocol=protocol, rounds=o["rounds"], fraction=o["fraction"], seeds=[int(s) for s in o["seeds"].split(",")],
        local=LocalConfig(o["lr"], o["momentum"], o["weight_decay"], o["batch_size"], o["local_epochs"]).to_dict(),
        ct_batch_size=o["ct_batch_size"], preprocess=pre.to_dict(), test_batch=o["test_batch"],
        eval_every=o["eval_every"], attacks=parse_attacks(o["attack"]),
        strategy_overrides={k: v for k, v in overrides.items() if v is not None}, data_dir=o["data_dir"],
        fold_seed=o["fold_seed"],
    )
    cfg.strategy()  # validate overrides before any work
    return cfg


def simulate(
    algorithm: Annotated[str, typer.Option(help="ct, fedavg, fedprox, scaffold, moon, fedbn, fedbs, safe")] = "fedbs",
    model: Annotated[str, typer.Option(help="eegnet, shallow, deep")] = "eegnet",
    subjects: Annotated[str, typer.Option(help="'all' or e.g. '1-10,12'")] = "all",
    protocol: Annotated[str, typer.Option(help="loso, kfold:K (subject groups), or none")] = "loso",
    test_subjects: Annotated[str | None, typer.Option(help="'none': no held-out subject; train on all and save the global checkpoint")] = None,
    rounds: Annotated[int, typer.Option(help="communication rounds (CT: epochs)")] = 100,
    fraction: Annotated[float, typer.Option(help="fraction of clients per round (floor)")] = 0.5,
    local_epochs: Annotated[int, typer.Option(help="local epochs per round")] = 2,
    batch_size: Annotated[int, typer.Option(help="client batch size")] = 32,
    ct_batch_size: Annotated[int, typer.Option(help="CT batch size")] = 64,
    lr: Annotated[float, typer.Option()] = 0.005,
    momentum: Annotated[float, typer.Option()] = 0.9,
    weight_decay: Annotated[float, typer.Option()] = 1e-4,
    seeds: Annotated[str, typer.Option(help="comma list of seeds")] = "0",
    channels: Annotated[str, typer.Option(help="all, sensorimotor21, or a comma list")] = "sensorimotor21",
    resample: Annotated[float | None, typer.Option(help="Hz; omit to keep 160 Hz")] = 80.0,
    ea: Annotated[bool, typer.Option("--ea/--no-ea", help="per-subject Euclidean alignment")] = True,
    fmin: Annotated[float, typer.Option()] = 8.0,
    fmax: Annotated[float, typer.Option()] = 30.0,
    tmin: Annotated[float, typer.Option()] = 0.0,
    tmax: Annotated[float, typer.Option()] = 4.0,
    attack: Annotated[str | None, typer.Option(help="e.g. 'fgsm:0.03,pgd:0.03' (eps x per-channel std)")] = None,
    bn_mode: Annotated[str | None, typer.Option(help="override: standard or batch_specific")] = None,
    bn_sync: Annotated[str | None, typer.Option(help="local (paper) or stale_global (authors' code)")] = None,
    sam_rho: Annotated[float | None, typer.Option(help="override SAM rho (0 = off)")] = None,
    fat_eps: Annotated[float | None, typer.Option(help="override FGSM-AT eps (0 = off)")] = None,
    awp_gamma: Annotated[float | None, typer.Option(help="override AWP gamma (0 = off)")] = None,
    prox_mu: Annotated[float | None, typer.Option(help="override FedProx mu")] = None,
    moon_mu: Annotated[float | None, typer.Option(help="override MOON mu")] = None,
    local_bn: Annotated[bool | None, typer.Option("--local-bn/--shared-bn", help="override the local-BN rule")] = None,
    test_batch: Annotated[int, typer.Option(help="test batch size (batch-specific BN)")] = 8,
    eval_every: Annotated[int, typer.Option(help="evaluate the global model every N rounds (learning curve)")] = 10,
    workers: Annotated[int, typer.Option(help="parallel processes over folds/seeds")] = 1,
    threads: Annotated[int | None, typer.Option(help="torch threads per worker (default: cores / workers)")] = None,
    fold_seed: Annotated[int, typer.Option(help="seed of the k-fold subject grouping")] = 0,
    data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA", help="EEGMMIDB folder")] = None,
    out: Annotated[Path, typer.Option(help="run directory (re-running resumes it)")] = Path("runs/simulate"),
) -> None:
    """Leave-one-subject-out (or k-fold / no held-out) CT or federated training on real EEG."""
    from trainer.experiments.simulate import run_simulation

    cfg = build_sim_config(locals())
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


data_app = typer.Typer(help="Find, check and download EEG recordings.", no_args_is_help=True)


@data_app.command("info")
def data_info(data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA")] = None) -> None:
    """Where the data is and which subjects have all left/right imagery runs."""
    from trainer.data import list_subjects, resolve_data_dir

    d = resolve_data_dir(data_dir)
    subs = list_subjects(d)
    console.print(f"data folder: {d}\nsubjects with runs 4/8/12 ({len(subs)}): {', '.join(map(str, subs))}")


@data_app.command("download")
def data_download(
    subjects: Annotated[str, typer.Option(help="e.g. 1-10")] = "1",
    path: Annotated[str | None, typer.Option(help="MNE data folder (default ~/mne_data)")] = None,
) -> None:
    """Download EEGMMIDB runs 4/8/12 with MNE (needs the network; fails in seconds when offline)."""
    from trainer.data.eegmmidb import download

    files = download(parse_subjects(subjects, None) if subjects != "all" else range(1, 110), path=path)
    console.print(f"{len(files)} files ready")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add trainer commands and benchmarks."""
    app.command("simulate")(simulate)
    app.add_typer(data_app, name="data")
    from trainer import bench as trainer_bench
    from trainer import report as trainer_report

    app.command("report")(trainer_report.report)
    from trainer.experiments import classical as trainer_classical

    app.command("classical")(trainer_classical.classical)
    from trainer.experiments import grid as trainer_grid

    app.command("grid")(trainer_grid.grid)
    trainer_bench.register(bench)


def _standalone() -> None:
    """``python -m trainer.cli``: the trainer's commands alone (no broker/export imports)."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
    bench = typer.Typer(no_args_is_help=True)
    app.add_typer(bench, name="bench")
    register(app, bench)
    from trainer.errors import run_cli

    run_cli(app)


if __name__ == "__main__":
    _standalone()
