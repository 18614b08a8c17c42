"""``edge-client infer --follow`` through a real Mosquitto with a simulated headset on LSL: release 1 (retained) starts
the decoder, release 2 arrives mid-stream and is swapped in between two windows, a forged release (valid format,
wrong key) published by another client is refused; no window is lost or decoded twice at the swap."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
import torch
from neurofed_runtime import release as rel
from typer.testing import CliRunner

from neurofed.broker.protocol import Topics
from neurofed.broker.releases import ReleaseStore, publish, rollback
from neurofed.broker.transport import MqttTransport
from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
from neurofed.firmware_sim.recording import load_recording
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS
from neurofed.trainer.errors import NeuroFedError
from tests.broker.conftest import Mosquitto
from tests.lsl_support import configure_lsl, unique_name

configure_lsl()
torch.set_num_threads(1)


@pytest.fixture
def broker(tmp_path):
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed")
    m = Mosquitto(tmp_path).start()
    yield m
    m.stop()


def test_follow_swaps_release_2_mid_stream_and_refuses_a_forgery(release_models, release_keys, broker, data_dir, tmp_path):
    from neurofed.cli import app as nf_app
    from neurofed.edge.cli import app

    a, b = release_models
    (priv, pub), (forger_priv, _) = release_keys
    fed, store = unique_name("rel"), tmp_path / "store"
    assert publish(a, priv, broker.url, fed, store)["version"] == 1  # retained before any decoder runs
    rec = load_recording(data_dir / "eegmmidb" / "S003" / "S003R04.edf", RUN_EVENT_LABELS[4])
    n_cues = len(rec.markers)
    name = unique_name("follow")
    player = HeadsetPlayer(rec, PlayerConfig(name=name, speed=8.0, wait_consumers=10.0, linger=2.0, markers=True))
    topic = f"neurofed/test/{name}"
    sub = MqttTransport(broker.url, unique_name("sub")).connect(timeout=5)
    sub.subscribe(topic)
    stats = tmp_path / "stats.json"
    duration = rec.data.shape[0] / rec.sfreq / 8.0 + 8.0
    out: dict = {}
    args = ["infer", "--stream", name, "--follow", "--pub", str(pub), "--broker", broker.url, "--federation", fed,
            "--release-dir", str(tmp_path / "in"), "--quiet", "--out-name", f"{name}-pred", "--mqtt", broker.url,
            "--mqtt-topic", topic, "--duration", f"{duration:.1f}", "--stats-out", str(stats), "--timeout", "15"]
    t = threading.Thread(target=lambda: out.setdefault("res", CliRunner().invoke(app, args)))
    t.start()
    player.start()
    msgs: list[dict] = []
    published = False
    end = time.monotonic() + duration + 30
    while time.monotonic() < end and t.is_alive():
        m = sub.get(0.2)
        if m is not None and m.topic == topic:
            msgs.append(json.loads(m.payload))
        if not published and len(msgs) >= 4:
            # another client with broker access publishes a forged release (higher version, wrong key) ...
            data = b.read_bytes()
            forged = rel.pack(data, rel.sign(data, rel.load_private(forger_priv), 7, 1))
            with MqttTransport(broker.url, unique_name("forger")).connect(timeout=5) as f:
                f.publish(Topics(fed).release, forged, retain=True)
            time.sleep(0.3)
            # ... then the publisher releases model B as version 2 (the CLI)
            r = CliRunner().invoke(nf_app, ["release", "publish", str(b), "--key", str(priv), "--broker", broker.url,
                                            "--federation", fed, "--store", str(store)])
            assert r.exit_code == 0 and "published release 2 (parent 1" in r.output, (r.output, r.exception)
            published = True
    t.join(30)
    player.stop()
    player.join(10)
    while (m := sub.get(0.5)) is not None:
        if m.topic == topic:
            msgs.append(json.loads(m.payload))
    sub.close()
    res = out["res"]
    assert res.exit_code == 0, (res.output, res.exception)
    s = json.loads(stats.read_text())
    # every cue gave exactly one window, none lost or decoded twice at the swap
    assert s["predictions"] + s["rejections"] == n_cues == sum(s["windows_by_version"].values()), s
    assert s["skipped"] == 0
    assert len({m["t_end"] for m in msgs}) == len(msgs) == s["predictions"]
    versions = [m["model_version"] for m in msgs]
    k = versions.index(2)
    assert k >= 4 and versions == [1] * k + [2] * (len(versions) - k), versions
    assert s["windows_by_version"]["1"] >= 4 and s["windows_by_version"]["2"] >= 1
    assert [w["version"] for w in s["swaps"]] == [2] and s["swaps"][0]["ea_windows_carried"] >= 4
    print("swap:", s["swaps"][0], "windows by version:", s["windows_by_version"])  # the report's swap timing
    assert len(s["refused"]) == 1 and "bad signature" in s["refused"][0], s["refused"]
    # the publisher kept both releases; a rollback republishes release 1's bytes as version 3
    r = CliRunner().invoke(nf_app, ["release", "rollback", "--version", "1", "--key", str(priv), "--broker", broker.url,
                                    "--federation", fed, "--store", str(store)])
    assert r.exit_code == 0 and "published as release 3 (parent 2)" in r.output, (r.output, r.exception)
    h = ReleaseStore(store).history()[-1]
    assert (h["version"], h["parent"], h["rollback_of"]) == (3, 2, 1)
    r = CliRunner().invoke(nf_app, ["release", "list", "--store", str(store)])
    assert r.exit_code == 0 and len(r.output.strip().splitlines()) == 3 and "(rollback of 1)" in r.output
    with pytest.raises(NeuroFedError, match="release 9 is not kept"):
        rollback(9, priv, broker.url, fed, store)
    assert ReleaseStore(store).path(3).read_bytes() == a.read_bytes()
    with MqttTransport(broker.url, unique_name("late")).connect(timeout=5) as late:  # a late decoder gets it retained
        late.subscribe(Topics(fed).release)
        got = late.get(5)
        while got is not None and got.event != "message":
            got = late.get(5)
    data, doc = rel.unpack(got.payload)
    r = rel.verify(data, doc, rel.load_public(pub))
    assert r.version == 3 and r.rollback_of == 1 and data == a.read_bytes()
