"""Commands that export/ adds to ``neurofed``: ``export``, ``evaluate`` and ``bench onnx``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from neurofed.export import bench as export_bench
from neurofed.trainer.data.eegmmidb import parse_subjects
from neurofed.trainer.errors import NeuroFedError

console = Console()


def _parse_subjects(spec: str | None, data_dir: str | None) -> list[int] | None:
    if spec is None:
        return None
    return parse_subjects(spec, data_dir)


def _write_json(path: Path | None, obj: object) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj, indent=1))


def export_cmd(
    checkpoint: Annotated[Path, typer.Argument(help="NeuroFed .safetensors checkpoint")],
    output: Annotated[Path, typer.Option("--output", "-o", help="ONNX file to write")] = Path("model.onnx"),
    data_dir: Annotated[
        str | None, typer.Option(envvar="NEUROFED_DATA", help="EEGMMIDB folder for verification")
    ] = None,
    verify: Annotated[
        bool, typer.Option(help="compare onnxruntime with torch on real held-out trials")
    ] = True,
    verify_subjects: Annotated[
        str | None, typer.Option(help="subjects for verification (default: first not trained on)")
    ] = None,
    int8: Annotated[
        bool, typer.Option("--int8", help="also write a dynamically int8-quantised model (one per device profile "
                                          "of a hierarchical checkpoint)")
    ] = False,
    int8_ops: Annotated[
        str, typer.Option(help="int8 scope: all (Conv+Gemm) or linear (Gemm/MatMul only)")
    ] = "all",
    report: Annotated[Path | None, typer.Option("--json", help="write the export report as JSON")] = None,
    standalone: Annotated[
        bool,
        typer.Option(
            "--standalone",
            help="write ONE self-contained graph instead: raw window + state in, probabilities + next state out",
        ),
    ] = False,
    rate: Annotated[float | None, typer.Option(
        help="--standalone: the device's sampling rate in Hz [default: the model's device profile's, else 160]")] = None,
    unit: Annotated[str | None, typer.Option(
        help="--standalone: the device's unit (V, mV, uV, nV) [default: the model's device profile's, else uV]")] = None,
    step: Annotated[float, typer.Option(help="--standalone: sliding step in s recorded for apps")] = 0.5,
) -> None:
    """Export a checkpoint to ONNX (opset 18, dynamic batch, batch-specific BN kept) and verify it.

    With ``--standalone``: one graph doing the guard, band-pass, resampling, online EA and
    batch-specific BN context itself (``probs, state = run(window, state)``; see docs/apps.md). A model
    for a device profile takes that profile's rate and unit; a hierarchical (fleeg) checkpoint gives one
    graph per profile (``model.<profile>.onnx``).

    With ``--int8``: also ``model.int8.onnx`` (``model.<profile>.int8.onnx`` for each profile of a hierarchical
    checkpoint), dynamically quantised, with its accuracy change on the held-out trials the export is verified on.
    """
    from neurofed.export.onnx_export import (  # lazy: onnx, onnxruntime, torch (keeps --help fast)
        export_model,
        held_out_data,
        report_dict,
    )
    from neurofed.trainer.checkpoint import load_checkpoint  # lazy: torch (keeps --help fast)

    if standalone:
        from neurofed.export.standalone import export_standalone  # lazy: onnx, torch (keeps --help fast)

        if int8:
            raise NeuroFedError("--int8 applies to the plain export, not to --standalone")
        if checkpoint.is_file() and _hierarchical(checkpoint):  # one graph per device profile, at its rate and unit
            from neurofed.export.standalone import export_standalone_profiles  # lazy: onnx, torch

            if rate is not None or unit is not None:
                raise NeuroFedError("--rate/--unit: each device profile's graph takes its profile's rate and unit")
            with console.status("exporting one standalone graph per device profile..."):
                done = export_standalone_profiles(checkpoint, output, step)
            for path, meta, _ in done.values():
                _print_standalone(path, meta)
            _write_json(report, {"profiles": {p: meta.model_dump() for p, (_, meta, _) in done.items()}})
            return
        with console.status("exporting the standalone graph..."):
            meta, _ = export_standalone(checkpoint, output, rate, unit, step)
        _print_standalone(output, meta)
        _write_json(report, meta.model_dump())
        return

    if not checkpoint.is_file():
        raise NeuroFedError(f"{checkpoint}: checkpoint file not found")
    if _hierarchical(checkpoint):  # a fleeg federation's server state: one model per device profile
        _export_profiles(checkpoint, output, data_dir, verify, verify_subjects, report, int8_ops if int8 else None)
        return
    model, cmeta = load_checkpoint(checkpoint)
    X = y = ids = None
    held = True
    if verify or int8:
        X, y, ids, held = held_out_data(cmeta, data_dir, _parse_subjects(verify_subjects, data_dir))
    with console.status("exporting and verifying..."):
        meta, rep = export_model(model, cmeta, output, X if verify else None, ids, held)
    out = report_dict(meta, rep)
    for c in rep.checks:
        console.print(f"[green]ok[/] {c}")
    if verify:
        console.print(
            f"verified on {rep.n_trials} {'held-out' if held else 'TRAINING'} trials "
            f"of {', '.join(rep.subjects)}; "
            f"max |dlogit| per batch size: { {b: f'{d:.1e}' for b, d in rep.max_abs_diff.items()} }"
        )
    console.print(f"wrote {output} (model_hash {meta.model_hash[:12]}...)")
    if int8:
        out["int8"] = _int8(output, int8_ops, X, y)
    _write_json(report, out)


def _int8(fp32: Path, ops: str, X, y) -> dict:
    """Quantise an exported model next to it (``model.onnx`` -> ``model.int8.onnx``) and report its accuracy change
    on ``(X, y)``."""
    from neurofed.export.quantize import (  # lazy: onnx, onnxruntime, torch (keeps --help fast)
        accuracy_delta,
        quantize,
    )

    q = quantize(fp32, fp32.with_suffix(".int8.onnx"), ops)
    d = {"path": str(q), "ops": ops, **accuracy_delta(fp32, q, X, y)}
    console.print(
        f"wrote {q}: BCA fp32 {100 * d['bca_fp32']:.1f} % -> int8 {100 * d['bca_int8']:.1f} % "
        f"(delta {100 * d['bca_delta']:+.1f} pts, agreement {100 * d['agreement']:.1f} %, "
        f"{d['size_fp32_bytes']} -> {d['size_int8_bytes']} bytes)"
    )
    return d


def _print_standalone(path: Path, meta) -> None:
    sa = meta.standalone
    console.print(
        f"wrote {path}: window {meta.n_channels} x {sa['window_samples']} ({sa['unit']} at {sa['rate']:g} Hz"
        + (f", device profile {meta.profile['name']}" if meta.profile else "") + f"), "
        f"state {sa['state_size']} float64, {sa['context_windows']} BN context windows, "
        f"model_hash {meta.model_hash[:12]}..."
    )


def _hierarchical(checkpoint: Path) -> bool:
    from safetensors import safe_open

    from neurofed.trainer.checkpoint import is_hierarchical  # lazy: torch (keeps --help fast)

    try:
        with safe_open(str(checkpoint), framework="pt") as f:
            return is_hierarchical(f.keys())
    except Exception as exc:  # not a safetensors file: load_checkpoint says so clearly
        if isinstance(exc, NeuroFedError):
            raise
        return False


def _export_profiles(checkpoint: Path, output: Path, data_dir: str | None, verify: bool, verify_subjects: str | None,
                     report: Path | None, int8_ops: str | None = None) -> None:
    """Export one verified ONNX model per device profile of a hierarchical checkpoint (and, with ``int8_ops``, its
    int8 copy, scored on the held-out trials recorded through that profile's device)."""
    from neurofed.export.onnx_export import (  # lazy: onnx, onnxruntime, torch (keeps --help fast)
        export_profiles,
        held_out_data,
        report_dict,
    )
    from neurofed.trainer.checkpoint import load_profile_models  # lazy: torch (keeps --help fast)

    subjects = _parse_subjects(verify_subjects, data_dir)
    if int8_ops is not None:
        from neurofed.export.quantize import QUANT_OPS  # lazy: onnx, onnxruntime, torch (keeps --help fast)

        if int8_ops not in QUANT_OPS:  # before exporting anything
            raise NeuroFedError(f"quantisation ops {int8_ops!r}: choose from {sorted(QUANT_OPS)}")
    with console.status("exporting and verifying one model per device profile..."):
        done = export_profiles(checkpoint, output, data_dir, verify, subjects)
    metas = {p: cmeta for p, (_, cmeta) in load_profile_models(checkpoint).items()} if int8_ops else {}
    out = {}
    for p, (path, meta, rep) in done.items():
        worst = max(rep.max_abs_diff.values(), default=float("nan"))
        console.print(f"profile {p}: wrote {path} ({meta.n_channels} ch of {meta.profile['name']} at "
                      f"{meta.profile['sfreq']:g} Hz, model_hash {meta.model_hash[:12]}...)"
                      + (f"; verified on {rep.n_trials} trials of {', '.join(rep.subjects)}, max |dlogit| "
                         f"{worst:.1e}" if verify else ""))
        out[p] = {"path": str(path), **report_dict(meta, rep)}
        if int8_ops is not None:  # the trials the float model was verified on (preprocessing is cached)
            X, y, _, _ = held_out_data(metas[p], data_dir, subjects)
            out[p]["int8"] = _int8(path, int8_ops, X, y)
    _write_json(report, {"profiles": out})


def _parse_event_map(spec: str) -> dict[str, str]:
    pairs = [p.split("=", 1) for p in spec.split(",") if p.strip()]
    if not pairs or any(len(p) != 2 for p in pairs):
        raise typer.BadParameter(f"event map {spec!r}: use ANNOT=class,ANNOT=class")
    return {a.strip(): b.strip() for a, b in pairs}


def evaluate_cmd(
    model: Annotated[Path, typer.Option("--model", help="exported .onnx model")],
    data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA", help="EEGMMIDB folder")] = None,
    subjects: Annotated[
        str | None, typer.Option(help="EEGMMIDB subjects, e.g. '1-5,9' (default all)")
    ] = None,
    recording: Annotated[
        list[Path] | None, typer.Option(help="MNE-readable recording (one subject each; repeatable)")
    ] = None,
    event_map: Annotated[
        str, typer.Option(help="annotation -> class for --recording")
    ] = "T1=left_fist,T2=right_fist",
    attack: Annotated[str | None, typer.Option(
        help="fgsm, pgd or autoattack (white-box, on a torch twin); square or hsj (black-box: they query the ONNX "
             "graph itself, no checkpoint needed)")] = None,
    eps: Annotated[
        float, typer.Option(help="attack budget, multiple of each trial's per-channel std")
    ] = 0.03,
    checkpoint: Annotated[Path | None, typer.Option(help="checkpoint for a white-box attack's torch twin")] = None,
    batch_size: Annotated[int | None, typer.Option(help="test batch (default: model metadata)")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="write results as JSON")] = None,
    trained_on: Annotated[
        str | None,
        typer.Option(help="subjects the model trained on, e.g. '1-8' (default: from the model's data hashes)"),
    ] = None,
) -> None:
    """Balanced accuracy of an ONNX model per subject (onnxruntime forward passes).

    Subjects the model trained on are scored on trials they trained on: they are marked
    "training set" and summarised apart from held-out subjects (sample std, ddof=1).
    """
    from neurofed.export.evaluate import (  # lazy: onnx, onnxruntime, torch (keeps --help fast)
        evaluate,
        load_eegmmidb_for,
        load_files_for,
    )
    from neurofed.export.metadata import read_onnx_meta  # lazy: onnx, onnxruntime, torch (keeps --help fast)
    from neurofed.trainer.attacks import ATTACKS  # lazy: torch (keeps --help fast)

    if attack is not None and attack not in ATTACKS:
        raise typer.BadParameter(f"attack {attack!r}: use one of {', '.join(ATTACKS)}")
    if not model.is_file():
        raise NeuroFedError(f"{model}: ONNX model file not found")
    meta = read_onnx_meta(model)
    given = None if trained_on is None else [f"S{n:03d}" for n in parse_subjects(trained_on, None)]
    if recording:
        data = load_files_for(meta, recording, _parse_event_map(event_map))
    else:
        with console.status("loading subjects..."):
            data = load_eegmmidb_for(meta, parse_subjects(subjects, data_dir), data_dir)
    with console.status("evaluating..."):
        res = evaluate(model, data, attack, eps, checkpoint, seed, batch_size, trained_on=given)
    metrics = ["bca"] + (["bca_attacked"] if attack else [])
    t = Table(
        title=f"{meta.model} ({meta.bn_mode}{', ' + meta.quantized if meta.quantized else ''}): "
        f"BCA per subject, test batch {res['test_batch_size']}" + (f", {attack} eps {eps}" if attack else "")
    )
    t.add_column("subject")
    t.add_column("trials", justify="right")
    t.add_column("scored on")
    for m in metrics:
        t.add_column(m, justify="right")
    known = res["training_subjects"] is not None
    for s, row in res["per_subject"].items():
        where = "training set" if row["trained_on"] else ("held out" if known else "unknown")
        t.add_row(s, str(row["n_trials"]), where, *[f"{100 * row[m]:.1f}" for m in metrics])
    groups = [("mean ± sd, held out" if known else "mean ± sd (training membership unknown)", res["summary"]),
              ("mean ± sd, training set", res["summary_training"])]
    for name, summ in groups:
        if summ:
            t.add_row(name, "", f"{next(iter(summ.values()))['n_subjects']} subj.",
                      *[f"{100 * summ[m]['mean']:.1f} ± {100 * summ[m]['std_subjects']:.1f}" for m in metrics],
                      style="bold")
    console.print(t)
    if res["summary_training"]:
        console.print("training-set scores are on trials the model trained on; they are not accuracy estimates "
                      f"({res['training_subjects_source']}). sd: sample standard deviation over subjects (ddof=1).")
    elif not known:
        console.print("the model's metadata does not say which subjects it trained on (pass --trained-on); "
                      "sd: sample standard deviation over subjects (ddof=1).")
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(res, indent=1))
        console.print(f"wrote {json_out}")


def bench_onnx(
    reps: Annotated[int, typer.Option(help="timed forward passes per case")] = 500,
    warmup: Annotated[int, typer.Option()] = 50,
    out_dir: Annotated[Path, typer.Option()] = export_bench.BENCH_DIR,
) -> None:
    """Forward latency (p50, 1 thread): onnxruntime fp32/int8 vs torch eager, batch 1 and 8."""
    export_bench.bench_onnx(reps, warmup, out_dir)


def bench_web_cmd(
    bundle: Annotated[Path, typer.Option(help="app bundle (neurofed app bundle) whose recording is decoded")],
    reps: Annotated[int, typer.Option(help="timed windows per case")] = 300,
    warmup: Annotated[int, typer.Option()] = 20,
    out_dir: Annotated[Path, typer.Option()] = export_bench.BENCH_DIR,
    name: Annotated[str, typer.Option(help="JSON name in OUT_DIR")] = "web",
    only: Annotated[str | None, typer.Option(help="run only the cases whose label contains this")] = None,
) -> None:
    """Per-window inference in headless Chromium: WASM SIMD/threads, graph optimisation, WebGPU, WebNN."""
    from neurofed.export.apps import packaged_web  # lazy: onnx, onnxruntime (keeps --help fast)

    with console.status("benchmarking onnxruntime-web in headless Chromium..."):
        path = export_bench.bench_web(bundle, reps, warmup, out_dir, packaged_web(), name, only=only)
    console.print(f"wrote {path}")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this package's commands (and benchmarks) to the CLI."""
    app.command("export")(export_cmd)
    app.command("evaluate")(evaluate_cmd)
    bench.command("onnx")(bench_onnx)
    bench.command("web")(bench_web_cmd)
