"""``neurofed bench swap``: signed releases published while a real `edge-client infer --follow` process decodes a
headset-sim stream (LSL, private session) through a real Mosquitto: every release reaches the decoder in order, the
latency is measured for each swap, and no window is lost at a swap."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.broker.conftest import Mosquitto
from tests.lsl_support import configure_lsl

configure_lsl()


@pytest.mark.timeout(120)
def test_bench_swap_measures_every_swap_and_loses_no_window(tmp_path: Path, data_dir: Path) -> None:
    from neurofed.bench_swap import bench_swap

    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed")
    broker = Mosquitto(tmp_path).start()
    try:
        res = bench_swap(tmp_path / "swap.json", tmp_path / "swap.md", data_dir, subject=2, releases=3,
                         interval=1.5, step=0.1, broker=broker.url)
    finally:
        broker.stop()
    assert json.loads((tmp_path / "swap.json").read_text()) == res
    assert res["releases_seen"] == [1, 2, 3] and res["swaps"] == 2 and res["refused"] == []
    assert [s["version"] for s in res["decoder_swaps"]] == [2, 3]
    assert all(0 < x < 2000 for x in res["latency_ms"].values()) and res["latency_ms_p50"] > 0
    w = res["windows"]
    assert res["windows_lost"] == 0 and w["skipped"] == 0 and w["end_gaps"] == 0 and w["versions_in_order"]
    assert w["decoded_or_rejected"] == sum(w["by_version"].values()) >= 3 * 5
    assert "0 windows lost" in (tmp_path / "swap.md").read_text()
