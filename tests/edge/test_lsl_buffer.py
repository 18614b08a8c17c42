"""Ring buffer (plain arrays) and stream resolution (real liblsl on loopback)."""

from __future__ import annotations

import numpy as np
import pytest

from neurofed.edge.buffer import RingBuffer
from neurofed.edge.lsl_io import Inlet, StreamError, check_unique, find_stream
from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
from neurofed.firmware_sim.recording import Recording
from neurofed.trainer.errors import DataError
from tests.lsl_support import unique_name


def _fill(buf: RingBuffer, start: int, n: int, sfreq: float = 100.0) -> None:
    idx = np.arange(start, start + n)
    buf.append(np.repeat(idx[:, None], buf.n_channels, 1).astype(np.float32), 10.0 + idx / sfreq)


@pytest.mark.unit
def test_ring_buffer_wraps_and_addresses_absolute_samples():
    buf = RingBuffer(2, 50)
    for k in range(0, 130, 13):  # chunks cross the wrap point several times
        _fill(buf, k, 13)
    assert buf.total == 130 and buf.first == 80 and len(buf) == 50
    data, ts = buf.get(100, 130)
    assert np.array_equal(data[:, 0], np.arange(100, 130)) and np.allclose(ts, 10 + np.arange(100, 130) / 100)
    assert np.array_equal(buf.timestamps(), 10 + np.arange(80, 130) / 100)
    with pytest.raises(DataError, match="not in the buffer"):
        buf.get(70, 90)
    _fill(buf, 130, 120)  # a chunk longer than the capacity keeps the newest samples
    assert buf.first == 200 and np.array_equal(buf.get(200, 250)[0][:, 1], np.arange(200, 250))


@pytest.mark.unit
def test_ring_buffer_get_returns_copies_of_every_span():
    """``get`` (slice copies, two pieces across the wrap point) == the samples in absolute order, for every span the
    buffer holds; the copies do not alias the buffer."""
    buf = RingBuffer(3, 17, np.float64)
    for k in range(0, 40, 7):
        _fill(buf, k, 7)
    for start in range(buf.first, buf.total + 1):
        for stop in range(start, buf.total + 1):
            data, ts = buf.get(start, stop)
            assert np.array_equal(data[:, 2], np.arange(start, stop)) and data.shape == (stop - start, 3)
            assert np.allclose(ts, 10 + np.arange(start, stop) / 100)
            assert not np.shares_memory(data, buf.data) and not np.shares_memory(ts, buf.ts)
    with pytest.raises(DataError, match="not in the buffer"):
        buf.get(buf.first - 1, buf.total)
    with pytest.raises(DataError, match="not in the buffer"):
        buf.get(buf.first, buf.total + 1)


@pytest.mark.unit
def test_ring_buffer_locate():
    buf = RingBuffer(1, 100)
    assert buf.locate(10.0, tol=0.005) is None  # empty: not arrived yet
    _fill(buf, 0, 60)
    assert buf.locate(10.0 + 30 / 100 + 0.002, tol=0.005) == 30
    assert buf.locate(10.0 + 0.70, tol=0.005) is None  # beyond the newest sample: wait
    buf.append(np.zeros((10, 1), np.float32), 10.0 + np.arange(80, 90) / 100)  # samples 60..79 lost
    with pytest.raises(DataError, match="data lost"):
        buf.locate(10.0 + 0.70, tol=0.005)
    with pytest.raises(DataError, match="older than"):
        buf.locate(5.0, tol=0.005)


def test_find_stream_by_name_type_source_id_and_timeout():
    # 60 s of signal: the stream must outlive every resolve below (a 4 s one ended mid-test on a busy machine)
    rec = Recording(np.zeros((6000, 3), np.float32), 100.0, ["C3", "Cz", "C4"], [], "zeros")
    cfg = PlayerConfig(name=unique_name("res"), speed=1, markers=False)
    p = HeadsetPlayer(rec, cfg)
    p.start()
    inlet = None
    try:
        info = find_stream(source_id=cfg.source_id, timeout=5)
        assert info.name() == cfg.name
        inlet = Inlet(find_stream(name=cfg.name, stype="EEG", timeout=5))
        assert inlet.meta.ch_names == ["C3", "Cz", "C4"] and inlet.meta.units == ["microvolts"] * 3
        assert inlet.meta.uid == info.uid()  # one outlet's identity (capture re-opens inlets only on a new uid)
        with pytest.raises(StreamError, match=r"no LSL stream matching name='nope-.*within 0.5 s; visible: .*"
                                              + cfg.name):
            find_stream(name=unique_name("nope"), timeout=0.5)
        with pytest.raises(StreamError, match="at least one"):
            find_stream()
    finally:
        if inlet is not None:  # inlets before outlets: liblsl can crash when an outlet dies under a live inlet
            inlet.close()  # (a segfault in the outlet's destructor in CI, 2026-11-25; mne-lsl closes them this way)
        p.stop()
        p.join(timeout=5)


def test_irregular_outlet_roundtrip():
    from neurofed.edge.lsl_io import irregular_outlet
    from tests.lsl_support import drain

    name = unique_name("pred")
    outlet = irregular_outlet(name, "Predictions", ["left_fist", "right_fist"], unique_name("src"))
    inlet = Inlet(find_stream(name=name, timeout=5))
    assert inlet.meta.ch_names == ["left_fist", "right_fist"] and inlet.meta.sfreq == 0.0
    outlet.wait_for_consumers(5)
    outlet.push_sample([0.25, 0.75])
    data, _ = drain(inlet, lambda d, t: len(t) >= 1, timeout=5)
    np.testing.assert_allclose(data[0], [0.25, 0.75])
    with pytest.raises(StreamError, match="unsupported outlet format"):
        irregular_outlet(name, "x", ["a"], "s", fmt="int8")


def test_ambiguous_stream_name_is_an_error_naming_the_candidates():
    """Two outlets with one name (as mne-lsl does): refuse, list both, resolve either by its source_id."""
    from neurofed.edge.lsl_io import irregular_outlet

    name = unique_name("twin")
    ids = [unique_name("src-a"), unique_name("src-b")]
    outlets = [irregular_outlet(name, "EEG", ["C3"], s) for s in ids]
    with pytest.raises(StreamError, match=rf"2 LSL streams match name='{name}'.*{ids[0]}.*{ids[1]}"):
        find_stream(name=name, timeout=5)
    assert find_stream(name=name, source_id=ids[1], timeout=5).source_id() == ids[1]
    # consumers open their inlets first (unique=False), then check all their queries at once
    assert find_stream(name=name, timeout=5, unique=False).name() == name
    with pytest.raises(StreamError, match=rf"2 LSL streams match name='{name}'"):
        check_unique([(None, None, ids[0]), (name, None, None)])
    check_unique([(name, None, ids[0]), (name, "EEG", ids[1])])
    del outlets
