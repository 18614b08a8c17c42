"""A shortened end-to-end check of a long-lived federation of simulated headsets (issue 55, item 5), under a minute.

The run is :func:`neurofed.bench_long_lived.run_fleet` (``neurofed bench long-lived`` runs a longer plan).

Over a real Mosquitto, everything from LSL on:

* **Headset hosts.** Each training or validating host is a simulated headset (headset-sim's player replaying one
  EEGMMIDB run per session at 20x, cue markers on LSL) recorded by the edge's capture into the host's own store, in
  sessions with gaps; its edge client (``edge-client join --store --window 30`` semantics: the store is read again
  before each training) joins once the first session is stored. S001 records three sessions; S002 two, then
  leaves for good (its client stops); S006 joins late (its host comes online once the federation made version 2);
  S003 records one session and validates (``--evaluate``).
* **Coordinator.** Asynchronous (K = 2, 8 versions), ``min_clients = 2`` training clients, a release gate every 3
  versions and at the last, releases exported, signed and published retained.
* **Decoders.** Two ``edge-client infer --follow --mode cue --predictions-out`` processes (no starting model) on
  headset-sim streams of held-out S004 and S005 (runs 4, 8, 12 looped at 10x, cue markers).

Asserted: the three releases reach both decoders (verified; each swap between two cue-locked windows, in order),
no cue window is lost or decoded twice (the cue-locked windows are exactly the first cues the held-out headset
sent, each once), a forged release (another key, valid format) published by a client with broker credentials is
refused by both, a signed rollback to release 1 (``neurofed release rollback``, published as release 4) is swapped
in by both, and the report (:func:`neurofed.release_report.release_report`) gives each decoder's live BCA per
release beside the release's federated validation BCA (printed; accuracy levels are not asserted). The stores grew
between trainings (a client trained on more trials later), the late client contributed, and the
client that left sent nothing after it left.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

from neurofed.bench_long_lived import FleetPlan, run_fleet
from neurofed.release_report import summary_lines
from tests.broker.conftest import DATA_DIR, Mosquitto
from tests.lsl_support import configure_lsl

configure_lsl()

pytestmark = pytest.mark.e2e

PLAN = FleetPlan(train={1: (4, 8, 12), 2: (4, 8), 6: (4, 8)}, validate={3: (4,)}, heldout=(4, 5),
                 join_at_version={6: 2}, leave_after_sessions={2: 2}, rounds=8, buffer_k=2, max_staleness=2,
                 every=3, release_min_clients=1, margin=1.0, window=30, speed=20.0, live_speed=10.0, gap_s=2.0,
                 forge=True, rollback_to=1, windows_per_last=2, timeout_s=200.0)


@pytest.mark.timeout(240)
def test_a_fleet_of_headsets_releases_to_following_decoders(tmp_path):
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed")
    t0 = time.monotonic()
    broker = Mosquitto(tmp_path).start()
    try:
        r = run_fleet(PLAN, broker.url, tmp_path, DATA_DIR)
    finally:
        broker.stop()

    # the federation: three releases; stores grew between trainings; the late client and the one that left
    assert [h["release"] for h in r["history"] if h["released"]] == [1, 2, 3], r["history"]
    assert r["rolled_back"] and r["forged"]
    trials = {c: [row[6] for row in r["submissions"] if row[1] == c] for c in ("S001", "S002", "S006")}
    assert max(trials["S001"]) > min(trials["S001"]), trials  # it trained on a grown store
    assert r["joined_at"][6] >= 2 and trials["S006"], (r["joined_at"], trials)  # it joined late and contributed
    assert not any(row[1] == "S003" for row in r["submissions"])  # the validating client never trained
    assert len(trials["S002"]) <= r["trained"][2]  # every S002 update was trained before it left
    for s, sessions in r["sessions"].items():
        # the capture kept every cue whose whole window was pushed (the last session may be cut short)
        assert all(x["stored"] == x["cues"] for x in sessions), (s, sessions)

    # the decoders: every release reached both, in order; no cue window lost or decoded twice; forgery refused
    rep = r["report"]
    for s, d in r["decoders"].items():
        st, rows, sent = d["stats"], d["windows"], d["cues_sent"]
        assert st["accepted"] == [1, 2, 3, 4], st  # 4: the rollback (release 1's model, signed anew)
        chain = [(w["previous"], w["version"]) for w in st["swaps"]]
        assert chain in ([(1, 2), (2, 3), (3, 4)], [(1, 3), (3, 4)]), st["swaps"]  # 2 may be superseded by 3
        assert st["swaps"][-1]["rollback_of"] == 1
        assert len(st["refused"]) == 1 and "bad signature" in st["refused"][0], st["refused"]
        assert st["skipped"] == 0
        assert len(rows) == st["predictions"] + st["rejections"] and len(rows) <= len(sent)
        assert all(abs(w["onset"] - c[0]) < 2e-3 and w["cue"] == c[1] for w, c in zip(rows, sent)), "cue lost/twice"
        versions = [w["model_version"] for w in rows]
        assert versions == sorted(versions)
        assert {str(v): versions.count(v) for v in set(versions)} == st["windows_by_version"]
        for v, n in st["windows_by_version"].items():  # the report has every release's live windows
            live = next(x for x in rep["releases"] if x["release"] == int(v))["live"][f"S{s:03d}"]
            assert live["windows"] == n and live["n"] == n - live["rejected"]
    by = {x["release"]: x for x in rep["releases"]}
    assert all(by[v]["validation"]["of_release"] == v for v in (1, 2, 3)) and by[4]["validation"]["of_release"] == 1
    print("\n".join(summary_lines(rep)))
    print(f"long-lived e2e: {time.monotonic() - t0:.1f} s; sessions "
          f"{ {s: [(x['run'], x['stored']) for x in v] for s, v in r['sessions'].items()} }; trials per update "
          f"{trials}; S006 joined at version {r['joined_at'][6]}")
    (tmp_path / "result.json").write_text(json.dumps(rep, indent=1))
