"""The runtime on live LSL, and NeuroFed's streams read by an LSL consumer nobody here wrote (mne-lsl).

* a simulated headset (firmware_sim) streams a real recording (S003, 64 channels at 160 Hz, microvolts, with a
  sample counter); the runtime picks the model's 21 channels from the stream's description and decodes sliding
  windows: each equals the standalone graph run directly on the same samples of the recording;
* ``python -m neurofed_runtime.lsl`` and ``edge-client infer`` refuse a missing or inconsistent model in one line,
  exit 2, before looking for a stream;
* mne-lsl (its ``StreamInlet`` and ``StreamLSL``) reads the prediction stream's labels, units and types, the
  predicted-class marker stream, and the headset's cue marker stream with its classes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from neurofed_runtime import Decoder, StandaloneModel, WindowRejected
from neurofed_runtime.lsl import open_inlet

from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
from neurofed.firmware_sim.recording import Recording, load_recording
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS
from neurofed.trainer.data.units import norm_label
from tests.lsl_support import unique_name
from tests.runtime.conftest import eight_channel_card


@pytest.fixture(scope="module")
def rec(data_dir) -> Recording:
    return load_recording(data_dir / "eegmmidb" / "S003" / "S003R04.edf", RUN_EVENT_LABELS[4])


def test_live_sliding_decoding_equals_the_graph_on_the_recording(rec, standalone_model):
    m = StandaloneModel(standalone_model)
    name = unique_name("rt-live")
    player = HeadsetPlayer(rec, PlayerConfig(name=name, speed=10.0, counter=True, markers=False,
                                             wait_consumers=10.0, linger=1.0))
    player.start()
    inlet, info = open_inlet(name, timeout=10.0)
    try:
        dec = Decoder.from_lsl(m, info)
        counters, results = [], []
        while len(results) < 12:
            chunk, ts = inlet.pull_chunk(timeout=0.2)
            if not ts:
                assert not player.done.is_set(), "the stream ended before 12 windows"
                continue
            chunk = np.asarray(chunk)
            counters.append(chunk[:, 0])
            results += list(dec.stream(chunk))
    finally:
        inlet.close_stream()
        player.stop()
    seen = np.concatenate(counters).astype(int)
    assert np.array_equal(seen, np.arange(seen[0], seen[0] + len(seen)))  # no sample lost
    cols = [[norm_label(c) for c in rec.ch_names].index(norm_label(c)) for c in m.card.ch_names]
    state = m.initial_state()
    for k, res in enumerate(results[:12]):
        start = seen[0] + k * dec.step
        window = rec.data[start : start + dec.window_samples, cols].T
        probs, state = m.run(window, state)
        assert not isinstance(res, WindowRejected)
        assert np.abs(res.probs - probs).max() <= 1e-5


def _cli(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)


def test_bad_models_are_one_line_before_any_stream(tmp_path, standalone_model):
    """``--model missing.onnx`` (or a card that does not describe its graph): one line, exit 2, without waiting
    for the (absent) stream: the stream timeout is 60 s and its error would name the stream."""
    bad = eight_channel_card(standalone_model, tmp_path / "bad.onnx")
    for model, what in ((tmp_path / "missing.onnx", "ONNX model file not found"),
                        (bad, "metadata declares 8 channels")):
        runs = {
            "edge-client infer": ["-c", "from neurofed.edge.cli import main; main()", "infer", "--model",
                                  str(model), "--stream", unique_name("absent"), "--timeout", "60"],
            "neurofed_runtime.lsl": ["-m", "neurofed_runtime.lsl", str(model), unique_name("absent"),
                                     "--timeout", "60"],
        }
        for cmd, args in runs.items():
            r = _cli(args)
            assert r.returncode == 2, f"{cmd}: {r.stdout}{r.stderr}"
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            assert len(lines) == 1 and what in lines[0] and str(model.name) in lines[0], f"{cmd}: {r.stderr}"


def test_the_runtime_cli_decodes_a_live_stream(rec, standalone_model):
    name = unique_name("rt-cli")
    player = HeadsetPlayer(rec, PlayerConfig(name=name, speed=10.0, markers=False, wait_consumers=30.0,
                                             linger=2.0))
    player.start()
    try:
        r = _cli(["-m", "neurofed_runtime.lsl", str(standalone_model), name, "--windows", "5", "--timeout", "20"])
    finally:
        player.stop()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 5
    for ln in lines:
        label, *probs = ln.split()
        assert label in ("left_fist", "right_fist") and abs(sum(map(float, probs)) - 1) < 2e-3


#: mne-lsl's own program reading streams' descriptions. It runs in its own process with pylsl's liblsl
#: (MNE_LSL_LIB): mne-lsl's bundled liblsl found only one of several pylsl outlets on this machine under the
#: tests' private session (PortRange 128: tests/lsl_support.py), measured with three outlets in three processes.
MNE_LSL_READER = textwrap.dedent("""
    import json, sys
    from mne_lsl.lsl import StreamInlet, resolve_streams
    from mne_lsl.stream import StreamLSL
    out = {}
    for name in sys.argv[1:]:
        found = resolve_streams(timeout=10, name=name)
        inlet = StreamInlet(found[0])
        inlet.open_stream(timeout=10)
        si = inlet.get_sinfo(timeout=10)
        cls, node = [], si.desc.child("classes").child("class")
        while not node.empty():
            cls.append(node.first_child().value())
            node = node.next_sibling("class")
        out[name] = {"type": si.stype, "sfreq": si.sfreq, "dtype": str(si.dtype), "names": si.get_channel_names(),
                     "types": si.get_channel_types(), "units": si.get_channel_units(), "classes": cls}
        inlet.close_stream()
        if si.dtype != "string" and "string" not in str(si.dtype):
            st = StreamLSL(bufsize=5, name=name).connect(timeout=10)
            out[name]["streamlsl"] = {"ch_names": st.info["ch_names"], "ch_types": st.get_channel_types()}
            st.disconnect()
    print(json.dumps(out))
""")


def test_mne_lsl_reads_the_prediction_label_and_cue_streams(rec):
    pytest.importorskip("mne_lsl")
    import pylsl

    from neurofed.edge.infer_cli import label_outlet, prediction_outlet

    classes = ["left_fist", "right_fist"]
    name = unique_name("rt-pred")
    pred = prediction_outlet(name, name, classes, "0" * 64)
    labels = label_outlet(f"{name}-markers", f"{name}-m", classes, "0" * 64)
    headset = unique_name("rt-cue")
    player = HeadsetPlayer(rec, PlayerConfig(name=headset, speed=1.0, markers=True, wait_consumers=0.0,
                                             max_samples=160 * 30, linger=5.0))
    player.start()
    env = {**os.environ, "MNE_LSL_LIB": pylsl.lib.lib._name}
    try:
        r = subprocess.run([sys.executable, "-c", MNE_LSL_READER, name, f"{name}-markers", f"{headset}-markers"],
                           capture_output=True, text=True, timeout=90, env=env)
    finally:
        player.stop()
        del pred, labels
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    p = got[name]
    assert p["type"] == "Predictions" and p["sfreq"] == 0
    assert p["names"] == ["class_index", "p_left_fist", "p_right_fist", "t_window_end"]
    assert p["types"] == ["ClassIndex", "Probability", "Probability", "Timestamp"]
    assert p["units"] == ["none", "none", "none", "seconds"]
    assert p["classes"] == classes
    assert p["streamlsl"]["ch_names"] == p["names"]  # mne-lsl's StreamLSL builds its mne.Info from it
    mk = got[f"{name}-markers"]
    assert mk["type"] == "Markers" and mk["names"] == ["predicted_class"] and mk["classes"] == classes
    cue = got[f"{headset}-markers"]
    assert cue["type"] == "Markers" and cue["names"] == ["cue"] and cue["types"] == ["Markers"]
    assert cue["classes"] == sorted({label for _, label in rec.markers}) and cue["classes"]


def test_a_stream_that_stops_mid_session_is_one_line(rec, standalone_model):
    """The headset stops after 6 s (max_samples): the runtime CLI has decoded what came, then says so in one line.

    The headset stops sending but keeps its outlet (linger) until the CLI has exited: liblsl 1.18.0b6 (pylsl 1.18.6)
    can crash the process that destroys an outlet while an inlet is still connected (sccn/liblsl#218), and here that
    process is the test worker. The CLI sees the same silence either way.
    """
    name = unique_name("rt-lost")
    player = HeadsetPlayer(rec, PlayerConfig(name=name, speed=10.0, markers=False, wait_consumers=30.0,
                                             max_samples=160 * 6, linger=120.0))
    player.start()
    try:
        r = _cli(["-m", "neurofed_runtime.lsl", str(standalone_model), name, "--windows", "100", "--timeout", "3"])
    finally:
        player.stop()
        player.join(10.0)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"stream '{name}': no samples for 3 s after" in lines[0], r.stderr
    assert 1 <= len(r.stdout.splitlines()) <= 5  # 6 s of EEG: windows at 4, 4.5, ... 6 s
