"""The ``neurofed`` command: each package's CLI contributes its commands through ``register(app, bench)``, and the
typer adapters of the lab in ``neurofed/`` (``demo``, ``bench e2e/lsl/secagg/fleet/standalone``) are here: the lab
modules hold plain Python functions and import no CLI.

Errors NeuroFed raises on purpose (:class:`neurofed.trainer.errors.NeuroFedError`) print one clear line
and exit 2, never a bare traceback.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
import webbrowser
from pathlib import Path
from typing import Annotated

import typer

from neurofed import __version__
from neurofed.demo import DEFAULT_HELDOUT, DEFAULT_SUBJECTS, HELDOUT_RULE, LOCAL, DemoConfig
from neurofed.trainer.bench import BENCH_DIR
from neurofed.trainer.data.profiles import ProfileError, get_profile
from neurofed.trainer.errors import NeuroFedError, run_cli
from neurofed.trainer.options import parse_int_list, parse_name_list, parse_subjects

# The lab's modules load inside their commands (every `neurofed` process imports this module: a coordinator or an
# export should not pay for the demo, the docs site or the benchmarks). A benchmark whose optional part (onnx
# tooling, Mosquitto clients, LSL) is missing says so in one line when it is run.


def _lab(module: str, name: str, what: str):
    """``module.name``, imported now; a missing optional dependency is one clear line (exit 2)."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise NeuroFedError(f"{what} is unavailable here: {exc} (pip install 'neurofed[dev]')") from None


app = typer.Typer(
    name="neurofed", help="Federated, attack-robust motor-imagery BCI: train, federate, export, benchmark.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
bench = typer.Typer(help="Benchmarks: results go to docs/bench/*.json and are summarised in docs/BENCHMARKS.md.",
                    no_args_is_help=True)
app.add_typer(bench, name="bench")

#: Packages that contribute commands, in help order.
COMMAND_MODULES = ("neurofed.trainer.cli", "neurofed.broker.cli", "neurofed.export.cli", "neurofed.app_cli",
                   "neurofed.broker.release_cli")


def _version(value: bool) -> None:
    if value:
        print(f"neurofed {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


# ---- lab commands: typer adapters over the lab's plain functions ------------------------------------------------

def demo_cmd(
    subjects: Annotated[str, typer.Option(help="Training subjects (one headset + edge client each).")] = DEFAULT_SUBJECTS,
    heldout: Annotated[str, typer.Option(help="Held-out subjects decoded live after training (default: the last 4 "
                                              "of the shared set).")] = DEFAULT_HELDOUT,
    algorithm: Annotated[str, typer.Option(help="safe or fedbs (SAFE at 100 rounds: the best deployable recipe on "
                                                "the 46-subject protocol).")] = "safe",
    rounds: Annotated[int, typer.Option(help="Federated rounds.")] = 100,
    fraction: Annotated[float, typer.Option(help="Fraction of clients per round (0.25 of 32 = 8 per round).")] = 0.25,
    batch_size: Annotated[int, typer.Option(help="Client batch size.")] = LOCAL.batch_size,
    local_epochs: Annotated[int, typer.Option(help="Local epochs per round.")] = LOCAL.local_epochs,
    lr: Annotated[float, typer.Option(help="Client SGD learning rate.")] = LOCAL.lr,
    speed: Annotated[float, typer.Option(help="Playback speed of the training headsets.")] = 20.0,
    live_speed: Annotated[float, typer.Option(help="Playback speed of the held-out headsets.")] = 20.0,
    runs: Annotated[str, typer.Option(help="EEGMMIDB runs each headset replays.")] = "4,8,12",
    eps: Annotated[str, typer.Option(help="FGSM budgets for BCA vs epsilon (comma list; '' = skip).")] = "0.01,0.03,0.05",
    broker: Annotated[str | None, typer.Option(help="Use this broker (mqtt://host:port) instead of the embedded one.")] = None,
    data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA", help="EEGMMIDB folder.")] = None,
    out: Annotated[Path | None, typer.Option(help="Run directory (default runs/demo-<timestamp>).")] = None,
    seed: Annotated[int, typer.Option(help="Federation seed.")] = 0,
    time_budget: Annotated[float, typer.Option(help="Abort (cleanly) after this many seconds.")] = 1800.0,
) -> None:
    """Run the whole system end to end: headsets, capture, federated training, export, live decoding, report."""
    try:
        eps_list = [float(e) for e in eps.split(",") if e.strip()]
    except ValueError:
        raise NeuroFedError(f"--eps {eps!r}: comma list of numbers") from None
    run_dir = out or Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    rule = HELDOUT_RULE if heldout == DEFAULT_HELDOUT else f"given on the command line (--heldout {heldout})"
    cfg = DemoConfig(subjects=parse_subjects(subjects, None), heldout=parse_subjects(heldout, None), heldout_rule=rule, algorithm=algorithm, rounds=rounds,
                     fraction=fraction, batch_size=batch_size, local_epochs=local_epochs, lr=lr, speed=speed,
                     live_speed=live_speed, runs=runs, eps=eps_list, broker=broker, data_dir=data_dir,
                     out=str(run_dir), seed=seed, time_budget_s=time_budget)
    res = _lab("neurofed.demo_run", "run_demo", "the demo")(cfg)
    if not res["checks"]["all_ok"]:
        raise NeuroFedError(f"demo finished but checks failed: {res['checks']['failed']} (see {run_dir}/report.md)")


def docs_cmd(
    open_: Annotated[bool, typer.Option("--open", help="Open the built index.html in a web browser, if this "
                                                       "machine has one.")] = False,
    out: Annotated[Path | None, typer.Option(help="Output folder (default docs/_build/html in the checkout).")] = None,
    fresh: Annotated[bool, typer.Option(help="Read every page again (sphinx-build -E), not only the changed ones.")] = False,
) -> None:
    """Build the documentation site (Sphinx, warnings are errors, examples executed on $NEUROFED_DATA); print the
    path of its index.html. Needs a checkout and the docs extra of pyproject.toml (scripts/docs.sh installs it)."""
    index = _lab("neurofed.docsite", "build_docs", "the docs build")(None, out, fresh)
    print(index)
    if open_ and not webbrowser.open(index.as_uri()):
        print(f"no web browser found here: open {index.as_uri()} yourself", file=sys.stderr)


def bench_e2e(
    model: Annotated[Path | None, typer.Option(
        help="exported .onnx, or a folder of per-profile models with --profile (default: random-init EEGNet, "
             "demo layout)")] = None,
    subject: Annotated[int, typer.Option(help="EEGMMIDB subject replayed live")] = 9,
    data_dir: Annotated[Path | None, typer.Option(help="EEGMMIDB folder (default $NEUROFED_DATA or ../shared/data)")] = None,
    seconds: Annotated[float, typer.Option(help="streaming time per run (real time)")] = 60.0,
    mode: Annotated[str, typer.Option(help="sliding (a window every --step s) or cue (one per cue)")] = "sliding",
    step: Annotated[float, typer.Option(help="sliding mode: seconds between windows")] = 0.1,
    chunk: Annotated[int, typer.Option(help="samples per LSL push of the headset")] = 16,
    load: Annotated[str, typer.Option(help="comma list of extra busy headsets per run, e.g. 0,4")] = "0,4",
    speed: Annotated[float, typer.Option(help="replay speed of the decoded headset (1 = real time)")] = 1.0,
    profile: Annotated[str | None, typer.Option(
        help="comma list of device profiles: one run per profile, the subject streamed as that profile's "
             "headset (headset-sim --profile) and decoded by edge-client infer with --model (the profile's "
             "model, or a folder from which it picks the model matching the stream)")] = None,
    out: Annotated[Path, typer.Option(help="JSON results")] = Path("docs/bench/e2e.json"),
) -> None:
    """End-to-end live decoding latency: window's last EEG sample in -> prediction out (LSL)."""
    profiles: list[str | None] = [None]
    if profile is not None:
        profiles = parse_name_list(profile)
        if model is None or not profiles:
            raise NeuroFedError("--profile needs --model: the exported model for that device profile (or a "
                                "folder of per-profile models)")
        for p in profiles:
            try:
                get_profile(p)
            except ProfileError as exc:
                raise NeuroFedError(f"--profile: {exc}") from None
    loads = parse_int_list(load, "--load")
    if any(n < 0 or n > 20 for n in loads):
        raise NeuroFedError(f"--load {load!r}: each value must be 0..20")
    _lab("neurofed.bench_e2e", "bench_e2e", "the e2e benchmark")(model, subject, data_dir, seconds, mode, step, chunk, loads, speed, profiles, out)


def bench_secagg(
    clients: str = typer.Option("24,100,500", help="Client counts, comma-separated."),
    rounds: int = typer.Option(2, help="Rounds per federation (the first includes nothing extra: clients join before it)."),
    broker: str = typer.Option("mqtt://127.0.0.1:1883", help="Broker URL (a real Mosquitto)."),
    out: Path = typer.Option(Path("docs/bench/secagg_mqtt.json"), help="Result JSON."),
    core: bool = typer.Option(True, help="Also time the masking core in process (SecAgg+ graph)."),
    swarm_procs: int = typer.Option(0, help="Processes playing the clients (0: one per CPU core).", min=0),
) -> None:
    """Secure aggregation's round overhead over MQTT (time, bytes) vs plain FedAvg rounds; results to ``out``."""
    _lab("neurofed.bench_secagg", "bench_secagg", "the secure aggregation benchmark")(parse_int_list(clients, "--clients"), rounds, broker, out, core, swarm_procs, clients)


def bench_fleet(
    clients: str = typer.Option("100,1000,10000", help="Client counts, comma-separated."),
    rounds: int = typer.Option(2, help="Rounds per federation (clients join before the first).", min=1),
    out: Path = typer.Option(Path("docs/bench/fleet_scale.json"), help="Result JSON."),
    swarm_procs: int = typer.Option(0, help="Processes playing the clients (0: one per CPU core).", min=0),
    profile: bool = typer.Option(False, help="Run the coordinator under cProfile; keep its top functions."),
    model: str = typer.Option("eegnet", help="The federation's model (eegnet, shallow, deep)."),
    compress: bool = typer.Option(True, help="[federation] compress: delta-coded, bit-shuffled LZMA2 bodies."),
) -> None:
    """Rounds of N clients through a Mosquitto sized by broker-config: time per round, coordinator RSS and CPU
    per update, bytes, broker CPU; every join and update accounted for (no training)."""
    _lab("neurofed.bench_fleet", "bench_fleet", "the fleet benchmark")(parse_int_list(clients, "--clients"), rounds, out, swarm_procs, profile, clients, model, compress)


def bench_swap(
    out: Path = typer.Option(Path("docs/bench/swap.json"), help="Result JSON."),
    md: Path = typer.Option(Path("docs/benchmarks/swap.md"), help="Markdown summary."),
    data_dir: Path | None = typer.Option(None, help="EEGMMIDB folder (default $NEUROFED_DATA)."),
    subject: int = typer.Option(3, help="EEGMMIDB subject the simulated headset replays (run 4, real time)."),
    releases: int = typer.Option(6, help="Signed releases published (the first starts the decoder).", min=2),
    interval: float = typer.Option(3.0, help="Seconds between two releases.", min=0.5),
    step: float = typer.Option(0.1, help="Sliding-window step of the decoder (s).", min=0.01),
    broker: str = typer.Option("mqtt://127.0.0.1:1883", help="Broker URL (a real broker: Mosquitto)."),
) -> None:
    """Release published -> first window decoded by it (p50), and windows lost at a swap: headset-sim on LSL, a
    real `edge-client infer --follow` process, signed releases published retained on a real broker."""
    # pylsl must load only after `neurofed demo` set up its private LSL session (tests/test_import_contract.py)
    from neurofed.bench_swap import bench_swap as run_swap_bench  # lazy: pylsl

    res = run_swap_bench(out, md, data_dir, subject, releases, interval, step, broker)
    typer.echo(f"wrote {out} and {md}: swap latency p50 {res['latency_ms_p50']:.1f} ms over {res['swaps']} swaps, "
               f"{res['windows_lost']} windows lost")


def bench_long_lived(
    out: Path = typer.Option(Path("docs/bench/long_lived.json"), help="Result JSON."),
    data_dir: Path | None = typer.Option(None, help="EEGMMIDB folder (default $NEUROFED_DATA)."),
    broker: str = typer.Option("mqtt://127.0.0.1:1883", help="Broker URL (a real broker: Mosquitto)."),
    strategy: str = typer.Option("fedavg", help="Federated strategy (one the asynchronous mode accepts)."),
    rounds: int = typer.Option(60, help="Model versions the federation makes.", min=1),
    buffer_k: int = typer.Option(6, help="Accepted updates per version (K).", min=1),
    max_staleness: int = typer.Option(1, help="Largest accepted staleness.", min=0),
    every: int = typer.Option(10, help="Versions between two release candidates.", min=1),
) -> None:
    """A long-lived federation of simulated headsets (sessions with gaps into their stores, late joiners, one
    leaving for good, validating clients) releasing through the gate to two cue-locked `edge-client infer --follow`
    decoders on held-out subjects: each release's live BCA beside its federated validation BCA."""
    # pylsl must load only after `neurofed demo` set up its private LSL session (tests/test_import_contract.py)
    from dataclasses import replace

    from neurofed.bench_long_lived import BENCH_PLAN  # lazy: pylsl
    from neurofed.bench_long_lived import bench_long_lived as run_long_lived  # lazy: pylsl

    plan = replace(BENCH_PLAN, strategy=strategy, rounds=rounds, buffer_k=buffer_k, max_staleness=max_staleness,
                   every=every)
    res = run_long_lived(out, data_dir, broker, plan)
    for line in res["summary"]:
        typer.echo(line)
    typer.echo(f"wrote {out} ({res['seconds']:.0f} s)")


def bench_standalone(
    checkpoint: Annotated[Path, typer.Option(help="trained .safetensors checkpoint")],
    subjects: Annotated[str, typer.Option(help="held-out EEGMMIDB subjects, e.g. '13-19'")] = "13-16",
    data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA")] = None,
    reps: Annotated[int, typer.Option(help="timed windows")] = 500,
    warmup: Annotated[int, typer.Option()] = 50,
    out_dir: Annotated[Path, typer.Option()] = BENCH_DIR,
    browser: Annotated[bool, typer.Option(help="also time the page in headless Chromium")] = True,
    name: Annotated[str, typer.Option(help="result name: OUT_DIR/NAME.json")] = "standalone",
) -> None:
    """Standalone graph == Python pipeline on real held-out sessions (ORT, tract, onnx.reference); p50 per window."""
    _lab("neurofed.bench_standalone", "bench_standalone", "the standalone benchmark")(checkpoint, parse_subjects(subjects, data_dir), data_dir, reps, warmup, out_dir, browser, name)


def bench_runtime(
    checkpoint: Annotated[Path | None, typer.Option(help="trained .safetensors checkpoint (exported to a standalone "
                                                         "graph at 160 Hz)")] = None,
    model: Annotated[Path | None, typer.Option(help="or: a standalone .onnx at 160 Hz")] = None,
    subject: Annotated[int, typer.Option(help="EEGMMIDB subject whose sessions are decoded and streamed")] = 3,
    data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA")] = None,
    live_seconds: Annotated[float, typer.Option(help="seconds of real-time LSL streaming per decoder")] = 30.0,
    venv_dir: Annotated[Path | None, typer.Option(help="where to build the runtime-only venv (default: a temp dir)")]
    = None,
    out_dir: Annotated[Path, typer.Option()] = BENCH_DIR,
    name: Annotated[str, typer.Option(help="result name: OUT_DIR/NAME.json")] = "runtime",
) -> None:
    """neurofed-runtime alone in a fresh venv (no torch) vs the full package: installed size, import time,
    per-window latency, peak RSS decoding a live LSL stream."""
    res = _lab("neurofed.bench_runtime", "bench_runtime", "the runtime benchmark")(checkpoint, model, subject, data_dir, live_seconds, venv_dir, out_dir, name)
    typer.echo(json.dumps({k: res[k] for k in ("installed_size_mb", "import_ms_median_of_5", "latency_per_window",
                                               "live_lsl_rss_mb", "targets")}, indent=1))


def bench_lsl(
    seconds: Annotated[float, typer.Option(help="Streaming time per run (real time).")] = 10.0,
    headsets: Annotated[int, typer.Option(help="Simultaneous headsets in the loss test.")] = 8,
    out: Annotated[Path, typer.Option(help="Where to write the JSON results.")] = Path("docs/bench/lsl.json"),
) -> None:
    """LSL ingestion: sample-to-buffer latency, ingestion CPU, samples lost with N headsets."""
    res = _lab("neurofed.edge.bench_lsl", "run_bench", "the LSL benchmark")(seconds, headsets)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    for r in res["single"]:
        print(f"{r['channels']} ch x {r['sfreq']:g} Hz: latency p50 {r['latency_ms_newest_sample']['p50']:.2f} ms "
              f"p99 {r['latency_ms_newest_sample']['p99']:.2f} ms (newest sample of each pull); "
              f"all samples p50 {r['latency_ms_all_samples']['p50']:.2f} / p99 {r['latency_ms_all_samples']['p99']:.2f} ms; "
              f"CPU {r['cpu_percent_one_core']:.1f} % of one core; lost {r['pushed'] - r['received'][0]}")
    m = res["multi"]
    print(f"{m['headsets']} headsets x 64 ch x 160 Hz: {m['samples_lost_total']} samples lost, "
          f"gaps {sum(m['gaps'])}, CPU {m['cpu_percent_one_core']:.1f} % of one core -> {out}")


for _mod in COMMAND_MODULES:
    try:
        importlib.import_module(_mod).register(app, bench)
    except ImportError as _exc:  # a broken optional part must not take the other commands down
        print(f"warning: commands of {_mod.split('.')[0]}/ unavailable ({_exc})", file=sys.stderr)
app.command("demo")(demo_cmd)
app.command("docs")(docs_cmd)
bench.command("runtime")(bench_runtime)
bench.command("swap")(bench_swap)
bench.command("long-lived")(bench_long_lived)
bench.command("standalone")(bench_standalone)
bench.command("secagg")(bench_secagg)
bench.command("fleet")(bench_fleet)
bench.command("lsl")(bench_lsl)
bench.command("e2e")(bench_e2e)

def main() -> None:
    """Entry point: run the CLI, turning NeuroFed's own errors into one clear line."""
    run_cli(app)


if __name__ == "__main__":
    main()
