"""The live bridge (LSL -> WebSocket) over real LSL on loopback, a simulated headset replaying a real recording:
the windows it forwards are the recording's cue windows; garbage from a client, an oversized message, a lost
stream, a stream with the wrong rate or channels and a busy port each give one clear line, and the bridge keeps
serving the other clients."""

from __future__ import annotations

import base64
import json
import logging
import socket
import time

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from neurofed.edge.bridge import MAX_MESSAGE, BridgeConfig, LiveBridge, LiveSpec
from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
from neurofed.firmware_sim.recording import Recording, load_recording
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS
from neurofed.trainer.errors import NeuroFedError
from tests.lsl_support import unique_name

CH21 = ["FC5", "FC3", "FC1", "FCz", "FC2", "FC4", "FC6", "C5", "C3", "C1", "Cz", "C2", "C4", "C6",
        "CP5", "CP3", "CP1", "CPz", "CP2", "CP4", "CP6"]


def _spec(**kw) -> LiveSpec:
    """The metadata a standalone EEGNet export for 21 channels at 160 Hz carries (only what the bridge reads)."""
    meta = {"ch_names": CH21, "classes": ["left_fist", "right_fist"], "window": [0.0, 4.0], "model_hash": "ab" * 16,
            "preprocess": {"fmax": 38.0},
            "standalone": {"rate": 160.0, "unit": "uV", "unit_to_uv": 1.0, "window_samples": 640, "step_s": 0.5}}
    meta["standalone"].update(kw)
    return LiveSpec.from_meta(meta)


@pytest.fixture(scope="module")
def rec(data_dir) -> Recording:
    return load_recording(data_dir / "eegmmidb" / "S003" / "S003R04.edf", RUN_EVENT_LABELS[4])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _player(rec: Recording, **kw) -> tuple[HeadsetPlayer, str]:
    name = unique_name("bridge")
    p = HeadsetPlayer(rec, PlayerConfig(name=name, linger=1.0, **{"wait_consumers": 10.0, **kw}))
    p.start()
    return p, name


def _recv(ws, timeout: float = 10.0) -> dict | None:
    try:
        return json.loads(ws.recv(timeout=timeout))
    except TimeoutError:
        return None


def _collect(ws, until, timeout: float = 30.0) -> list[dict]:
    got, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        m = _recv(ws, max(0.05, end - time.monotonic()))
        if m is not None:
            got.append(m)
            if until(got):
                break
    return got


@pytest.mark.unit
def test_client_messages_are_checked_without_sockets():
    b = LiveBridge(_spec(), BridgeConfig(stream="x"))
    assert b._client_message(json.dumps({"type": "prediction", "seq": 3, "latency_ms": 12.5})) is None
    assert b.stats.predictions == 1 and b.stats.latency_ms == [12.5]
    assert "not JSON" in b._client_message("hello?")
    assert "binary" in b._client_message(b"\x00\x01")
    assert "unknown message ('list'" in b._client_message("[1, 2]")
    assert "unknown message ('subscribe'" in b._client_message('{"type": "subscribe"}')
    assert "integer seq" in b._client_message('{"type": "prediction", "seq": "1", "latency_ms": 1}')
    assert "finite latency" in b._client_message('{"type": "prediction", "seq": 1, "latency_ms": NaN}')
    with pytest.raises(NeuroFedError, match="mode 'fast': use cue or sliding"):
        LiveBridge(_spec(), BridgeConfig(stream="x", mode="fast"))
    with pytest.raises(NeuroFedError, match="need a standalone model"):
        LiveSpec.from_meta({"ch_names": CH21, "classes": ["a", "b"]})


def test_windows_are_the_recordings_cue_windows_and_garbage_never_stops_the_bridge(rec, caplog, tmp_path):
    """Two clients: one sends garbage of every kind (and finally an oversized message, which closes it), the
    other receives every cue window, bit-exact to the recording's samples at each cue."""
    caplog.set_level(logging.INFO, logger="neurofed.edge")
    go = tmp_path / "go"  # the headset starts once both clients are connected
    player, name = _player(rec, speed=8.0, markers=True, go_file=str(go))
    bridge = LiveBridge(_spec(), BridgeConfig(stream=name, port=_free_port(), timeout=10)).open()
    with bridge:
        good = connect(bridge.url)
        bad = connect(bridge.url)
        hello = _recv(good)
        assert hello["type"] == "hello" and hello["protocol"] == "neurofed-live/1"
        assert hello["stream"]["ch_names"] == CH21 and hello["stream"]["rate"] == 160.0
        assert hello["mode"] == "cue" and hello["window_samples"] == 640 and hello["cues"] == ["left_fist", "right_fist"]
        assert _recv(bad)["type"] == "hello"
        go.touch()
        replies = []
        for junk in ("not json at all", b"\xff\x00binary", "[1, 2, 3]", '{"type": "hello"}', '{"seq": 1}'):
            bad.send(junk)
            replies.append(_recv(bad))
        assert all(r["type"] == "status" and r["level"] == "warning" for r in replies), replies
        assert "not JSON" in replies[0]["message"] and "binary" in replies[1]["message"]
        bad.send("x" * (MAX_MESSAGE + 10))
        with pytest.raises(ConnectionClosed):  # the bridge closes an oversized sender (1009) ...
            for _ in range(50):
                bad.recv(timeout=5)
        msgs = _collect(good, lambda g: sum(m["type"] == "window" for m in g) >= len(rec.markers), timeout=60)
        good.send(json.dumps({"type": "prediction", "seq": 0, "pred": 1, "probs": [0.4, 0.6], "latency_ms": 9.5}))
        time.sleep(0.3)
        good.close()
    player.join(10)
    wins = [m for m in msgs if m["type"] == "window"]
    cues = [m for m in msgs if m["type"] == "cue"]
    eeg = [m for m in msgs if m["type"] == "eeg"]
    # ... while the other client received every window, in order, each the recording's samples at its cue
    assert len(wins) == len(rec.markers) == 15 and [w["seq"] for w in wins] == list(range(15))
    idx = [rec.ch_names.index(c) for c in CH21]
    for w, (s, label) in zip(wins, rec.markers):
        x = np.frombuffer(base64.b64decode(w["data"]), "<f4").reshape(w["shape"])
        assert w["label"] == label and x.shape == (21, 640)
        assert np.array_equal(x, rec.data[s:s + 640, idx].T)  # float32 round trip: exact
        assert w["arrival_unix"] <= time.time()
    assert len(cues) == 15 and all(c["opens"] for c in cues)
    assert eeg and sum(m["n"] for m in eeg) > 0.5 * rec.data.shape[0]
    st = bridge.stats
    assert st.garbage == 6 and st.predictions == 1 and st.latency_ms == [9.5] and st.windows == 15
    text = caplog.text
    assert "sent text that is not JSON ('not json at all'); ignored" in text
    assert f"sent a message over {MAX_MESSAGE} bytes; its connection was closed" in text
    assert "Traceback" not in text


def test_a_lost_stream_is_reported_and_decoding_resumes(rec, caplog):
    """A headset that disappears for 6 s of stream (outlets destroyed, re-created with the same source_id):
    one warning line, one line when it is back, the windows across the gap skipped with a reason, then
    windows again."""
    caplog.set_level(logging.INFO, logger="neurofed.edge")
    player, name = _player(rec, speed=4.0, markers=False, outages=((10.0, 6.0),))
    bridge = LiveBridge(_spec(), BridgeConfig(stream=name, mode="sliding", step=1.0, port=_free_port(), timeout=10,
                                              stall_s=0.6)).open()
    with bridge:
        ws = connect(bridge.url)
        msgs = _collect(ws, lambda g: any("is back" in m.get("message", "") for m in g)
                        and sum(m["type"] == "window" for m in g) >= 12, timeout=60)
        ws.close()
    player.stop()
    player.join(10)
    status = [m["message"] for m in msgs if m["type"] == "status"]
    assert any(f"no samples from stream '{name}' for 0.6 s (headset disconnected?)" in s for s in status), status
    assert any(s == f"stream '{name}' is back" for s in status), status
    back = next(i for i, m in enumerate(msgs) if "is back" in m.get("message", ""))
    assert any(m["type"] == "window" for m in msgs[back:])
    assert bridge.stats.stalls >= 1
    assert "waiting for it to come back" in caplog.text and "Traceback" not in caplog.text


def test_wrong_rate_channels_and_busy_port_are_one_line(rec):
    fast = Recording(rec.data, 250.0, rec.ch_names, rec.markers[:1], "S003R04 claimed at 250 Hz")
    player, name = _player(fast, speed=1.0, markers=False, wait_consumers=0.0)
    try:
        with pytest.raises(NeuroFedError) as exc:
            LiveBridge(_spec(), BridgeConfig(stream=name, timeout=10)).open()
        assert str(exc.value) == f"stream '{name}': sampling rate is 250 Hz but 160 Hz was expected"
    finally:
        player.stop()
        player.join(10)
    few = Recording(np.ascontiguousarray(rec.data[:, :8]), rec.sfreq, rec.ch_names[:8], rec.markers[:1], "8 ch")
    player, name = _player(few, speed=1.0, markers=False, wait_consumers=0.0)
    try:
        with pytest.raises(NeuroFedError, match=rf"stream '{name}': missing channels \['C3', 'C1', 'Cz'"):
            LiveBridge(_spec(), BridgeConfig(stream=name, timeout=10)).open()
        # a busy WebSocket port: one line, and the streams are closed again
        port = _free_port()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
            spec = LiveSpec.from_meta({"ch_names": rec.ch_names[:8], "classes": ["left_fist", "right_fist"],
                                       "window": [0.0, 4.0], "preprocess": {"fmax": 38.0},
                                       "standalone": {"rate": 160.0, "unit": "uV", "unit_to_uv": 1.0,
                                                      "window_samples": 640, "step_s": 0.5}})
            b = LiveBridge(spec, BridgeConfig(stream=name, port=port, mode="sliding", timeout=10)).open()
            with pytest.raises(NeuroFedError, match=rf"cannot serve the bridge on 127.0.0.1:{port}: .*port busy"):
                b.start()
            assert b.eeg is None
    finally:
        player.stop()
        player.join(10)
