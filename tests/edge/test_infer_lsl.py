"""``edge-client infer`` over real LSL on loopback: a simulated headset replays a real recording."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from neurofed.edge.infer import InferenceEngine, Prediction
from neurofed.edge.infer_cli import lsl_sink, prediction_outlet, run_loop
from neurofed.edge.lsl_io import Inlet, find_stream, local_clock
from neurofed.edge.windowing import CueWindower
from neurofed.export.runtime import OnnxModel
from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
from neurofed.firmware_sim.recording import Recording, load_recording
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS
from neurofed.trainer.errors import NeuroFedError
from tests.export.conftest import exported_eegnet
from tests.lsl_support import drain, unique_name

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def eegnet_bs(tmp_path_factory, data_dir):
    """A real batch-specific EEGNet checkpoint and its verified ONNX export (shared per session)."""
    return exported_eegnet(tmp_path_factory, data_dir)


@pytest.fixture(scope="module")
def rec(data_dir) -> Recording:
    return load_recording(data_dir / "eegmmidb" / "S003" / "S003R04.edf", RUN_EVENT_LABELS[4])


def _player(rec: Recording, speed: float = 20.0, markers: bool = True) -> tuple[HeadsetPlayer, str]:
    name = unique_name("infer")
    p = HeadsetPlayer(
        rec, PlayerConfig(name=name, speed=speed, wait_consumers=5.0, linger=1.0, markers=markers)
    )
    p.start()
    return p, name


def test_live_cue_locked_predictions_on_lsl_replayed_20x_faster(rec, eegnet_bs):
    """Replayed at 20x, the stream's timestamps run ahead of the LSL clock: latency and prediction stamps
    are still real time (emission - arrival), the window end travels in its own channel."""
    om = OnnxModel(eegnet_bs[1])
    player, name = _player(rec, speed=20.0)
    eeg = Inlet(find_stream(name=name, timeout=5))
    mk = Inlet(find_stream(name=f"{name}-markers", timeout=5))
    engine = InferenceEngine(om, eeg.meta.ch_names, eeg.meta.sfreq, stream_units=eeg.meta.units)
    outlet = prediction_outlet(f"{name}-pred", f"{name}-pred", om.meta.classes, om.meta.model_hash)
    pin = Inlet(find_stream(name=f"{name}-pred", timeout=5))
    got: list = []
    stats = run_loop(
        engine,
        eeg,
        mk,
        CueWindower(engine.window_samples, eeg.meta.sfreq, 0.0),
        [lsl_sink(outlet), got.append],
        om.meta.classes,
        max_seconds=40,
        max_windows=15,
    )
    t_done = local_clock()
    player.join(10)
    assert stats["predictions"] == 15 and stats["rejections"] == 0
    # the same windows decoded offline from the recording's cue samples give the same decisions
    offline = InferenceEngine(om, rec.ch_names, rec.sfreq)
    ref = [offline.process(rec.data[s : s + offline.window_samples].T, 0.0) for s, _ in rec.markers]
    assert all(isinstance(r, Prediction) for r in got)
    assert [r.label for r in got] == [r.label for r in ref]
    assert np.allclose([r.probabilities for r in got], [r.probabilities for r in ref], atol=1e-5)
    assert np.allclose(
        [r.t_end for r in got], [player.t0 + (s + 639) / rec.sfreq for s, _ in rec.markers], atol=1e-6
    )
    # real-time bookkeeping: arrival <= emission <= now, and latency = emission - arrival (positive) ...
    t_arr, t_emit = np.array([r.t_arrival for r in got]), np.array([r.t_emit for r in got])
    assert np.all(t_arr <= t_emit) and np.all(t_emit <= t_done)
    assert stats["latency_ms_p50"] == pytest.approx(np.median(t_emit - t_arr) * 1e3)
    assert stats["latency_ms_p50"] > 0
    # ... while the replayed stream's own stamps ran ahead of real time (the last cue ~112 s into the run,
    # replayed in ~6 s)
    assert stats["stream_time_minus_arrival_s_p50"] > 10.0 and got[-1].t_end - t_arr[-1] > 50.0
    # what a consumer receives on the prediction stream: stamped at emission (LSL clock), window end in a channel
    data, ts = drain(pin, lambda d, t: len(t) >= 15, timeout=5)
    assert len(ts) == 15
    assert pin.meta.ch_names == ["class_index", "p_left_fist", "p_right_fist", "t_window_end"]
    assert np.array_equal(data[:, 0], [r.index for r in got])
    assert np.allclose(ts, t_emit, atol=1e-3)  # (the inlet's clock sync shifts stamps by ~1e-5 s on loopback)
    assert np.array_equal(data[:, -1], [r.t_end for r in got])  # double precision: exact
    assert np.allclose(data[:, 1:3], [r.probabilities for r in got], atol=1e-12)
    for i in (eeg, mk, pin):
        i.close()


def test_record_accepts_implies_infer_accepts_on_lsl(rec, eegnet_bs):
    """A headset with EEGMMIDB's dotted labels ("Fc5.") streaming volts with mne-lsl's unit code "0":
    ``edge-client record``'s check accepts it, so does the decoder, and it decodes the same as microvolts."""
    from neurofed.edge.capture import CaptureConfig, check_stream

    om = OnnxModel(eegnet_bs[1])
    dotted = [f"{c[0]}{c[1:].lower()}".ljust(4, ".") for c in rec.ch_names]
    volts = Recording(np.ascontiguousarray(rec.data * 1e-6), rec.sfreq, dotted, rec.markers[:3], "dotted, volts")
    name = unique_name("dotted")
    player = HeadsetPlayer(volts, PlayerConfig(name=name, speed=20.0, unit="0", wait_consumers=5.0, linger=1.0))
    player.start()
    eeg = Inlet(find_stream(name=name, timeout=5))
    mk = Inlet(find_stream(name=f"{name}-markers", timeout=5))
    assert eeg.meta.units[0] == "0" and eeg.meta.ch_names[:2] == dotted[:2] and dotted[0].endswith(".")
    check_stream(eeg.meta.sfreq, eeg.meta.ch_names, eeg.meta.units, CaptureConfig(), name)  # record accepts
    engine = InferenceEngine(om, eeg.meta.ch_names, eeg.meta.sfreq, stream_units=eeg.meta.units)
    got: list = []
    run_loop(engine, eeg, mk, CueWindower(engine.window_samples, eeg.meta.sfreq), [got.append],
             om.meta.classes, max_seconds=30, max_windows=3)
    player.join(10)
    offline = InferenceEngine(om, rec.ch_names, rec.sfreq)
    ref = [offline.process(rec.data[s : s + offline.window_samples].T, 0.0) for s, _ in rec.markers[:3]]
    assert [r.label for r in got] == [r.label for r in ref]
    assert np.allclose([r.probabilities for r in got], [r.probabilities for r in ref], atol=1e-4)
    for i in (eeg, mk):
        i.close()


def test_cli_sliding_mode_publishes_lsl_and_mqtt(rec, eegnet_bs):
    """Real mosquitto on 127.0.0.1:1883 (the shared broker) receives the same predictions as JSON."""
    from neurofed.broker.embedded import port_open
    from neurofed.broker.transport import MqttTransport
    from neurofed.edge.cli import app

    if not port_open("127.0.0.1", 1883):
        pytest.skip("no mosquitto on 127.0.0.1:1883")
    topic = f"neurofed/test/{unique_name('pred')}"
    sub = MqttTransport("mqtt://127.0.0.1:1883", unique_name("sub")).connect(timeout=5)
    sub.subscribe(topic)
    player, name = _player(rec, speed=4.0, markers=False)
    out: dict = {}
    t = threading.Thread(
        target=lambda: out.setdefault(
            "res",
            CliRunner().invoke(
                app,
                [
                    "infer",
                    "--model",
                    str(eegnet_bs[1]),
                    "--stream",
                    name,
                    "--mode",
                    "sliding",
                    "--step",
                    "0.5",
                    "--duration",
                    "8",
                    "--quiet",
                    "--out-name",
                    f"{name}-pred",
                    "--mqtt",
                    "mqtt://127.0.0.1:1883",
                    "--mqtt-topic",
                    topic,
                ],
            ),
        )
    )
    t.start()
    pin = Inlet(find_stream(name=f"{name}-pred", timeout=10))
    data, ts = drain(pin, lambda d, t: len(t) >= 5, timeout=15)
    t.join(30)
    player.stop()
    player.join(10)
    msgs = []
    while (m := sub.get(0.5)) is not None:
        if m.topic == topic:
            msgs.append(json.loads(m.payload))
    sub.close()
    assert len(msgs) >= len(ts) >= 5
    # (the inlet's clock sync shifts LSL stamps by ~1e-5 s on loopback)
    first = next(m for m in msgs if m["t_end"] == data[0, -1])
    assert first["label"] in ("left_fist", "right_fist") and first["index"] == int(data[0, 0])
    assert np.allclose(first["probabilities"], data[0, 1:-1], atol=1e-12)
    assert first["t_emit"] == pytest.approx(ts[0], abs=1e-3) and first["latency_ms"] > 0
    res = out["res"]
    assert res.exit_code == 0, res.output
    assert len(ts) >= 5, res.output
    assert np.allclose(np.diff(data[:5, -1]), 0.5, atol=1e-4)  # a window every 0.5 s of stream time (clock sync ~1e-5)
    assert "done:" in res.output and "'predictions':" in res.output
    pin.close()


def test_cli_clear_errors_for_missing_stream_and_channels(rec, eegnet_bs):
    from neurofed.edge.cli import app

    r = CliRunner().invoke(
        app, ["infer", "--model", str(eegnet_bs[1]), "--stream", unique_name("nobody"), "--timeout", "0.5"]
    )
    assert isinstance(r.exception, NeuroFedError) and "no LSL stream matching" in str(r.exception)
    few = Recording(
        np.ascontiguousarray(rec.data[:, :10]), rec.sfreq, rec.ch_names[:10], rec.markers, "first 10 ch"
    )
    player, name = _player(few)
    r = CliRunner().invoke(app, ["infer", "--model", str(eegnet_bs[1]), "--stream", name, "--timeout", "5"])
    player.stop()
    player.join(10)
    assert isinstance(r.exception, NeuroFedError) and "missing channels" in str(r.exception)
    # two headsets under one name: refused, naming both (as mne-lsl does), never "the first"
    name = unique_name("twin")
    twins = [HeadsetPlayer(rec, PlayerConfig(name=name, speed=1.0, wait_consumers=0.0)) for _ in range(2)]
    for p in twins:
        p.start()
    r = CliRunner().invoke(app, ["infer", "--model", str(eegnet_bs[1]), "--stream", name, "--timeout", "5"])
    for p in twins:
        p.stop()
        p.join(10)
    assert isinstance(r.exception, NeuroFedError), r.output
    assert f"2 LSL streams match name='{name}'" in str(r.exception)
    assert all(p.cfg.source_id in str(r.exception) for p in twins)
