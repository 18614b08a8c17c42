"""``neurofed bench onnx``: onnxruntime vs torch eager forward latency, fp32 vs int8."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from neurofed.trainer.bench import BENCH_DIR, write_result
from neurofed.trainer.data import PreprocessConfig


def time_calls(fn: Callable[[], object], reps: int, warmup: int) -> dict:
    """p50/p90/p99/mean of ``fn`` in ms over ``reps`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    ts = np.empty(reps)
    for i in range(reps):
        t = time.perf_counter()
        fn()
        ts[i] = time.perf_counter() - t
    ms = ts * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "reps": reps,
    }


def bench_shape(
    model_name: str,
    n_channels: int,
    n_times: int,
    sfreq: float,
    bn_mode: str,
    reps: int,
    warmup: int,
    batches: tuple[int, ...],
    members: int = 1,
) -> dict:
    """Latency of one architecture/shape: torch eager vs onnxruntime fp32 vs int8, 1 thread each.

    ``members`` > 1: a :class:`~neurofed.trainer.models.ensemble.SoftmaxEnsemble` of that many such models in one graph
    (what ``neurofed combine`` + ``neurofed export`` deploy)."""
    import torch

    from neurofed.export.metadata import (  # lazy: onnx, onnxruntime, torch (loaded only when used)
        build_meta,
        embed_meta,
    )
    from neurofed.export.onnx_export import to_onnx  # lazy: onnx, onnxruntime, torch (loaded only when used)
    from neurofed.export.quantize import quantize  # lazy: onnx, onnxruntime, torch (loaded only when used)
    from neurofed.export.runtime import OnnxModel  # lazy: onnx, onnxruntime (loaded only when used)
    from neurofed.trainer.checkpoint import ModelMeta  # lazy: torch (loaded only when used)
    from neurofed.trainer.models import build_model  # lazy: torch (loaded only when used)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    from neurofed.trainer.models.ensemble import (  # lazy: torch (loaded only when used)
        ENSEMBLE,
        SoftmaxEnsemble,
    )

    nets = [build_model(model_name, n_channels, 2, n_times, sfreq, bn_mode) for _ in range(members)]
    net = (nets[0] if members == 1 else SoftmaxEnsemble(nets)).eval()
    cm = ModelMeta(
        model_name if members == 1 else ENSEMBLE,
        n_channels,
        2,
        n_times,
        sfreq,
        bn_mode,
        [f"ch{i}" for i in range(n_channels)],
        ["a", "b"],
        PreprocessConfig(tmax=n_times / sfreq, resample=sfreq).to_dict(),
    )
    out: dict = {
        "model": model_name,
        "members": members,
        "bn_mode": bn_mode,
        "shape": [n_channels, n_times],
        "sfreq": sfreq,
        "weights": "random init (seed 0): latency does not depend on weight values",
    }
    with tempfile.TemporaryDirectory() as tmp:
        proto = to_onnx(net, n_channels, n_times)
        embed_meta(proto, build_meta(cm, net.state_dict()))
        fp32 = Path(tmp) / "m.onnx"
        fp32.write_bytes(proto.SerializeToString())
        int8 = quantize(fp32, Path(tmp) / "m.int8.onnx", "all")
        int8_lin = quantize(fp32, Path(tmp) / "m.int8lin.onnx", "linear")
        sessions = {
            "onnxruntime_fp32": OnnxModel(fp32, threads=1),
            "onnxruntime_int8": OnnxModel(int8, threads=1),
            "onnxruntime_int8_linear_only": OnnxModel(int8_lin, threads=1),
        }
        rng = np.random.default_rng(0)
        for b in batches:
            x = rng.standard_normal((b, n_channels, n_times)).astype(np.float32)
            xt = torch.from_numpy(x)
            row: dict = {}

            def eager(xt: torch.Tensor = xt) -> None:
                with torch.inference_mode():
                    net(xt)

            row["torch_eager"] = time_calls(eager, reps, warmup)
            for name, om in sessions.items():
                row[name] = time_calls(lambda om=om, x=x: om.forward(x), reps, warmup)
            row["speedup_fp32_vs_torch"] = row["torch_eager"]["p50_ms"] / row["onnxruntime_fp32"]["p50_ms"]
            row["speedup_int8_vs_fp32"] = (
                row["onnxruntime_fp32"]["p50_ms"] / row["onnxruntime_int8"]["p50_ms"]
            )
            out[f"batch_{b}"] = row
        out["size_bytes"] = {
            "fp32": fp32.stat().st_size,
            "int8": int8.stat().st_size,
            "int8_linear_only": int8_lin.stat().st_size,
        }
    return out


def ens_label(members: int) -> str:
    """`` x6 ensemble`` for a case of several members, else nothing."""
    return f" x{members} ensemble" if members > 1 else ""


def bench_onnx(reps: int = 500, warmup: int = 50, out_dir: Path = BENCH_DIR) -> None:
    """Forward latency (p50, 1 thread): onnxruntime fp32/int8 vs torch eager, batch 1 and 8."""
    from rich.console import Console

    console = Console()
    # the last case: the 6-model ensemble of studies/table46 (SAFE + FedBS x 3 seeds) as one graph
    cases = [("eegnet", 21, 320, 80.0, 1), ("eegnet", 64, 640, 160.0, 1), ("shallow", 21, 320, 80.0, 1),
             ("eegnet", 21, 320, 80.0, 6)]
    results = []
    for name, c, t, fs, k in cases:
        with console.status(f"{name}{ens_label(k)} {c}x{t}..."):
            results.append(bench_shape(name, c, t, fs, "batch_specific", reps, warmup, (1, 8), k))
    e = results[0]["batch_1"]
    targets = {
        "eegnet_21x320_ort_fp32_p50_le_0.5ms": e["onnxruntime_fp32"]["p50_ms"] <= 0.5,
        "eegnet_21x320_ort_speedup_ge_3x": e["speedup_fp32_vs_torch"] >= 3.0,
    }
    import os

    load = os.getloadavg()  # the machine is shared: record how busy it was
    p = write_result(
        "onnx",
        {"threads": 1, "load_average_1_5_15": list(load), "cases": results, "targets_met": targets},
        out_dir,
    )
    for r in results:
        for b in (1, 8):
            row = r[f"batch_{b}"]
            console.print(
                f"{r['model']}{ens_label(r['members'])} {r['shape'][0]}x{r['shape'][1]} batch {b}: "
                f"torch {row['torch_eager']['p50_ms']:.3f} ms, "
                f"ORT fp32 {row['onnxruntime_fp32']['p50_ms']:.3f} ms ({row['speedup_fp32_vs_torch']:.1f}x), "
                f"int8 {row['onnxruntime_int8']['p50_ms']:.3f} ms, int8 linear-only "
                f"{row['onnxruntime_int8_linear_only']['p50_ms']:.3f} ms"
            )
    console.print(f"targets: {targets}\nwrote {p}")
