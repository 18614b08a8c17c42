"""``neurofed bench e2e``: real headset-sim and edge-client infer processes over a private LSL session."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from neurofed.supervise import command

NEUROFED = command("neurofed")


@pytest.mark.slow
# headsets, recorder, export and live inference as processes: 16 s idle, several times that under load
@pytest.mark.timeout(240)
def test_bench_e2e_measures_live_latency(tmp_path: Path, data_dir: Path) -> None:
    """Replayed at 4x (stream timestamps run ahead of the LSL clock): both latencies stay real and positive."""
    out = tmp_path / "e2e.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", NEUROFED_CACHE=str(tmp_path / "cache"))
    env.pop("LSLAPICFG", None)  # the bench makes its own private session
    proc = subprocess.run([*NEUROFED, "bench", "e2e", "--seconds", "6", "--load", "0", "--subject", "2", "--speed", "4",
                           "--data-dir", str(data_dir), "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=230, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    (run,) = res["runs"]
    # a window every 0.1 s for ~6 s (the first ones need a full 4 s window of signal)
    assert run["matched"] >= 10 and run["matched"] <= run["predictions"]
    lat = run["latency_ms"]
    # a measured, ordered latency; its targets are the benchmark's (docs/bench/e2e.json), not this test's: the bound
    # only catches a unit error (a loaded CI run's maximum reached 3.4 s)
    assert 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"] < 10_000
    assert res["targets"] == {"p50_ms": 10.0, "p99_ms": 30.0}
    dec = run["decoder_stats"]  # the decoder's own log: emission - arrival, never negative
    assert run["speed"] == 4.0 and dec["predictions"] >= run["matched"] and 0 < dec["latency_ms_p50"] < 10_000
    assert dec["stream_time_minus_arrival_s_p50"] > 1.0  # the replayed stream's stamps ran ahead
    assert len(run["load_average_before"]) == len(run["load_average_after"]) == 3 and run["cpu_count"] >= 1
    assert "latency p50" in proc.stdout


@pytest.mark.integration
def test_bench_e2e_rejects_bad_options(tmp_path: Path) -> None:
    proc = subprocess.run([*NEUROFED, "bench", "e2e", "--model", str(tmp_path / "missing.onnx"), "--load", "0"],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "missing.onnx: ONNX model not found" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
    for args, needle in ((["--profile", "unicorn8"], "--profile needs --model"),
                         (["--profile", "nope", "--model", str(tmp_path)], "--profile: unknown device profile 'nope'")):
        proc = subprocess.run([*NEUROFED, "bench", "e2e", "--load", "0", *args], check=False, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and needle in proc.stderr + proc.stdout, proc.stderr + proc.stdout
        assert "Traceback" not in proc.stderr
