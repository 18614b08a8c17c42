"""``neurofed bench onnx`` building blocks run and report consistent numbers (tiny repetition counts)."""

from __future__ import annotations

import torch

from neurofed.export.bench import bench_shape

torch.set_num_threads(1)


def test_bench_shape_smoke():
    r = bench_shape("eegnet", 21, 320, 80.0, "batch_specific", reps=5, warmup=1, batches=(1,))
    row = r["batch_1"]
    for k in ("torch_eager", "onnxruntime_fp32", "onnxruntime_int8", "onnxruntime_int8_linear_only"):
        assert row[k]["reps"] == 5 and 0 < row[k]["p50_ms"] <= row[k]["p99_ms"]
    assert row["speedup_fp32_vs_torch"] == row["torch_eager"]["p50_ms"] / row["onnxruntime_fp32"]["p50_ms"]
    assert r["size_bytes"]["int8"] < r["size_bytes"]["fp32"]
    assert "edge_engine" not in r  # the engine is timed by `neurofed bench standalone` (export/ imports no edge/)


def test_bench_shape_ensemble_is_one_graph_of_its_members():
    """members=3: one ONNX graph holding three EEGNets (about three times one EEGNet's graph and weights)."""
    one = bench_shape("eegnet", 21, 320, 80.0, "batch_specific", reps=3, warmup=1, batches=(1,))
    three = bench_shape("eegnet", 21, 320, 80.0, "batch_specific", reps=3, warmup=1, batches=(1,), members=3)
    assert one["members"] == 1 and three["members"] == 3
    assert 2.5 * one["size_bytes"]["fp32"] < three["size_bytes"]["fp32"] < 4.0 * one["size_bytes"]["fp32"]
    assert three["batch_1"]["onnxruntime_fp32"]["reps"] == 3
