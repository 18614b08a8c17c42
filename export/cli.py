"""Commands that export/ adds to ``neurofed``: ``export``, ``evaluate`` and ``bench onnx``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def _parse_subjects(spec: str | None, data_dir: str | None) -> list[int] | None:
    if spec is None:
        return None
    from trainer.cli import parse_subjects

    return parse_subjects(spec, data_dir)


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
        bool, typer.Option("--int8", help="also write a dynamically int8-quantised model")
    ] = False,
    int8_ops: Annotated[
        str, typer.Option(help="int8 scope: all (Conv+Gemm) or linear (Gemm/MatMul only)")
    ] = "all",
    report: Annotated[Path | None, typer.Option("--json", help="write the export report as JSON")] = None,
) -> None:
    """Export a checkpoint to ONNX (opset 18, dynamic batch, batch-specific BN kept) and verify it."""
    from export.onnx_export import export_model, held_out_data, report_dict
    from trainer.checkpoint import load_checkpoint
    from trainer.errors import NeuroFedError

    if not checkpoint.is_file():
        raise NeuroFedError(f"{checkpoint}: checkpoint file not found")
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
        from export.quantize import accuracy_delta, quantize

        q = quantize(output, output.with_suffix(".int8.onnx"), int8_ops)
        out["int8"] = {"path": str(q), "ops": int8_ops, **accuracy_delta(output, q, X, y)}
        d = out["int8"]
        console.print(
            f"wrote {q}: BCA fp32 {100 * d['bca_fp32']:.1f} % -> int8 {100 * d['bca_int8']:.1f} % "
            f"(delta {100 * d['bca_delta']:+.1f} pts, agreement {100 * d['agreement']:.1f} %, "
            f"{d['size_fp32_bytes']} -> {d['size_int8_bytes']} bytes)"
        )
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(out, indent=1))


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
    attack: Annotated[str | None, typer.Option(help="fgsm or pgd (white-box, on a torch twin)")] = None,
    eps: Annotated[
        float, typer.Option(help="attack budget, multiple of each trial's per-channel std")
    ] = 0.03,
    checkpoint: Annotated[Path | None, typer.Option(help="checkpoint for the attack's torch twin")] = None,
    batch_size: Annotated[int | None, typer.Option(help="test batch (default: model metadata)")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="write results as JSON")] = None,
) -> None:
    """Balanced accuracy of an ONNX model per subject (onnxruntime forward passes)."""
    from export.evaluate import evaluate, load_eegmmidb_for, load_files_for
    from export.metadata import read_onnx_meta
    from trainer.errors import NeuroFedError

    from trainer.attacks import ATTACKS

    if attack is not None and attack not in ATTACKS:
        raise typer.BadParameter(f"attack {attack!r}: use one of {', '.join(ATTACKS)}")
    if not model.is_file():
        raise NeuroFedError(f"{model}: ONNX model file not found")
    meta = read_onnx_meta(model)
    if recording:
        data = load_files_for(meta, recording, _parse_event_map(event_map))
    else:
        from trainer.cli import parse_subjects

        with console.status("loading subjects..."):
            data = load_eegmmidb_for(meta, parse_subjects(subjects, data_dir), data_dir)
    with console.status("evaluating..."):
        res = evaluate(model, data, attack, eps, checkpoint, seed, batch_size)
    metrics = list(res["summary"])
    t = Table(
        title=f"{meta.model} ({meta.bn_mode}{', ' + meta.quantized if meta.quantized else ''}): "
        f"BCA per subject, test batch {res['test_batch_size']}" + (f", {attack} eps {eps}" if attack else "")
    )
    t.add_column("subject")
    t.add_column("trials", justify="right")
    for m in metrics:
        t.add_column(m, justify="right")
    for s, row in res["per_subject"].items():
        t.add_row(s, str(row["n_trials"]), *[f"{100 * row[m]:.1f}" for m in metrics])
    t.add_row(
        "mean ± std",
        "",
        *[
            f"{100 * res['summary'][m]['mean']:.1f} ± {100 * res['summary'][m]['std_subjects']:.1f}"
            for m in metrics
        ],
        style="bold",
    )
    console.print(t)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(res, indent=1))
        console.print(f"wrote {json_out}")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this package's commands (and benchmarks) to the CLI."""
    app.command("export")(export_cmd)
    app.command("evaluate")(evaluate_cmd)
    from export.bench import bench_onnx

    bench.command("onnx")(bench_onnx)
