"""``neurofed bench fleet`` end to end on a small fleet: its own sized Mosquitto, swarm processes, the JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(shutil.which("mosquitto") is None, reason="mosquitto not installed")


@pytest.mark.slow
def test_bench_fleet_accounts_for_every_join_and_update(tmp_path):
    out = tmp_path / "fleet.json"
    r = subprocess.run([sys.executable, "-c", "from neurofed.cli import main; main()", "bench", "fleet", "--clients",
                        "30", "--rounds", "1", "--swarm-procs", "1", "--out", str(out)],
                       capture_output=True, text=True, check=False, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    (size,) = res["sizes"]
    s = size["summary"]
    assert s["joined"] == 30 and s["updates_per_round"] == [30] and s["all_accounted"]
    assert s["coordinator_peak_rss_mb"] > 0 and s["broker_bytes_per_round"][0] > 30 * 1000
    assert size["broker_limits"]["max_queued_messages"] == 1000  # 8 x 31 < Mosquitto's default, the floor
    assert res["codec_per_update"]["compressed"]["bytes"] < res["codec_per_update"]["uncompressed"]["bytes"]
    assert res["command"].startswith("neurofed bench fleet --clients 30 --rounds 1")
