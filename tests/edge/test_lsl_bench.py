"""The LSL benchmark runs end to end (tiny) and reports no lost samples."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from neurofed.cli import bench_lsl


@pytest.mark.slow
def test_bench_lsl_command_small(tmp_path):
    app, bench = typer.Typer(), typer.Typer()
    app.add_typer(bench, name="bench")
    bench.command("lsl")(bench_lsl)  # the adapter lives in the CLI layer
    out = tmp_path / "lsl.json"
    r = CliRunner().invoke(app, ["bench", "lsl", "--seconds", "1", "--headsets", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    import json

    res = json.loads(out.read_text())
    assert [s["channels"] for s in res["single"]] == [64, 256]
    for s in res["single"]:
        assert s["received"][0] == s["pushed"] > 0 and s["gaps"] == [0]
        assert 0 < s["latency_ms_newest_sample"]["p50"] < 100
    assert res["multi"]["headsets"] == 2 and res["multi"]["samples_lost_total"] == 0
    assert "2 headsets x 64 ch x 160 Hz: 0 samples lost" in r.output
